"""Exactness against sentence-transformers: same folder, same texts, cos >= 0.9999 / |diff| <= 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_engine
from exactness import _min_cos, _vectors

from embedstream.corpus import mixed_length_texts, stdlib_paragraphs
from embedstream.engine.engine import EmbedRequest, ScoreRequest


def test_cls_pooling_matches_sentence_transformers(tiny_bert_dir):
    from sentence_transformers import SentenceTransformer

    engine = make_engine(tiny_bert_dir)
    assert engine.spec.pooling == "cls"
    texts = list(stdlib_paragraphs()[200:300])
    ours = _vectors(engine, texts, truncate=True)
    ref = SentenceTransformer(str(tiny_bert_dir), device="cpu").encode(texts, batch_size=16)
    assert _min_cos(ours, ref) >= 0.9999


def test_last_token_pooling_on_a_decoder_matches_sentence_transformers(tiny_qwen3_dir):
    from sentence_transformers import SentenceTransformer

    engine = make_engine(tiny_qwen3_dir)
    assert engine.spec.pooling == "last_token"
    assert engine.runner.describe().startswith("packed-decoder")
    texts = list(stdlib_paragraphs()[300:380])
    ours = _vectors(engine, texts, truncate=True)
    ref = SentenceTransformer(str(tiny_qwen3_dir), device="cpu").encode(texts, batch_size=16)
    assert _min_cos(ours, ref) >= 0.9999


def test_hf_fallback_path_gives_the_same_vectors(tiny_qwen3_dir, tiny_bert_dir):
    for folder in (tiny_bert_dir, tiny_qwen3_dir):
        packed = make_engine(folder)
        fallback = make_engine(folder, engine={"backend": "hf"})
        assert fallback.runner.describe().startswith("hf-padded")
        texts = list(stdlib_paragraphs()[10:40])
        assert _min_cos(_vectors(packed, texts, truncate=True), _vectors(fallback, texts, truncate=True)) >= 0.9999


def _pairs(n: int) -> list[tuple[str, str]]:
    paras = stdlib_paragraphs()
    return [(" ".join(paras[i].split()[:12]), paras[i + 500]) for i in range(n)]


def test_cross_encoder_scores_match_sentence_transformers(tiny_ce_dir):
    from sentence_transformers import CrossEncoder

    engine = make_engine(tiny_ce_dir, kind="rerank")
    pairs = _pairs(40)
    results, _ = engine.score([ScoreRequest(i, q, p) for i, (q, p) in enumerate(pairs)])
    ref = CrossEncoder(str(tiny_ce_dir), device="cpu").predict(pairs)
    assert np.abs(np.array([r.score for r in results]) - ref).max() <= 1e-4
