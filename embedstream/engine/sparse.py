"""Sparse encoders: the term-weight vector written beside the dense one (hybrid search).

One contract, :class:`SparseEncoder`, chosen per deployment (``EMBEDSTREAM_SPARSE__KIND``):

* ``bm25`` (:class:`BM25Encoder`, no model): a document's vector is its terms' BM25 term-frequency
  weights with document-length normalisation, ``tf (k + 1) / (tf + k (1 - b + b len / avg_len))``; a
  query's is weight 1 per distinct term. The IDF is Qdrant's (the ``idf`` modifier on the collection's
  ``sparse_bm25`` vector), computed at search time over what is indexed now, so it never goes stale.
  Terms come from a word tokenizer (``words``: Qdrant's own BM25 analyser from qdrant-edge: lowercase,
  English stop words, Snowball stemming, the same as a Qdrant server's ``qdrant/bm25``) or from the
  model's tokenizer (``model``: the chunk's WordPiece ids already in hand, special tokens left out).
  ``bench quality --hybrid`` measures both (docs/benchmarks.md); ``words`` is the default.
* ``splade`` (:class:`~embedstream.engine.splade.SpladeEncoder`): a masked-LM head with SPLADE pooling.

``sparse_choice.build_sparse_encoder`` picks one from the settings.

The engine calls :meth:`SparseEncoder.encode` with the batch it has just run the dense model on
(``Engine.forward``), so the sparse vector is computed in the same pass over the same items.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from embedstream.engine.errors import ConfigError
from embedstream.vectors import SparseVector

if TYPE_CHECKING:
    from embedstream.engine.prepared import Prepared
    from embedstream.engine.tokenize import TextTokenizer


class SparseEncoder(ABC):
    """Texts (and the dense model's tokens of them) in, one :class:`SparseVector` per text out."""

    kind: str  # "bm25" | "splade": the stored vector is ``sparse_<kind>`` (embedstream.vectors)
    model: str  # what /info reports

    @abstractmethod
    def encode(self, items: list[Prepared], queries: list[bool], bare: list[bool]) -> list[SparseVector | None]:
        """One vector per prepared item (in item order). ``queries[i]``: item i is a query (its terms
        weighed as a query), else a document; ``bare[i]``: its tokens are the text alone (no prompt
        before it), so an encoder with the same tokenizer may use them as they are. None where no
        vector can be made for an item."""

    @abstractmethod
    def encode_texts(self, texts: list[str], query: bool) -> list[SparseVector]:
        """Vectors of plain texts (a search's query, a benchmark's documents)."""

    def describe(self) -> str:
        return f"{self.kind} ({self.model})"

    @abstractmethod
    def identity(self) -> tuple[dict, dict]:
        """(space, values) of the vectors it writes (:mod:`embedstream.engine.identity`): what decides their term
        space, and what changes their weights only."""


class BM25Encoder(SparseEncoder):
    """BM25 term weights; IDF left to the store (see the module docstring)."""

    kind = "bm25"

    def __init__(self, tokenizer: str = "words", k: float = 1.2, b: float = 0.75, avg_len: float = 256.0,
                 text_tokenizer: TextTokenizer | None = None):
        if tokenizer not in ("words", "model"):
            raise ConfigError(f"bm25 tokenizer must be 'words' or 'model', got {tokenizer!r}")
        if tokenizer == "model" and text_tokenizer is None:
            raise ConfigError("bm25 over the model's tokens needs the model's tokenizer")
        if k < 0 or not 0 <= b <= 1 or avg_len <= 0:
            raise ConfigError(f"bm25 needs k >= 0, 0 <= b <= 1 and avg_len > 0 (got k={k}, b={b}, avg_len={avg_len})")
        self.tokenizer, self.k, self.b, self.avg_len = tokenizer, k, b, avg_len
        self.text_tokenizer = text_tokenizer
        self.model = f"bm25/{tokenizer}"
        self._words = None
        if tokenizer == "words":
            import qdrant_edge as qe

            self._words = qe.Bm25(qe.Bm25Config(k=k, b=b, avg_len=avg_len))
        else:
            self._special = set(text_tokenizer._special_ids)  # noqa: SLF001 - the tokenizer's own special ids

    def identity(self) -> tuple[dict, dict]:
        space: dict = {"kind": self.kind, "tokenizer": self.tokenizer}
        if self.text_tokenizer is not None and self.tokenizer == "model":
            space["vocabulary"] = self.text_tokenizer.fingerprint()
        return space, {"k": self.k, "b": self.b, "avg_len": self.avg_len}

    def _weights(self, counts: Counter, query: bool) -> SparseVector:
        """BM25's term-frequency part over a bag of term ids (a query: 1 per distinct term)."""
        if not counts:
            return SparseVector.of([], [])
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        if query:
            return SparseVector.of(ids, np.ones(len(ids), dtype=np.float32))
        tf = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
        length = tf.sum()
        weights = tf * (self.k + 1) / (tf + self.k * (1 - self.b + self.b * length / self.avg_len))
        return SparseVector.of(ids, weights)

    def _of_words(self, text: str, query: bool) -> SparseVector:
        vector = self._words.embed_query(text) if query else self._words.embed_document(text)
        return SparseVector.of(vector.indices, vector.values)

    def _of_ids(self, ids: list[int], query: bool) -> SparseVector:
        return self._weights(Counter(i for i in ids if i not in self._special), query)

    def encode(self, items: list[Prepared], queries: list[bool], bare: list[bool]) -> list[SparseVector | None]:
        if self._words is not None:
            return [self._of_words(text_of(item, self.text_tokenizer), q) for item, q in zip(items, queries)]
        ids = [item.tokens.ids if own else None for item, own in zip(items, bare)]
        redo = [i for i, found in enumerate(ids) if found is None]  # prompted: the text's own tokens
        for i, tok in zip(redo, self._tokenize([text_of(items[i], None) for i in redo])):
            ids[i] = tok
        return [self._of_ids(found, query) for found, query in zip(ids, queries)]

    def _tokenize(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return [t.ids for t in self.text_tokenizer.encode_many(texts, [True] * len(texts))]  # counts need no limit

    def encode_texts(self, texts: list[str], query: bool) -> list[SparseVector]:
        if self._words is not None:
            return [self._of_words(text, query) for text in texts]
        return [self._of_ids(ids, query) for ids in self._tokenize(texts)]


def text_of(item: Prepared, tokenizer: TextTokenizer | None) -> str:
    """The item's text; a pre-tokenized chunk sent without text is decoded from its ids."""
    text = getattr(item.request, "text", None)
    if isinstance(text, str) and text.strip():
        return text
    if tokenizer is None:
        return ""
    return tokenizer.tokenizer.decode(item.tokens.ids[item.tokens.prompt_tokens:], skip_special_tokens=True)
