"""bench quality's engine rows: documents and queries both embedded another way (e.g. the int8 engine)."""

from __future__ import annotations

import numpy as np

from embedstream.bench.quality_bench import evaluate


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_documents_and_queries_embedded_another_way_are_searched_among_themselves():
    rng = np.random.default_rng(2)
    vectors = _unit(rng.standard_normal((2000, 64)))
    queries = _unit(vectors[:40] + 0.3 * rng.standard_normal((40, 64)))
    rotation, _ = np.linalg.qr(rng.standard_normal((64, 64)))  # same geometry, other coordinates
    noisy = _unit(vectors + 0.3 * rng.standard_normal(vectors.shape))
    engines = {"rotated": (_unit(vectors @ rotation), _unit(queries @ rotation)), "noisy": (noisy, queries)}
    rows = {row.form: row for row in evaluate(vectors, queries, k=10, rescore=4, other_engines=engines)}
    assert rows["rotated"].recall == 1.0  # only the geometry counts, not the coordinates
    assert rows["noisy"].recall < 0.9
    assert rows["rotated"].recall_rescored is None
