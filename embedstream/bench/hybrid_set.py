"""Labelled retrieval sets built offline (`bench quality --hybrid`, fusion choice, tests), over two
corpora of different kinds (:data:`CORPORA`):

* ``prose`` (:func:`build`): stdlib docstring paragraphs cut into chunks; a **known-item** query is a
  sentence taken out of a chunk, which is indexed without it (the answer is the rest of the chunk);
* ``api`` (:func:`build_api`): stdlib API reference entries, ``qualified.name(signature): body``:
  short records full of identifiers; a **known-item** query is the entry's one-line summary, which
  the indexed record leaves out (what someone who knows what a function does but not its name types).

In both, an **exact-term** query is one term that occurs in one indexed text only, the query alone:
half identifiers (a dotted name, a snake_case or camelCase word: ``os.path.join``, ``read_bytes``,
``getLogger``), half plain words of 6 letters or more. Dense bi-encoders are known to miss these.

Each query has exactly one right text. Deterministic for a given seed: the same texts and queries on
every run. :meth:`HybridSet.half` splits every kind in two (tune on one, check on the other).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass

from embedstream.corpus import SENTENCE, sentence_chunks, stdlib_api_entries, stdlib_paragraphs

# dotted names (two parts or more), snake_case, camelCase; letters first, so plain numbers never count
IDENTIFIER = re.compile(
    r"(?<![\w.])(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+|[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9]"
    r"|[a-z]+[A-Z][A-Za-z0-9]*)(?![\w])")
WORD = re.compile(r"(?<![\w.])[A-Za-z]{6,}(?![\w])")  # a plain word: letters only, 6 or more
_MIN_QUERY_WORDS = 6
_SUMMARY_WORDS = (5, 25)  # a summary query: one line, not a paragraph


@dataclass(frozen=True)
class LabelledQuery:
    text: str
    answer: int  # index of the right chunk
    kind: str  # "known_item" | "exact_term"


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


def build(chunks: int = 3000, known_items: int = 200, exact: int = 200, seed: int = 11,
          chunk_words: int = 60) -> HybridSet:
    """``chunks`` indexed chunks with ``known_items`` known-item and ``exact`` exact-term queries."""
    rng = random.Random(seed)
    paragraphs = list(stdlib_paragraphs())
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
    return HybridSet(texts, queries + _exact_queries(texts, exact, rng))


def build_api(chunks: int = 3000, known_items: int = 200, exact: int = 200, seed: int = 11,
              body_words: int = 80) -> HybridSet:
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
    return HybridSet(texts, queries + _exact_queries(texts, exact, rng))


#: corpus name -> builder (chunks, known_items, exact) of its labelled set
CORPORA = {"prose": build, "api": build_api}
