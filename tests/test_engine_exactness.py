"""Exactness against sentence-transformers: same folder, same texts, cos >= 0.9999 / |diff| <= 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_engine

from embedstream.bench.corpus import mixed_length_texts, stdlib_paragraphs
from embedstream.engine.engine import EmbedRequest, ScoreRequest


def _vectors(engine, texts, **kw) -> np.ndarray:
    results, _ = engine.embed([EmbedRequest(i, t, **kw) for i, t in enumerate(texts)])
    assert all(r.error is None for r in results), [r.error for r in results if r.error][:3]
    return np.stack([r.vector.values for r in results])


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())


@pytest.mark.slow
def test_minilm_mean_pooling_matches_sentence_transformers_on_1000_real_texts(minilm_engine):
    from sentence_transformers import SentenceTransformer

    tok = minilm_engine.tokenizer.tokenizer
    texts = mixed_length_texts(1000, lambda s: len(tok.encode(s).ids), 256, seed=3, tail_share=0.0)
    lengths = [len(tok.encode(t).ids) for t in texts]
    assert len(texts) >= 1000 and min(lengths) >= 8 and max(lengths) <= 256
    ours = _vectors(minilm_engine, texts)
    ref = SentenceTransformer(str(minilm_engine.spec.path), device="cpu").encode(texts, batch_size=32)
    assert minilm_engine.runner.describe().startswith("packed-bert")
    assert _min_cos(ours, ref) >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


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


@pytest.mark.slow
def test_minilm_sized_cross_encoder_matches_sentence_transformers(model_dir):
    from sentence_transformers import CrossEncoder

    import tiny_models

    folder = tiny_models.build_tiny_cross_encoder(model_dir / "minilm-ce", base=tiny_models.MINILM)
    engine = make_engine(folder, kind="rerank")
    pairs = [(q, " ".join(p.split()[:150])) for q, p in _pairs(64)]
    results, _ = engine.score([ScoreRequest(i, q, p) for i, (q, p) in enumerate(pairs)])
    assert not any(r.truncated for r in results)  # both sides see whole pairs: no truncation policy in play
    ref = CrossEncoder(str(folder), device="cpu", max_length=engine.spec.max_tokens).predict(pairs)
    assert np.abs(np.array([r.score for r in results]) - ref).max() <= 1e-4
