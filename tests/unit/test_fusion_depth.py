"""Issue #42, fusion: a hybrid search ranks the same at any depth, the dense scale means the same at any query
length, and every cut keeps the points tied at its boundary. Real stores (qdrant-edge and qdrant-client's local
engine), real BM25 (Qdrant's word analyser and IDF), the searcher's own path; the dense vectors are synthetic so
that each scenario is exactly the one described."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from embedstream.engine.sparse import BM25Encoder
from embedstream.schemas.rerank import SearchRequest
from embedstream.vectors import encoded_rows
from embedstream.vectorstore import Point, VectorSpec
from embedstream.vectorstore.edge_store import EdgeStore
from embedstream.vectorstore.qdrant_client_store import QdrantClientStore
from embedstream.workers.search import Searcher
from embedstream.engine.identity import EmbeddingIdentity
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig
from embedstream.schemas import ChunkEvent

DIM = 16
#: invented words: Qdrant's analyser keeps each as one term (no stop word, no stem shared with another)
VOCAB = [a + b + c for a in ("zor", "quil", "vex", "brim", "taf", "nol") for b in ("ak", "ep", "ur", "ix")
         for c in ("mon", "dax", "wiv")]


class _Spec:
    name = "synthetic"
    matryoshka_dims: tuple[int, ...] = ()


@pytest.fixture(params=["edge", "memory"])
def store(request, tmp_path):
    s = EdgeStore(tmp_path / "edge") if request.param == "edge" else QdrantClientStore.in_memory()
    yield s
    s.close()


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _fill(store, collection: str, texts: list[str], vectors: np.ndarray) -> None:
    sink = QdrantSink(store, _Spec(), DIM, collection, SinkConfig(sparse="bm25"),
                      identity=EmbeddingIdentity({"model": "synthetic"}))
    rows = encoded_rows(vectors, BM25Encoder().encode_texts(texts, query=False))
    sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=text), rows[i])
                 for i, text in enumerate(texts)])


def _hybrid(searcher: Searcher, collection: str, text: str, top_k: int, top_n: int = 10):
    reply = searcher.search(SearchRequest(request_id="r", query=text, reply_to="t", rerank=False, mode="hybrid",
                                          collection=collection, top_k=top_k, top_n=top_n))
    assert reply.error is None, reply.error
    return reply.hits


def test_a_querys_top_10_is_the_same_at_top_k_10_20_and_50(store):
    """Every query whose fused top-10 (at top_k 50) lies in the dense or the sparse list's top 10 (so each hit is a
    candidate at every depth): the same ids with the same fused scores at top_k 10, 20 and 50. Before: a point
    missing from the sparse list was credited with the list's last kept BM25 score, a bigger bonus the shorter
    the list, so at top_k 10 dense-only points overtook the points both lists hold."""
    rng = np.random.default_rng(3)
    topics = [VOCAB[3 * t: 3 * t + 3] for t in range(20)]  # 20 topics of 3 words each; filler words after them
    filler = VOCAB[60:]
    centre = _unit(rng.standard_normal((len(topics), DIM)))
    texts, docs = [], []
    for t, topic in enumerate(topics):
        for _ in range(14):  # 14 texts a topic: some of its words (a few of another topic's too), filler
            own = list(rng.choice(topic, size=int(rng.integers(1, 4))))
            stray = list(rng.choice(VOCAB[:60], size=int(rng.integers(0, 2))))
            text = own * int(rng.integers(1, 3)) + stray + list(rng.choice(filler, size=int(rng.integers(2, 20))))
            texts.append(" ".join(rng.permutation(text)))
            docs.append(_unit(centre[t] + 0.6 * _unit(rng.standard_normal(DIM))))
    _fill(store, "docs", texts, np.stack(docs))
    queries = {}
    for t, topic in enumerate(topics):
        for size in (1, 2, 3):
            queries[" ".join(rng.choice(topic, size=size, replace=False))] = _unit(
                centre[t] + 0.5 * _unit(rng.standard_normal(DIM)))
    searcher = Searcher(store, lambda text: queries[text], None, "docs", sparse=BM25Encoder())
    checked, moved, rescored = 0, [], []
    for text in queries:
        deep = _hybrid(searcher, "docs", text, 50)
        dense_top = {h.id for h in searcher._search("docs", searcher.plan("docs"), queries[text], 10, None)[0]}
        sparse_top = {h.id for h in store.search("docs", "sparse_bm25", BM25Encoder().encode_texts([text], True)[0], 10)}
        if not {h.id for h in deep} <= dense_top | sparse_top:
            continue  # a hit that neither list holds at depth 10: no depth-10 search can find it
        checked += 1
        hits = {k: _hybrid(searcher, "docs", text, k) for k in (10, 20, 50)}
        ids = {k: [h.id for h in found] for k, found in hits.items()}
        scores = {k: [round(h.vector_score, 6) for h in found] for k, found in hits.items()}
        if not ids[10] == ids[20] == ids[50]:
            moved.append(text)
        elif not scores[10] == scores[20] == scores[50]:
            rescored.append(text)
    assert checked >= 40, f"only {checked} queries had every hit in a list's top 10: the data no longer tests this"
    assert not moved and not rescored, (
        f"of {checked} queries, {len(moved)} ranked other points at top_k 10, 20 and 50 ({moved[:3]}), and "
        f"{len(rescored)} the same points with other fused scores ({rescored[:3]})")


def _zipf(n: int) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1)
    return p / p.sum()


@pytest.mark.parametrize("store", ["edge"], indirect=True)
def test_the_dense_scale_means_the_same_for_a_2_term_and_a_20_term_query(store):
    """Two candidates, the same evidence at every query length: A (the dense leader, cosine 0.8) holds half the
    query's terms, B (cosine 0.5) all of them; every query term is as rare as every other and held once by
    documents of one length. Their fused order, and each one's fused score, must not depend on whether the
    query has 2, 4, 12 or 20 terms. Before: BM25 grew with the number of matched terms (about 1.7 x IDF each)
    while the cosine did not, so the 2-term query kept A first and the 12-term one put B first."""
    rng = np.random.default_rng(5)
    results = {}
    for n in (2, 4, 12, 20):
        terms = VOCAB[:n]
        pad = VOCAB[-30:]  # words no query holds, to give every document the same length (20 terms)
        query = _unit(rng.standard_normal(DIM))

        def at(cos: float) -> np.ndarray:  # a unit vector at this cosine to the query
            other = rng.standard_normal(DIM)
            other = _unit(other - (other @ query) * query)
            return _unit(cos * query + np.sqrt(1 - cos * cos) * other)

        def doc(words: list[str]) -> str:
            return " ".join(words + pad[: 20 - len(words)])

        texts = [doc(terms[: n // 2]), doc(list(terms))]  # A, B
        vectors = [at(0.8), at(0.5)]
        for t in terms[n // 2:]:  # every query term in exactly 2 documents: the same IDF for all
            texts.append(doc([t]))
            vectors.append(at(0.05))
        for i in range(60 - len(texts)):  # the rest of the corpus holds no query term
            texts.append(doc([pad[i % 10]]))
            vectors.append(at(0.05))
        collection = f"q{n}"
        _fill(store, collection, texts, np.stack(vectors))
        searcher = Searcher(store, lambda _text: query, None, collection, sparse=BM25Encoder())
        hits = {h.doc_id: h.vector_score for h in _hybrid(searcher, collection, " ".join(terms), 10)}
        results[n] = (hits["d0"], hits["d1"])
    orders = {n: "A first" if a > b else "B first" for n, (a, b) in results.items()}
    assert len(set(orders.values())) == 1, f"the order of A and B depends on the query's length: {orders}"
    for n, (a, b) in results.items():
        assert (a, b) == pytest.approx(results[2], abs=1e-4), f"{n} terms: fused scores {a, b} vs {results[2]} at 2 terms"


def _ids(n: int) -> list[str]:
    return [str(uuid.UUID(int=i + 1)) for i in range(n)]


@pytest.mark.parametrize("store", ["edge", "memory"], indirect=True)
def test_a_cut_keeps_every_point_tied_at_its_boundary(store):
    """30 points tie on the dense score (the same vector), written in descending id order; top_k 3 cuts inside
    the group: the 3 smallest ids of all 30 come back, whichever tied points the store returns first. Before:
    4 more than the limit were asked for, so a tie of more than 4 at the cut went to the store's order."""
    ids = _ids(40)
    rng = np.random.default_rng(9)
    query = _unit(rng.standard_normal(DIM))
    tied = _unit(query + 0.3 * _unit(rng.standard_normal(DIM)))
    vectors = {pid: tied for pid in ids[:30]} | {pid: _unit(-query + 0.1 * rng.standard_normal(DIM)) for pid in ids[30:]}
    store.ensure_collection("docs", {"full": VectorSpec(DIM)})
    store.upsert("docs", [Point(pid, {"full": vectors[pid]}, {"text": pid, "doc_id": pid}) for pid in reversed(ids)])
    searcher = Searcher(store, lambda _text: query, None, "docs")
    for top_k in (1, 3, 7):
        reply = searcher.search(SearchRequest(request_id="r", query="q", reply_to="t", rerank=False, top_k=top_k,
                                              top_n=top_k))
        assert [h.id for h in reply.hits] == ids[:top_k], top_k


@pytest.mark.parametrize("store", ["edge", "memory"], indirect=True)
def test_the_matryoshka_prefetch_keeps_every_point_tied_at_its_cut(store):
    """40 points share their first 4 dimensions (they tie on mrl_4, the prefetch vector) and differ after them;
    top_k 2 with rescoring x4 prefetches 8: every one of the 40 must be rescored on the full vector, so the 2
    best full cosines of the group come back (written last, with the highest ids). Before: the prefetch had no
    margin at all and the store chose which 8 of the 40 went on."""
    ids = _ids(60)
    rng = np.random.default_rng(13)
    query = _unit(rng.standard_normal(DIM))
    head = query[:4].copy()
    full = {}
    for n, pid in enumerate(ids[:40]):
        tail = query[4:] * (0.2 + 0.02 * n) + 0.3 * rng.standard_normal(DIM - 4) * (1 - n / 40)
        full[pid] = _unit(np.concatenate([head, tail]))
    for pid in ids[40:]:
        full[pid] = _unit(-query + 0.2 * rng.standard_normal(DIM))
    exact = sorted(ids, key=lambda pid: -float(full[pid] @ query))[:2]
    store.ensure_collection("docs", {"full": VectorSpec(DIM), "mrl_4": VectorSpec(4)})
    store.upsert("docs", [Point(pid, {"full": full[pid], "mrl_4": _unit(full[pid][:4])}, {"text": pid, "doc_id": pid})
                          for pid in ids])
    searcher = Searcher(store, lambda _text: query, None, "docs", rescore_factor=4)
    assert searcher.plan("docs").prefetch_name == "mrl_4"
    reply = searcher.search(SearchRequest(request_id="r", query="q", reply_to="t", rerank=False, top_k=2, top_n=2))
    assert [h.id for h in reply.hits] == exact


@pytest.mark.parametrize("store", ["edge"], indirect=True)
def test_a_point_deleted_between_the_two_reads_leaves_the_lists_and_the_search_is_served(store):
    """A sparse-only candidate deleted after the sparse search and before its cosine is read has no dense score: it
    leaves the fused list (it is gone), and the search is answered, never failed for want of a score."""
    rng = np.random.default_rng(21)
    texts = [" ".join(rng.choice(VOCAB[:10], size=5)) for _ in range(30)] + ["zorakmon"] * 1
    vectors = _unit(rng.standard_normal((len(texts), DIM)))
    _fill(store, "docs", texts, vectors)
    query = _unit(vectors[0] + 0.1 * rng.standard_normal(DIM))

    class Deleting:
        """Deletes the first sparse-only point just before the searcher reads the sparse-only points' cosines."""

        def __init__(self, inner):
            self.inner, self.deleted = inner, None

        def search(self, name, vector_name, vector, top_k, filter=None, prefetch=None, ids=None, exact=False):
            if ids is not None and vector_name == "full" and self.deleted is None:
                self.deleted = ids[0]
                self.inner.delete_points(name, [ids[0]])
            return self.inner.search(name, vector_name, vector, top_k, filter=filter, prefetch=prefetch, ids=ids,
                                     exact=exact)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    spy = Deleting(store)
    searcher = Searcher(spy, lambda _text: query, None, "docs", sparse=BM25Encoder())
    hits = _hybrid(searcher, "docs", "zorakmon", 5)
    assert spy.deleted is not None and spy.deleted not in [h.id for h in hits] and len(hits) == 5
