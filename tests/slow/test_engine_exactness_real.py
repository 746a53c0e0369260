"""Exactness against sentence-transformers: same folder, same texts, cos >= 0.9999 / |diff| <= 1e-4."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_engine
from exactness import _min_cos, _vectors

from embedstream.corpus import mixed_length_texts, stdlib_paragraphs
from embedstream.engine.engine import ScoreRequest


def _pairs(n: int) -> list[tuple[str, str]]:
    paras = stdlib_paragraphs()
    return [(" ".join(paras[i].split()[:12]), paras[i + 500]) for i in range(n)]


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
