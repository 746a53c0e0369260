"""The embed workers' search lane (issue #29): search without a cross-encoder, rerank only when a reranker
runs and the request asks. Real broker, MiniLM embed worker, the tiny cross-encoder as the reranker."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import isolated_settings, make_engine, memory_store, wait_for
from kafka import KafkaProducer
from worker_rig import Running, RunningWorker

from embedstream.producers.query_client import QueryClient
from embedstream.producers.search_routing import route
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.schemas.events import now_ms
from embedstream.schemas.rerank import SearchReply, SearchRequest
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.rerank_worker import RerankOptions, RerankWorker
from embedstream.workers.search import Searcher
from embedstream.workers.vector_search import RERANKERS_TTL_S, VectorSearchWorker

pytestmark = pytest.mark.kafka

TEXTS = {"files": "To read a file line by line, iterate over the file object returned by open().",
         "sorting": "list.sort() sorts in place; sorted() returns a new list; both take a key function.",
         "threads": "A daemon thread does not keep the interpreter alive when the program exits."}


def _search(client, settings, query: str, rerank: bool) -> SearchReply:
    sent = now_ms()
    request = SearchRequest(request_id=uuid.uuid4().hex, query=query, top_k=3, top_n=3, rerank=rerank,
                            reply_to=client.reply_topic, deadline_ms=sent + 30_000, sent_at_ms=sent)
    topic, request = route(settings.kafka, settings.qdrant.collection, request)  # to the owner of "docs"
    return client.request(topic, request, SearchReply, timeout_s=30)


@pytest.mark.timeout(400)
def test_the_embed_workers_search_and_leave_reranking_to_a_running_reranker(kafka_bootstrap, minilm_engine, tiny_ce_dir):
    settings = isolated_settings(kafka_bootstrap, "vsearch")
    store = memory_store()
    ce = make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank")
    with RunningWorker(settings, minilm_engine, store, lanes=("online",)) as worker, \
            Running(VectorSearchWorker(settings, store, minilm_engine.spec.name, WorkerMetrics())) as searcher:
        producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
        for doc_id, text in TEXTS.items():
            producer.send(settings.kafka.topic_chunks_online, key=doc_id.encode(),
                          value=encode(ChunkEvent(doc_id=doc_id, chunk_id=0, text=text)))
        producer.close()
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == 3, 90, "chunks indexed")
        with QueryClient(settings.kafka) as client:
            plain = _search(client, settings, "how do I sort a list?", rerank=False)
            assert plain.error is None and plain.hits[0].doc_id == "sorting" and plain.model is None
            assert plain.hits[0].rerank_score is None and {"embed", "search"} <= set(plain.timings_ms)
            asked = _search(client, settings, "interpreter exit and daemon threads", rerank=True)  # no reranker
            assert asked.error is None and asked.hits[0].doc_id == "threads" and asked.model is None

            rerank = RerankWorker(settings, ce, RerankOptions.from_settings(settings),
                                  searcher=Searcher(store, minilm_engine, ce, "docs"))
            with Running(rerank):
                wait_for(lambda: rerank.lane.joined(), 60, "the rerank worker joined")
                time.sleep(RERANKERS_TTL_S + 0.5)  # the embed workers' view of the rerank group refreshed
                reranked = _search(client, settings, "how do I read a file?", rerank=True)
                assert reranked.error is None and reranked.model == "tiny-ce"
                assert all(hit.rerank_score is not None for hit in reranked.hits)
        assert worker.failure is None and searcher.failure is None
