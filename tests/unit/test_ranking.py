"""The one ranking rule (score at 6 places, then the better single-list rank, then the point id) and the
fusions of embedstream.ranking, checked against Qdrant's own fusion code (qdrant-client's local mode)
where there is no tie, and against the stated rule where there is."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace
from fractions import Fraction

import pytest
from qdrant_client import models
from qdrant_client.hybrid.fusion import distribution_based_score_fusion, reciprocal_rank_fusion

from embedstream.ranking import FUSIONS, Candidates, Fusion, complete_at, fuse, ordered, score_key, with_ties


def _id(n: int) -> str:
    return str(uuid.UUID(int=n + 1))


def _lists(seed: int, size: int = 30, overlap: int = 12) -> list[list[tuple[str, float]]]:
    rng = random.Random(seed)
    dense = [(_id(i), rng.uniform(0.2, 0.9)) for i in range(size)]
    sparse = [(_id(i + size - overlap), rng.uniform(0.5, 12.0)) for i in range(size)]
    return [dense, sparse]


def _fuse(lists, fusion: Fusion, limit: int):
    """Fuse plain (id, score) lists; a point a list leaves out scores 0 there (a score fusion needs a score)."""
    return fuse([Candidates(pairs, absent=0.0) for pairs in lists], fusion, limit)


def _qdrant(lists, method: str, limit: int) -> list[tuple[str, float]]:
    responses = [[models.ScoredPoint(id=pid, version=0, score=score) for pid, score in
                  sorted(pairs, key=lambda p: -p[1])] for pairs in lists]
    # qdrant-client scores 1 / (position from 0 + its k): its k 61 is the server's (and ours) 1 / (60 + rank from 1)
    fused = (reciprocal_rank_fusion(responses, limit, ranking_constant_k=61) if method == "rrf"
             else distribution_based_score_fusion(responses, limit))
    return [(str(p.id), p.score) for p in fused]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("method", ["rrf", "dbsf"])
def test_rrf_and_dbsf_are_qdrants_own_where_nothing_ties(seed, method):
    lists = _lists(seed)
    ours = _fuse(lists, FUSIONS[method], 20)
    theirs = _qdrant(lists, method, 20)
    if method == "rrf":  # RRF ties (rank a + rank b = rank c + rank d) are ordered by our rule: compare scores
        assert [f.score for f in ours] == pytest.approx([s for _, s in theirs], rel=1e-12)
    else:
        assert [f.id for f in ours] == [pid for pid, _ in theirs]
        assert [f.score for f in ours] == pytest.approx([s for _, s in theirs], abs=1e-5)  # inputs taken at 6 places


def test_rrf_ties_go_to_the_better_single_list_rank_then_the_point_id():
    # a: dense 1, sparse 2; b: dense 2, sparse 1 -> 1/61 + 1/62 each: an exact tie, broken by the id
    a, b, c = _id(7), _id(3), _id(5)
    dense = [(a, 0.9), (b, 0.8), (c, 0.7)]
    sparse = [(b, 5.0), (a, 4.0)]
    fused = _fuse([dense, sparse], FUSIONS["rrf"], 3)
    assert [f.id for f in fused] == [b, a, c]  # b < a by id; both have best rank 1
    assert fused[0].ranks == (2, 1) and fused[1].ranks == (1, 2)
    # equal fused score, different best rank: d (dense 1 alone) beats e (dense 3, sparse 3) only if 1/61 > 2/63
    only = _fuse([[(_id(1), 0.9), (_id(2), 0.5)], [(_id(2), 1.0)]], Fusion("rrf", k=0), 2)
    assert only[0].id == _id(2)  # 1/2 + 1/1 beats 1/1


def test_order_does_not_depend_on_the_order_the_store_returned_ties_in():
    dense = [(_id(i), round(0.8 - 0.05 * (i // 3), 6)) for i in range(12)]  # threes of equal scores
    sparse = [(_id(i + 6), float(10 - i // 2)) for i in range(12)]  # twos of equal scores
    expected = {name: _fuse([dense, sparse], fusion, 10) for name, fusion in FUSIONS.items()}
    rng = random.Random(1)
    for _ in range(20):
        shuffled = [rng.sample(dense, len(dense)), rng.sample(sparse, len(sparse))]
        for name, fusion in FUSIONS.items():
            assert _fuse(shuffled, fusion, 10) == expected[name], name


def test_float_noise_below_the_compared_places_orders_nothing():
    """Two engines' cosines differ in the last bits; the rule compares at 6 places, so the order holds."""
    pairs = [(_id(i), 0.5 + 0.01 * (i % 4)) for i in range(16)]
    noisy = [(pid, score + (1e-9 if i % 2 else -1e-9)) for i, (pid, score) in enumerate(pairs)]
    key = {"score": lambda p: p[1], "ident": lambda p: p[0]}
    assert [p for p, _ in ordered(pairs, **key)] == [p for p, _ in ordered(noisy, **key)]
    for fusion in FUSIONS.values():
        assert [f.id for f in _fuse([pairs, pairs[::2]], fusion, 10)] == [f.id for f in _fuse([noisy, noisy[::2]], fusion, 10)]
    assert score_key(0.1234564) == score_key(0.12345640001) != score_key(0.1234566)


def test_rrf_scores_are_exact_fractions_where_floats_would_round():
    """1/61 + 1/62 + 1/63 and 1/60 + 1/64 + 1/63 differ by 1e-7 at most as floats; as fractions they are decided exactly."""
    fusion = Fusion("rrf", (Fraction(1), Fraction(1), Fraction(1)))
    a, b = _id(1), _id(2)
    fused = _fuse([[("x", 1.0), (a, 0.9)], [(b, 1.0), (a, 0.9)], [(a, 1.0), (b, 0.9)]], fusion, 3)
    expected = sorted([a, b, "x"], key=lambda pid: -sum(Fraction(1, 60 + r) for r in {
        a: (2, 2, 1), b: (1, 2), "x": (1,)}[pid]))
    assert [f.id for f in fused] == expected


def test_a_list_of_one_maps_to_the_middle_in_dbsf():
    fused = _fuse([[(_id(1), 0.9), (_id(2), 0.5), (_id(3), 0.1)], [(_id(9), 3.0)]], FUSIONS["dbsf"], 4)
    assert {f.id: f.score for f in fused}[_id(9)] == pytest.approx(0.5)


def test_fuse_refuses_a_list_count_its_weights_do_not_match():
    with pytest.raises(ValueError, match="2 weights for 3 lists"):
        _fuse([[], [], []], FUSIONS["rrf"], 5)


def test_logit_fusion_scores_every_candidate_in_every_list():
    """scale x cosine + sparse / unit: a sparse-only point's cosine and a dense-only point's sparse score are the
    exact ones given (Candidates.extra), a point in neither scores the list's ``absent``; nothing depends on where
    a list was cut, and a point with no score in a list is an error, never a guess."""
    logit = Fusion("logit", (Fraction(30), Fraction(1)))
    dense = [(_id(1), 0.50), (_id(2), 0.45)]
    sparse = [(_id(3), 6.0), (_id(1), 3.0)]
    lists = [Candidates(dense, {_id(3): 0.30}), Candidates(sparse, {_id(2): 1.5}, absent=0.0)]
    assert {f.id: f.score for f in fuse(lists, logit, 3)} == pytest.approx({_id(1): 18.0, _id(2): 15.0, _id(3): 15.0})
    # the 15.0 tie: _id(3) is first in a list (sparse), _id(2) second (dense): the better single-list rank first
    assert [f.id for f in fuse(lists, logit, 3)] == [_id(1), _id(3), _id(2)]
    unit = fuse([lists[0], replace(lists[1], unit=3.0)], logit, 3)
    assert {f.id: f.score for f in unit} == pytest.approx({_id(1): 16.0, _id(2): 14.0, _id(3): 11.0})
    # the dense list cut at 1: the points still candidates keep their fused scores
    cut = fuse([Candidates(dense[:1], {_id(3): 0.30}), Candidates(sparse, absent=0.0)], logit, 3)
    assert {f.id: f.score for f in cut} == {f.id: f.score for f in fuse(lists, logit, 3) if f.id != _id(2)}
    with pytest.raises(ValueError, match="no score for point"):
        fuse([Candidates(dense), Candidates(sparse, absent=0.0)], logit, 3)  # _id(3)'s cosine unknown


def test_a_lone_sparse_match_beats_dense_neighbours_that_match_no_term():
    """An exact-term query: one point holds the word (the store returns it alone), the dense list holds
    points that do not; every fusion puts the match in the top 2, logit first."""
    dense = [(_id(i), 0.62 - 0.01 * i) for i in range(10)]
    sparse = [(_id(42), 7.5)]
    lists = [Candidates(dense, {_id(42): 0.41}), Candidates(sparse, absent=0.0, unit=7.5)]
    assert fuse(lists, FUSIONS["logit"], 10)[0].id == _id(42)
    assert _id(42) in [f.id for f in fuse(lists, FUSIONS["rrf"], 2)]


def test_a_cut_keeps_every_point_tied_with_its_last_one():
    pairs = [(_id(i), s) for i, s in enumerate([0.9, 0.8, 0.7, 0.7, 0.7000000001, 0.7, 0.6, 0.6])]
    key = {"score": lambda p: p[1]}
    assert [p for p, _ in with_ties(pairs, 3, **key)] == [_id(i) for i in range(6)]  # 0.7 at 6 places: four tie
    assert [p for p, _ in with_ties(pairs, 2, **key)] == [_id(0), _id(1)]
    assert with_ties(pairs, 20, **key) == pairs and with_ties(pairs, 0, **key) == []
    # a store asked for 6 returned 6, the last still tied with the 3rd: the cut is not known to be whole yet
    assert not complete_at(pairs[:6], 3, 6, **key)
    assert complete_at(pairs[:7], 3, 7, **key)  # the 7th scores below the cut
    assert complete_at(pairs[:5], 3, 6, **key)  # the store had no more
