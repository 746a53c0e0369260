"""A labelled retrieval set built offline over the stdlib prose corpus (`bench quality --hybrid`, tests).

Two kinds of query, each with exactly one right chunk:

* **known-item**: a sentence taken out of a chunk, which is indexed without it; the query is that
  sentence and the answer is the rest of its chunk (what a user remembering a passage types);
* **exact-term**: an identifier (a dotted name, a snake_case or camelCase word: ``os.path.join``,
  ``read_bytes``, ``getLogger``) that occurs in one indexed chunk only; the query is the identifier
  alone and the answer is that chunk. Dense bi-encoders are known to miss these.

Deterministic for a given seed: the same chunks and queries on every run.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from embedstream.corpus import SENTENCE, sentence_chunks, stdlib_paragraphs
# dotted names (two parts or more), snake_case, camelCase; letters first, so plain numbers never count
IDENTIFIER = re.compile(
    r"(?<![\w.])(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+|[a-z][a-z0-9]*_[a-z0-9_]*[a-z0-9]"
    r"|[a-z]+[A-Z][A-Za-z0-9]*)(?![\w])")
_MIN_QUERY_WORDS = 6


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


def exact_terms(chunks: list[str]) -> dict[str, int]:
    """Identifiers that occur (as whole tokens) in exactly one chunk: identifier -> that chunk's index.
    An identifier counts as occurring wherever its text appears, so one contained in another chunk's
    longer name (``path.join`` in ``os.path.join``) is not unique."""
    owners: dict[str, set[int]] = {}
    for i, chunk in enumerate(chunks):
        for match in IDENTIFIER.finditer(chunk):
            owners.setdefault(match.group(0).rstrip("."), set()).add(i)
    unique = {term: next(iter(found)) for term, found in owners.items() if len(found) == 1 and len(term) >= 5}
    lowered = [chunk.lower() for chunk in chunks]
    return {term: i for term, i in unique.items() if sum(term.lower() in chunk for chunk in lowered) == 1}


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
    terms = sorted(exact_terms(texts).items())
    for term, i in rng.sample(terms, min(exact, len(terms))):
        queries.append(LabelledQuery(term, i, "exact_term"))
    return HybridSet(texts, queries)
