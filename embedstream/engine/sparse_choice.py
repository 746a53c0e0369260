"""The deployment's sparse encoder, chosen from the settings (``EMBEDSTREAM_SPARSE__KIND``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from embedstream.engine.sparse import BM25Encoder, SparseEncoder
from embedstream.engine.splade import SpladeEncoder

if TYPE_CHECKING:
    from embedstream.config import Settings
    from embedstream.engine.tokenize import TextTokenizer


def build_sparse_encoder(settings: Settings, text_tokenizer: TextTokenizer | None = None,
                         dense_max_tokens: int | None = None) -> SparseEncoder | None:
    """The deployment's sparse encoder (``settings.sparse``), or None when it writes dense vectors only."""
    sparse = settings.sparse
    if sparse.kind == "none":
        return None
    if sparse.kind == "bm25":
        return BM25Encoder(sparse.bm25_tokenizer, sparse.bm25_k, sparse.bm25_b, sparse.bm25_avg_len, text_tokenizer)
    return SpladeEncoder.from_name(sparse.model, settings, text_tokenizer, dense_max_tokens)
