"""Sparse vectors beside dense ones on every backend (':memory:' and qdrant-edge).

Expected rankings come from numpy brute force (BM25's IDF as Qdrant defines it), not from the store.
Fusion is not the store's: embedstream.ranking fuses the lists (tests/unit/test_ranking.py)."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest

from embedstream.vectorstore import CollectionConfigMismatch, Point, SparseSpec, SparseVector, VectorSpec
from embedstream.vectorstore.edge_store import EdgeStore
from embedstream.vectorstore.qdrant_client_store import QdrantClientStore

N, DIM, VOCAB = 120, 16, 40
SPECS = {"full": VectorSpec(DIM), "sparse_bm25": SparseSpec("idf"), "sparse_splade": SparseSpec()}


@pytest.fixture(params=["memory", "edge"])
def store(request, tmp_path):
    s = QdrantClientStore.in_memory() if request.param == "memory" else EdgeStore(tmp_path / "edge")
    yield s
    s.close()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    dense = rng.standard_normal((N, DIM)).astype(np.float32)
    dense /= np.linalg.norm(dense, axis=1, keepdims=True)
    sparse = []
    for _ in range(N):
        terms = rng.choice(VOCAB, size=int(rng.integers(1, 8)), replace=False)
        sparse.append(SparseVector.of(terms, rng.uniform(0.2, 2.0, terms.size)))
    ids = [str(uuid.UUID(int=i + 1)) for i in range(N)]
    return {"dense": dense, "sparse": sparse, "ids": ids}


def _fill(store, data):
    store.ensure_collection("docs", SPECS)
    store.upsert("docs", [Point(pid, {"full": data["dense"][i], "sparse_bm25": data["sparse"][i],
                                      "sparse_splade": data["sparse"][i]}, {"i": i})
                          for i, pid in enumerate(data["ids"])])


def _bm25_scores(data, query: SparseVector) -> np.ndarray:
    """Qdrant's IDF modifier: idf(t) = ln(1 + (N - n_t + 0.5) / (n_t + 0.5)), times the stored weight."""
    scores = np.zeros(N)
    for t, qv in zip(query.indices, query.values):
        holders = [(i, v.values[np.searchsorted(v.indices, t)]) for i, v in enumerate(data["sparse"]) if t in v.indices]
        idf = math.log(1 + (N - len(holders) + 0.5) / (len(holders) + 0.5))
        for i, w in holders:
            scores[i] += idf * qv * w
    return scores


def test_collection_holds_sparse_specs_and_refuses_a_different_set(store, data):
    assert store.ensure_collection("docs", SPECS) is True
    assert store.get_vector_specs("docs") == SPECS
    assert store.ensure_collection("docs", SPECS) is False
    with pytest.raises(CollectionConfigMismatch, match="sparse_bm25"):
        store.ensure_collection("docs", {"full": VectorSpec(DIM)})
    store.ensure_collection("dense_only", {"full": VectorSpec(DIM)})
    with pytest.raises(CollectionConfigMismatch, match="sparse_bm25"):
        store.ensure_collection("dense_only", SPECS)


def test_one_point_holds_dense_and_sparse_and_reads_them_back(store, data):
    _fill(store, data)
    (point,) = [p for p in store.scroll("docs", with_vectors=True) if p.id == data["ids"][3]]
    assert point.vectors["sparse_bm25"] == data["sparse"][3]
    np.testing.assert_allclose(point.vectors["full"], data["dense"][3], atol=1e-6)


def test_sparse_search_applies_the_idf_modifier(store, data):
    _fill(store, data)
    query = SparseVector.of([1, 5, 9], [1.0, 1.0, 1.0])
    hits = store.search("docs", "sparse_bm25", query, 10)
    expected = _bm25_scores(data, query)
    for hit in hits:
        assert hit.score == pytest.approx(expected[hit.payload["i"]], rel=1e-4)
    assert [round(h.score, 4) for h in hits] == [round(s, 4) for s in sorted(expected, reverse=True)[:len(hits)]]
    plain = store.search("docs", "sparse_splade", query, 3)  # no modifier: the dot product itself
    assert plain[0].score == pytest.approx(max(sum(v.values[np.isin(v.indices, [1, 5, 9])]) for v in data["sparse"]), rel=1e-5)


def test_deleting_a_point_removes_its_sparse_vector_too(store, data):
    _fill(store, data)
    query = data["sparse"][5]
    assert data["ids"][5] in [h.id for h in store.search("docs", "sparse_bm25", query, 50)]
    store.delete_points("docs", [data["ids"][5]])
    assert data["ids"][5] not in [h.id for h in store.search("docs", "sparse_bm25", query, N)]
    assert data["ids"][5] not in [h.id for h in store.search("docs", "sparse_splade", query, N)]


def test_get_vectors_reads_one_named_vector_by_id(store, data):
    _fill(store, data)
    wanted = [data["ids"][4], data["ids"][9], "00000000-0000-0000-0000-00000000beef"]  # the last has no point
    got = store.get_vectors("docs", wanted, "full")
    assert set(got) == set(wanted[:2])
    for i in (4, 9):
        np.testing.assert_allclose(got[data["ids"][i]], data["dense"][i], atol=1e-6)
    assert store.get_vectors("docs", [data["ids"][4]], "sparse_bm25")[data["ids"][4]] == data["sparse"][4]
    assert store.get_vectors("docs", [], "full") == {}
    with pytest.raises(ValueError, match="mrl_8"):
        store.get_vectors("docs", wanted, "mrl_8")


def test_a_search_restricted_to_ids_scores_exactly_those_points_as_the_full_search_does(store, data):
    """How the searcher scores given points (a dense-only candidate's BM25, a sparse-only one's cosine): the IDF is
    the collection's, not the restricted set's, so each score equals the unrestricted search's; a point holding none
    of the query's terms is left out (its BM25 is 0)."""
    _fill(store, data)
    query = SparseVector.of([1, 5, 9], [1.0, 1.0, 1.0])
    everything = {h.id: h.score for h in store.search("docs", "sparse_bm25", query, N)}
    holders, others = list(everything)[::4], [pid for pid in data["ids"] if pid not in everything][:5]
    got = store.search("docs", "sparse_bm25", query, len(holders) + len(others), ids=holders + others, exact=True)
    assert {h.id: h.score for h in got} == {pid: everything[pid] for pid in holders}
    dense = store.search("docs", "full", data["dense"][0], 3, ids=data["ids"][40:43], exact=True)
    assert {h.id for h in dense} == set(data["ids"][40:43])
    for hit in dense:
        assert hit.score == pytest.approx(float(data["dense"][data["ids"].index(hit.id)] @ data["dense"][0]), abs=1e-5)


def test_a_batch_of_searches_answers_each_in_order_with_its_vectors(store, data):
    _fill(store, data)
    probes = [SparseVector.of([t], [1.0]) for t in (1, 5, VOCAB + 7)]  # the last term: no point holds it
    batch = store.search_batch("docs", "sparse_bm25", probes, 2, exact=True, with_vector=True)
    assert len(batch) == 3 and batch[2] == []
    for probe, hits in zip(probes[:2], batch):
        alone = store.search("docs", "sparse_bm25", probe, 2)
        assert [(h.id, h.score) for h in hits] == [(h.id, h.score) for h in alone]
        for hit in hits:
            assert hit.vector == data["sparse"][data["ids"].index(hit.id)]
    assert all(h.vector is None for hits in store.search_batch("docs", "sparse_bm25", probes, 2) for h in hits)
