"""Hybrid search in process: the sink writes dense + sparse, the Searcher fuses them in the store;
bad requests (no sparse encoder, a collection without the sparse vector) get clear errors and
the searches around them are served."""

from __future__ import annotations

import pytest
from conftest import make_engine

from embedstream.bench import hybrid_set
from embedstream.engine.engine import EmbedRequest
from embedstream.engine.sparse import BM25Encoder
from embedstream.ranking import DEFAULT_FUSION
from embedstream.schemas import ChunkEvent
from embedstream.schemas.rerank import SearchRequest
from embedstream.vectorstore.factory import open_store
from embedstream.workers.search import Searcher
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig


@pytest.fixture(scope="module")
def labelled():
    return hybrid_set.build(chunks=300, known_items=0, exact=40, seed=5)


@pytest.fixture(scope="module")
def engine(tiny_bert_dir):
    engine = make_engine(tiny_bert_dir, name="tiny")
    engine.sparse = BM25Encoder()
    return engine


def _index(engine, labelled, sparse: str | None, collection: str = "docs"):
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, engine.spec, engine.dimensions, collection, SinkConfig(sparse=sparse))
    results, _ = engine.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(labelled.chunks)])
    sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=f"c{i}", chunk_id=0, text=t), r.full)
                 for i, (t, r) in enumerate(zip(labelled.chunks, results))])
    return store


def _request(query: str, **kw) -> SearchRequest:
    return SearchRequest(request_id="r", query=query, reply_to="replies", rerank=False, **kw)


def test_sink_writes_the_rows_sparse_vector_into_the_same_point(engine, labelled):
    store = _index(engine, labelled, "bm25")
    points = store.scroll("docs", with_vectors=True)
    assert len(points) == len(labelled.chunks)
    for point in points[:20]:
        text = point.payload["text"]
        assert set(point.vectors) == {"full", "sparse_bm25"}
        assert point.vectors["sparse_bm25"] == engine.sparse.encode_texts([text], query=False)[0]


# wrrf and convex lean on dense by design; DBSF scores a point by its list's mean and spread, and this random model's
# cosines tie at 6 places in runs of 17-80 points, all of which a cut keeps (the rule): DBSF then measures the tie
@pytest.mark.parametrize("fusion", [DEFAULT_FUSION, "rrf"])
def test_hybrid_finds_exact_terms_a_random_dense_model_cannot(engine, labelled, fusion):
    """The tiny random BERT ranks by noise; the fused list still brings the chunk holding the identifier."""
    store = _index(engine, labelled, "bm25")
    searcher = Searcher(store, engine, None, "docs")
    found = 0
    for query in labelled.of_kind("exact_term"):
        reply = searcher.search(_request(query.text, mode="hybrid", fusion=fusion, top_k=10, top_n=10,
                                         dense_limit=10, sparse_limit=10))
        assert reply.error is None
        assert {"embed", "sparse", "search", "total"} <= set(reply.timings_ms)
        found += f"c{query.answer}" in [h.doc_id for h in reply.hits]
    assert found >= 0.9 * len(labelled.of_kind("exact_term"))


def test_hybrid_against_a_dense_only_collection_is_refused_and_dense_still_served(engine, labelled):
    store = _index(engine, labelled, None)
    searcher = Searcher(store, engine, None, "docs")
    reply = searcher.search(_request("os.path.join", mode="hybrid"))
    assert reply.error is not None and reply.error.code == "no_sparse_vector"
    assert "mode=dense" in reply.error.message
    assert searcher.search(_request("os.path.join")).error is None


def test_hybrid_without_a_sparse_encoder_is_refused(tiny_bert_dir, engine, labelled):
    store = _index(engine, labelled, "bm25")
    searcher = Searcher(store, make_engine(tiny_bert_dir, name="tiny"), None, "docs")
    reply = searcher.search(_request("os.path.join", mode="hybrid"))
    assert reply.error is not None and reply.error.code == "hybrid_unavailable"
    assert searcher.search(_request("os.path.join")).error is None


def test_the_deployments_dense_scale_weighs_the_default_fusion(engine, labelled):
    """EMBEDSTREAM_SPARSE__DENSE_SCALE reaches the logit fusion: with a tiny dense weight the fused list ranks as
    BM25 (the chunk holding the exact term first), with a huge one as the random dense model (mostly not)."""
    store = _index(engine, labelled, "bm25")

    def firsts(dense_scale: float) -> int:
        searcher = Searcher(store, engine, None, "docs", dense_scale=dense_scale)
        return sum(searcher.search(_request(q.text, mode="hybrid", top_k=10, top_n=10, dense_limit=10,
                                            sparse_limit=10)).hits[0].doc_id == f"c{q.answer}"
                   for q in labelled.of_kind("exact_term"))

    sparse_like, dense_like = firsts(1e-6), firsts(1e6)
    assert sparse_like >= 0.7 * len(labelled.of_kind("exact_term")) and dense_like < sparse_like / 2, (sparse_like, dense_like)
