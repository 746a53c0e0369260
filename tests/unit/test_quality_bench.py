"""bench quality's scoring: exact recall of each storage form, and the oversampling each needs."""

from __future__ import annotations

import numpy as np

from embedstream.bench.quality_bench import OVERSAMPLING_LADDER, TARGET_RECALL, evaluate


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def test_forms_rank_as_their_precision_allows_and_name_the_oversampling_they_need():
    rng = np.random.default_rng(0)
    vectors = _unit(rng.standard_normal((3000, 64)))
    queries = _unit(vectors[:50] + 0.3 * rng.standard_normal((50, 64)))  # near some points, not on them
    rows = {row.form.split(" ")[0].rstrip(","): row for row in evaluate(vectors, queries, k=10, rescore=4)}
    assert rows["float32"].recall == 1.0
    assert rows["float16"].recall >= 0.99 and rows["float16"].oversampling_needed == 1
    assert rows["int8"].recall_rescored >= TARGET_RECALL
    binary = rows["binary"]
    assert binary.recall < rows["int8"].recall  # 1 bit per dimension loses the most
    assert binary.oversampling_needed in (0, *OVERSAMPLING_LADDER)
    assert binary.oversampling_needed == 0 or binary.oversampling_needed >= rows["int8"].oversampling_needed


def test_queries_embedded_another_way_are_scored_against_the_float32_vectors():
    rng = np.random.default_rng(1)
    vectors = _unit(rng.standard_normal((2000, 64)))
    queries = _unit(vectors[:40] + 0.3 * rng.standard_normal((40, 64)))
    same = queries.copy()
    noisy = _unit(queries + 0.5 * rng.standard_normal(queries.shape))
    rows = {row.form: row for row in evaluate(vectors, queries, k=10, rescore=4, other_queries={"same": same, "noisy": noisy})}
    assert rows["same"].recall == 1.0
    assert rows["noisy"].recall < 0.9
    assert rows["same"].recall_rescored is None
