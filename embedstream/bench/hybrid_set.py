"""Labelled retrieval sets built offline (`bench quality --hybrid`, `bench fusion`, tests), over corpora of
different kinds (:data:`CORPORA`):

* ``prose`` (:func:`build`): stdlib docstring paragraphs cut into chunks; a **known-item** query is a
  sentence taken out of a chunk, which is indexed without it (the answer is the rest of the chunk);
* ``api`` (:func:`build_api`): stdlib API reference entries, ``qualified.name(signature): body``:
  short records full of identifiers; a **known-item** query is the entry's one-line summary, which
  the indexed record leaves out (what someone who knows what a function does but not its name types);
* ``numpy``: :func:`build` over the docstring prose of the pinned numpy (another field, other authors):
  the corpus `bench fusion` reports on and never chose anything on.

In every corpus, an **exact-term** query is one term that occurs in one indexed text only, the query alone:
half identifiers (a dotted name, a snake_case or camelCase word: ``os.path.join``, ``read_bytes``,
``getLogger``), half plain words of 6 letters or more. Dense bi-encoders are known to miss these.

A **long** query (``long``, 0 unless asked: the sets of `bench quality --hybrid` stay as they were) is a
passage of :data:`LONG_WORDS` words or more, a run of whole sentences taken out of the text it answers
(prose and numpy: a chunk; api: a record's docstring body), which keeps the rest (at least one sentence of 8 words
or more, and its name and signature for an api record): a query with 12-30 BM25 terms, where
a sum of term weights grows with the query's length and a cosine does not (`bench fusion`).

Each query has exactly one right text. Deterministic for a given seed: the same texts and queries on
every run. :meth:`HybridSet.half` splits every kind in two (tune on one, check on the other).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

from embedstream.corpus import SENTENCE, package_paragraphs, sentence_chunks, stdlib_api_entries, stdlib_paragraphs

# dotted names (two parts or more), snake_case, camelCase; letters first, so plain numbers never count
IDENTIFIER = re.compile(
    r"(?<![\w.])(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+|[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9]"
    r"|[a-z]+[A-Z][A-Za-z0-9]*)(?![\w])")
WORD = re.compile(r"(?<![\w.])[A-Za-z]{6,}(?![\w])")  # a plain word: letters only, 6 or more
_MIN_QUERY_WORDS = 6
_SUMMARY_WORDS = (5, 25)  # a summary query: one line, not a paragraph
LONG_WORDS = 25  # a long query: a passage of this many words or more
_LONG_REST_WORDS = 8  # what stays of a text a long query leaves
_LONG_SEED = 1_000_003  # the long queries' own random stream: asking for them changes no other query


@dataclass(frozen=True)
class LabelledQuery:
    text: str
    answer: int  # index of the right chunk
    kind: str  # "known_item" | "exact_term" | "long"


@dataclass
class HybridSet:
    chunks: list[str]
    queries: list[LabelledQuery]

    def of_kind(self, kind: str) -> list[LabelledQuery]:
        return [q for q in self.queries if q.kind == kind]

    def half(self, which: int) -> "HybridSet":
        """The same texts with every other query of each kind (``which`` 0 or 1): two disjoint splits."""
        picked = [q for kind in dict.fromkeys(q.kind for q in self.queries)
                  for n, q in enumerate(self.of_kind(kind)) if n % 2 == which]
        return HybridSet(self.chunks, picked)


def exact_terms(chunks: list[str], pattern: re.Pattern = IDENTIFIER) -> dict[str, int]:
    """Terms (``pattern``: identifiers, or :data:`WORD`) that occur (as whole tokens) in exactly one chunk:
    term -> that chunk's index. A term counts as occurring wherever its text appears, in any case, so one
    contained in another chunk's longer name (``path.join`` in ``os.path.join``) is not unique."""
    owners: dict[str, set[int]] = {}
    for i, chunk in enumerate(chunks):
        for match in pattern.finditer(chunk):
            owners.setdefault(match.group(0).rstrip("."), set()).add(i)
    unique = {term: next(iter(found)) for term, found in owners.items() if len(found) == 1 and len(term) >= 5}
    lowered = [chunk.lower() for chunk in chunks]
    everything = "\x00".join(lowered)  # no term holds a NUL, so no match spans two chunks
    return {term: i for term, i in unique.items()
            if everything.count(term.lower()) == lowered[i].count(term.lower())}


def _exact_queries(texts: list[str], count: int, rng: random.Random) -> list[LabelledQuery]:
    """``count`` exact-term queries: half identifiers, half plain words (the other kind fills in when one runs short)."""
    pools = [sorted(exact_terms(texts, pattern).items()) for pattern in (IDENTIFIER, WORD)]
    take = [min(len(pools[0]), count // 2), 0]
    take[1] = min(len(pools[1]), count - take[0])
    take[0] = min(len(pools[0]), count - take[1])
    return [LabelledQuery(term, i, "exact_term") for pool, n in zip(pools, take) for term, i in rng.sample(pool, n)]


def _hold_out_passage(sentences: list[str], keep: int, rng: random.Random) -> tuple[str, str] | None:
    """A run of whole sentences of :data:`LONG_WORDS` words or more (the shortest such run from a random start)
    taken out, at least ``keep`` sentences and 8 words left: (passage, the rest), or None where the text is too
    short."""
    starts = list(range(len(sentences)))
    rng.shuffle(starts)
    for start in starts:
        words = 0
        for end in range(start, len(sentences)):
            words += len(sentences[end].split())
            if words >= LONG_WORDS:
                break
        rest = sentences[:start] + sentences[end + 1:]
        if words >= LONG_WORDS and len(rest) >= keep and len(" ".join(rest).split()) >= _LONG_REST_WORDS:
            return " ".join(sentences[start:end + 1]), " ".join(rest)
    return None


def _long_queries(texts: list[str], count: int, taken: set[int], seed: int,
                  split) -> list[LabelledQuery]:
    """Up to ``count`` long queries, each a passage ``split(text, rng)`` takes out of a text no other query
    uses (``texts`` is updated in place with the rest)."""
    rng = random.Random(seed + _LONG_SEED)
    order = [i for i in range(len(texts)) if i not in taken]
    rng.shuffle(order)
    queries: list[LabelledQuery] = []
    for i in order:
        if len(queries) == count:
            break
        held = split(texts[i], rng)
        if held is not None and held[1] not in texts:
            queries.append(LabelledQuery(held[0], i, "long"))
            texts[i] = held[1]
    return queries


def build(chunks: int = 3000, known_items: int = 200, exact: int = 200, seed: int = 11,
          chunk_words: int = 60, long: int = 0, paragraphs: tuple[str, ...] | None = None) -> HybridSet:
    """``chunks`` indexed chunks with ``known_items`` known-item, ``exact`` exact-term and ``long`` long queries,
    from ``paragraphs`` (default: the stdlib's docstring prose)."""
    rng = random.Random(seed)
    paragraphs = list(stdlib_paragraphs() if paragraphs is None else paragraphs)
    rng.shuffle(paragraphs)
    texts = list(dict.fromkeys(chunk for para in paragraphs for chunk in sentence_chunks(para, chunk_words)))[:chunks]
    # known-item: a sentence of a multi-sentence chunk leaves it and becomes the query
    candidates = [i for i, text in enumerate(texts) if len(SENTENCE.split(text)) >= 3]
    queries: list[LabelledQuery] = []
    for i in rng.sample(candidates, min(known_items, len(candidates))):
        sentences = SENTENCE.split(texts[i])
        pick = rng.randrange(len(sentences))
        if len(sentences[pick].split()) < _MIN_QUERY_WORDS:
            pick = max(range(len(sentences)), key=lambda s: len(sentences[s].split()))
        queries.append(LabelledQuery(sentences[pick], i, "known_item"))
        texts[i] = " ".join(s for k, s in enumerate(sentences) if k != pick)
    if long:
        queries += _long_queries(texts, long, {q.answer for q in queries}, seed, lambda text, r: (
            _hold_out_passage(SENTENCE.split(text), 1, r)))
    return HybridSet(texts, queries + _exact_queries(texts, exact, rng))


def build_api(chunks: int = 3000, known_items: int = 200, exact: int = 200, seed: int = 11,
              body_words: int = 80, long: int = 0) -> HybridSet:
    """Up to ``chunks`` API reference records (entries with a docstring body: ``name(signature): body``, the
    body cut to ``body_words`` words) with ``known_items`` summary queries and ``exact`` exact-term queries.
    A summary that more than one entry has (``posixpath.abspath`` and ``ntpath.abspath``), or that its record
    repeats, is never a query."""
    rng = random.Random(seed)
    entries = [e for e in stdlib_api_entries() if e.body]
    rng.shuffle(entries)
    records: dict[str, str] = {}  # text -> summary, in order, each text once
    for entry in entries:
        records.setdefault(f"{entry.name}({entry.signature}): {' '.join(entry.body.split()[:body_words])}", entry.summary)
        if len(records) == chunks:
            break
    texts, summaries = list(records), list(records.values())
    counts = Counter(summaries)
    shared = {s for s, n in counts.items() if n > 1}
    candidates = [i for i, s in enumerate(summaries)
                  if s not in shared and _SUMMARY_WORDS[0] <= len(s.split()) <= _SUMMARY_WORDS[1] and s not in texts[i]]
    queries = [LabelledQuery(summaries[i], i, "known_item")
               for i in rng.sample(candidates, min(known_items, len(candidates)))]
    if long:
        queries += _long_queries(texts, long, {q.answer for q in queries}, seed, _api_passage)
    return HybridSet(texts, queries + _exact_queries(texts, exact, rng))


def _api_passage(record: str, rng: random.Random) -> tuple[str, str] | None:
    """A passage of a record's body (``name(signature): body``) held out; the name, signature and one body
    sentence at least stay."""
    head, sep, body = record.partition("): ")
    held = _hold_out_passage(SENTENCE.split(body), 1, rng) if sep else None
    return None if held is None else (held[0], f"{head}{sep}{held[1]}")


def build_numpy(chunks: int = 3000, known_items: int = 200, exact: int = 200, seed: int = 11,
                long: int = 0) -> HybridSet:
    """:func:`build` over numpy's docstring prose (the pinned numpy): a corpus the fusion was never chosen on."""
    return build(chunks, known_items, exact, seed, long=long, paragraphs=package_paragraphs("numpy"))


#: corpus name -> builder (chunks, known_items, exact, seed=, long=0) of its labelled set
CORPORA = {"prose": build, "api": build_api, "numpy": build_numpy}
