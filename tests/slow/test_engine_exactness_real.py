"""Exactness against sentence-transformers on real weights: same folder, same texts, cos >= 0.9999 / |diff| <= 1e-4."""

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


PER_BUCKET = 4  # texts per 8-token length bucket: every length the mix holds, at a tenth of the compute


def _by_length_bucket(texts: list[str], lengths: list[int], per_bucket: int) -> tuple[list[str], list[int]]:
    """The first ``per_bucket`` texts of each 8-token length bucket, and the shortest and longest text."""
    picked: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        bucket = picked.setdefault(n // 8, [])
        if len(bucket) < per_bucket:
            bucket.append(i)
    keep = sorted({i for bucket in picked.values() for i in bucket} | {lengths.index(min(lengths)),
                                                                       lengths.index(max(lengths))})
    return [texts[i] for i in keep], [lengths[i] for i in keep]


@pytest.mark.slow
def test_minilm_mean_pooling_matches_sentence_transformers_on_real_texts_of_every_length(minilm_engine):
    """Real weights, real prose, the packed path against sentence-transformers: queries (8-32 tokens) and
    chunks (64-256), four texts from every 8-token length bucket of the 1,000-text mix (was all 1,000:
    5.5 min alone; the buckets hold every length the mix has, so the comparison covers the same shapes)."""
    from sentence_transformers import SentenceTransformer

    tok = minilm_engine.tokenizer.tokenizer
    mix = mixed_length_texts(1000, lambda s: len(tok.encode(s).ids), 256, seed=3, tail_share=0.0)
    texts, lengths = _by_length_bucket(mix, [len(tok.encode(t).ids) for t in mix], PER_BUCKET)
    buckets = {n // 8 for n in lengths}
    assert min(lengths) <= 10 and max(lengths) >= 250 and {1, 2, 3} <= buckets and set(range(8, 32)) <= buckets
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
