"""Comparison helpers for the exactness tests."""

from __future__ import annotations

import numpy as np

from embedstream.engine.engine import EmbedRequest


def _vectors(engine, texts, **kw) -> np.ndarray:
    results, _ = engine.embed([EmbedRequest(i, t, **kw) for i, t in enumerate(texts)])
    assert all(r.error is None for r in results), [r.error for r in results if r.error][:3]
    return np.stack([r.vector.values for r in results])


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float((a * b).sum(1).min())
