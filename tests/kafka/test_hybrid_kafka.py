"""Hybrid retrieval end to end on the real broker: chunks -> embed worker (dense + BM25 in the same pass)
-> one point holding both vectors; a delete removes the point with both; a hybrid search finds the
exact-term chunk that dense search alone ranks below 10."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import isolated_settings, memory_store, wait_for

from embedstream.bench import hybrid_set
from embedstream.engine.engine import Engine
from embedstream.engine.errors import ConfigError
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent, DocumentDelete
from embedstream.schemas.rerank import SearchRequest
from embedstream.vectorstore import VectorSpec
from embedstream.workers.runtime import build_embed_worker
from embedstream.producers.query_client import QueryClient
from embedstream.workers.search import Searcher, kafka_embedder
from embedstream.workers.sink import point_id

from worker_rig import RunningWorker

pytestmark = pytest.mark.kafka


def _request(query: str, **kw) -> SearchRequest:
    return SearchRequest(request_id="r", query=query, reply_to="replies", rerank=False, top_k=10, top_n=10, **kw)


def test_dense_and_sparse_in_one_point_deleted_together_and_hybrid_finds_exact_terms(kafka_bootstrap):
    settings = isolated_settings(kafka_bootstrap, "hybrid")
    settings.sparse.kind = "bm25"
    settings.engine.threads = 1
    ensure_topics(settings.kafka, partitions=2)
    engine = Engine.from_name("all-MiniLM-L6-v2", settings)
    labelled = hybrid_set.build(chunks=400, known_items=0, exact=60, seed=3)
    store = memory_store()
    collection = settings.qdrant.collection
    with RunningWorker(settings, engine, store, lanes=("online", "bulk")):
        with ChunkPublisher(settings.kafka, lane="bulk") as pub:
            for i, text in enumerate(labelled.chunks):
                pub.publish_chunk(ChunkEvent(doc_id=f"c{i}", chunk_id=0, text=text))
        n = len(labelled.chunks)
        wait_for(lambda: store.collection_exists(collection) and store.count(collection) == n, 240, f"{n} points")
        # one point, both vectors, the sparse one as the engine computes it from the chunk
        points = {p.id: p for p in store.scroll(collection, with_vectors=True)}
        for i in (0, 1, n - 1):
            point = points[point_id(f"c{i}", 0)]
            assert set(point.vectors) == {"full", "sparse_bm25"}
            assert point.vectors["sparse_bm25"] == engine.sparse.encode_texts([labelled.chunks[i]], query=False)[0]

        searcher = Searcher(store, engine, None, collection)

        def rank(query: str, **kw) -> int | None:
            reply = searcher.search(_request(query, **kw))
            assert reply.error is None, reply.error
            ids = [h.doc_id for h in reply.hits]
            return ids.index(answer) + 1 if answer in ids else None

        missed_by_dense = []
        for query in labelled.of_kind("exact_term"):
            answer = f"c{query.answer}"
            if rank(query.text) is None:  # not in dense search's top 10
                missed_by_dense.append((query.text, answer))
        assert missed_by_dense, "every exact-term query was already in dense search's top 10"
        found = []
        for text, answer in missed_by_dense:
            if rank(text, mode="hybrid") is not None:
                found.append(text)
        assert len(found) >= 0.9 * len(missed_by_dense), (len(found), len(missed_by_dense))

        # the stages apart: the query's dense and sparse vectors come from the embed worker's one pass
        with QueryClient(settings.kafka) as client:
            remote = Searcher(store, kafka_embedder(client, timeout_s=30), None, collection)
            for text, _ in missed_by_dense[:3]:
                here, there = searcher.search(_request(text, mode="hybrid")), remote.search(_request(text, mode="hybrid"))
                assert there.error is None, there.error
                assert [h.id for h in there.hits] == [h.id for h in here.hits]

        # a delete removes the point, and with it both vectors: neither search finds the chunk again
        text, answer = missed_by_dense[0]
        with ChunkPublisher(settings.kafka, lane="bulk") as pub:
            pub.publish_delete(DocumentDelete(doc_id=answer))
        wait_for(lambda: store.count(collection) == n - 1, 60, "the delete")
        assert rank(text, mode="hybrid") is None
        assert answer not in [h.payload["doc_id"] for h in store.search(
            collection, "sparse_bm25", engine.sparse.encode_texts([text], query=True)[0], n)]


def test_a_collection_without_the_sparse_vector_is_refused_at_start(kafka_bootstrap):
    settings = isolated_settings(kafka_bootstrap, "hybrid-old")
    settings.sparse.kind = "bm25"
    store = memory_store()
    store.ensure_collection(settings.qdrant.collection, {"full": VectorSpec(384)})
    with pytest.raises(ConfigError, match="has no sparse_bm25 vector"):
        build_embed_worker(settings, ("bulk",), store=store)


def test_gateway_embed_sparse_and_info(kafka_bootstrap):
    """TEI's /embed_sparse through the online lane: the worker's own sparse vectors; /info names the sparse
    model; a worker without a sparse encoder refuses with a reason and its dense /embed still works."""
    import httpx

    from gateway_rig import background_gateway

    from embedstream.gateway import GatewayOptions

    texts = ["How do I call os.path.join?", "read_bytes returns the file's contents"]
    for kind in ("splade", "none"):
        settings = isolated_settings(kafka_bootstrap, f"gw-sparse-{kind}")
        settings.sparse.kind = kind
        settings.engine.threads = 1
        ensure_topics(settings.kafka, partitions=1)
        engine = Engine.from_name("all-MiniLM-L6-v2", settings)
        options = GatewayOptions(model="all-MiniLM-L6-v2")
        with RunningWorker(settings, engine, memory_store(), lanes=("online",)), \
                background_gateway(settings, options) as gateway, httpx.Client(base_url=gateway.url, timeout=60) as http:
            r = http.post("/embed_sparse", json={"inputs": texts})
            info = http.get("/info").json()
            if kind == "none":
                assert r.status_code >= 400 and "sparse" in r.text, r.text
                assert "sparse_model" not in info
                assert http.post("/embed", json={"inputs": texts}).status_code == 200
                continue
            assert r.status_code == 200, r.text
            expected = engine.sparse.encode_texts(texts, query=False)
            for got, want in zip(r.json(), expected):
                assert [t["index"] for t in got] == want.indices.tolist()
                np.testing.assert_allclose([t["value"] for t in got], want.values, atol=1e-5)
            assert info["sparse_model"] == {"kind": "splade", "model_id": "splade-tiny"}


def test_chunks_for_a_collection_without_the_sparse_vector_are_dead_lettered_and_the_rest_indexed(kafka_bootstrap):
    """A producer names another (allowed) collection created before sparse vectors were switched on: its
    chunks are refused with the reason, the chunks around them are indexed with both vectors."""
    from conftest import read_dead_letters

    settings = isolated_settings(kafka_bootstrap, "hybrid-mixed")
    settings.sparse.kind = "bm25"
    settings.engine.threads = 1
    settings.trust.collections = ["legacy"]
    ensure_topics(settings.kafka, partitions=1)
    engine = Engine.from_name("all-MiniLM-L6-v2", settings)
    store = memory_store()
    store.ensure_collection("legacy", {"full": VectorSpec(384)})
    collection = settings.qdrant.collection
    with RunningWorker(settings, engine, store, lanes=("bulk",)):
        with ChunkPublisher(settings.kafka, lane="bulk") as pub:
            for i in range(12):
                pub.publish_chunk(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"chunk {i} about sockets and files",
                                             collection="legacy" if i % 4 == 1 else None))
        wait_for(lambda: store.collection_exists(collection) and store.count(collection) == 9, 120, "9 good chunks")
        letters = read_dead_letters(settings, 3, timeout_s=60)
    assert len(letters) == 3 and all("sparse_bm25" in letter.error.message for letter in letters), letters
    assert store.count("legacy") == 0
    assert all(set(p.vectors) == {"full", "sparse_bm25"} for p in store.scroll(collection, with_vectors=True))
