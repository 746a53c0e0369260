"""`bench fusion`: its numbers are the searcher's (the same candidate lists, the same unit, the same fused order),
its checks hold, and its choice follows the stated rule (the smoothed objective, on the tuning corpus only)."""

from __future__ import annotations

import pytest

from embedstream.bench import fusion_bench
from embedstream.bench.fusion_bench import Ranks, smoothed


@pytest.fixture(scope="module")
def lists(tiny_bert_dir):
    return fusion_bench.collect("prose", str(tiny_bert_dir), chunks=200, queries=8, threads=1)


def test_the_bench_fuses_the_searchers_own_lists_with_the_searchers_unit(lists):
    assert lists.idf_check < 1e-5 and lists.unit_check < 1e-5  # the store's BM25 and the searcher's unit, here
    assert lists.search_check == 0  # the default row's top 10 is what the searcher's own hybrid search returns
    kinds = {q.kind for q in lists.queries}
    assert kinds == set(fusion_bench.KINDS)
    for q in lists.queries:
        assert set(q.units) == set(fusion_bench.UNITS) and q.units["raw"] == 1.0
        assert q.sparse.unit == 1.0  # the bench sets the unit itself, per row
        # every candidate is scored in both lists: a score fusion needs nothing more
        dense_ids, sparse_ids = {p for p, _ in q.dense.pairs}, {p for p, _ in q.sparse.pairs}
        assert sparse_ids - dense_ids <= set(q.dense.extra) and q.sparse.absent == 0.0


def test_the_before_row_credits_a_dense_only_point_with_the_sparse_lists_last_score(lists):
    full = next(q for q in lists.queries if len(q.sparse.pairs) >= fusion_bench.CANDIDATES)
    dense, sparse = full.before
    assert sparse.absent == full.sparse.pairs[fusion_bench.CANDIDATES - 1][1]
    short = next((q for q in lists.queries if len(q.sparse.pairs) < fusion_bench.CANDIDATES), None)
    if short is not None:
        assert short.before[1].absent == 0.0


def test_the_scale_is_the_best_of_the_smoothed_objective():
    class Fixed(Ranks):
        def __init__(self, value):
            self.value = value

        def objective(self):
            return self.value

    # a lone spike (4) loses to a plateau (2-2.5): the highest single point of a flat top is noise
    by_scale = {1: Fixed(0.60), 2: Fixed(0.68), 2.5: Fixed(0.68), 3: Fixed(0.675), 3.5: Fixed(0.60), 4: Fixed(0.69),
                5: Fixed(0.60)}
    smooth = smoothed(by_scale)
    assert max(smooth, key=smooth.get) == 2.5
    assert smooth[1] == pytest.approx((0.60 + 0.68) / 2)


def test_a_report_corpus_must_not_be_the_tuning_one():
    with pytest.raises(ValueError, match="another than the tuning one"):
        fusion_bench.run(tune="api", reports=("api",))
