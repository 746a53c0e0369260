"""End to end on the real broker: producers -> embed worker -> Qdrant, request-reply, dead letters."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from embedstream.corpus import documents
from embedstream.engine.engine import EmbedRequest
from embedstream.producers.chunker import Chunker
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import ensure_topics
from embedstream.producers.query_client import QueryClient
from embedstream.schemas import ChunkEvent, QueryReply, QueryRequest
from embedstream.schemas.codec import encode
from embedstream.workers.sink import point_id

from worker_rig import RunningWorker

pytestmark = pytest.mark.kafka




def test_chunks_are_indexed_once_and_queries_answered(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "e2e")
    ensure_topics(settings.kafka, partitions=4)
    store = memory_store()
    chunker = Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=120, overlap_tokens=16)
    docs = documents(30, seed=5)
    expected: dict[str, str] = {}
    with ChunkPublisher(settings.kafka, lane="bulk") as pub:
        for doc in docs:
            for i, text in enumerate(chunker.chunk(doc["text"])):
                expected[point_id(doc["doc_id"], i)] = text
            pub.publish_document(doc, chunker)
    n = len(expected)
    assert n > 60
    collection = settings.qdrant.collection
    with RunningWorker(settings, minilm_engine, store):
        wait_for(lambda: store.collection_exists(collection) and store.count(collection) == n, 240, f"{n} points")
        points = {p.id: p for p in store.scroll(collection)}
        assert set(points) == set(expected)
        sample = next(iter(points.values()))
        assert {"doc_id", "chunk_id", "content_hash", "source", "n"} <= set(sample.payload)
        assert sample.payload["text"] == expected[sample.id]
        assert sample.payload["source"]["topic"] == settings.kafka.topic_chunks_bulk
        # producing the same chunks again leaves exactly N points
        with ChunkPublisher(settings.kafka, lane="online") as pub:
            for doc in docs[:5]:
                pub.publish_document(doc, chunker)
        time.sleep(3)
        assert store.count(collection) == n
        # request-reply: the vector equals the engine's
        with QueryClient(settings.kafka) as client:
            reply = client.embed("how do I open a file for reading?", timeout_s=30)
            assert reply.error is None and reply.dims == 384
            assert {"queue_wait", "tokenize_ms", "forward_ms", "total"} <= set(reply.timings_ms)
            (ref,), _ = minilm_engine.embed([EmbedRequest(0, "how do I open a file for reading?", prompt="query")])
            assert float(np.dot(np.array(reply.embedding), ref.vector.values)) >= 0.9999
            bad = client.embed("", timeout_s=30)
            assert bad.error is not None and bad.error.code == "empty_text"
            other = client.embed("x", model="no-such-model", timeout_s=30)
            assert other.error.code == "unknown_model"


def test_bad_events_are_dead_lettered_and_good_ones_indexed(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "dlq")
    settings.kafka.max_record_bytes = 20_000
    ensure_topics(settings.kafka, partitions=2)
    store = memory_store()
    topic = settings.kafka.topic_chunks_bulk
    good = [ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"good chunk number {i} about files") for i in range(20)]
    poison = [
        b"{not json",
        json.dumps({"schema_version": 9, "kind": "chunk", "doc_id": "x", "chunk_id": 0, "text": "t"}).encode(),
        json.dumps({"schema_version": 1, "kind": "chunk", "chunk_id": 0, "text": "no doc id"}).encode(),
        encode(ChunkEvent(doc_id="long", chunk_id=0, text="word " * 600)),
        encode(ChunkEvent(doc_id="model", chunk_id=0, text="fine text", model="no-such-model")),
        encode(ChunkEvent(doc_id="huge", chunk_id=0, text="x" * 30_000)),
    ]
    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
    values = [encode(e) for e in good]
    for i, bad in enumerate(poison):  # interleave poison between good events
        values.insert(4 * i + 2, bad)
    for v in values:
        producer.send(topic, key=b"k", value=v)
    producer.flush()
    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)) as worker:
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(good), 120, "good events indexed")
        letters = read_dead_letters(settings, len(poison))
        wait_for(lambda: worker.lanes["bulk"].offsets.outstanding() == 0, 30, "all records finished")
    codes = sorted(letter.error.code for letter in letters)
    assert codes == sorted(["malformed_json", "unknown_schema_version", "invalid_event", "too_long", "unknown_model",
                            "record_too_large"])
    assert all(letter.error.message for letter in letters)
    assert {letter.raw_bytes() for letter in letters} == set(poison)
    # everything was finished, so the group's committed offset is the log end
    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=settings.kafka.group_bulk, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    committed = sum((consumer.committed(TopicPartition(topic, p)) or 0) for p in consumer.partitions_for_topic(topic))
    consumer.close()
    assert committed == len(values)


def test_online_window_holds_bursts_but_not_a_lone_query(kafka_bootstrap, minilm_engine):
    """A 300 ms window: a query after a quiet spell is not held for it; a burst shares passes."""
    settings = isolated_settings(kafka_bootstrap, "window")
    settings.worker.batch_window_ms = 300
    ensure_topics(settings.kafka, partitions=2)
    with QueryClient(settings.kafka) as client, RunningWorker(settings, minilm_engine, memory_store(), lanes=("online",)) as worker:
        wait_for(lambda: worker.ready.is_set(), 120, "worker ready")
        client.embed("warm the partitions up", timeout_s=60)
        time.sleep(0.5)  # a quiet spell: the next query arrives alone
        lone = client.embed("how do I open a file for reading?", timeout_s=30)
        assert lone.error is None
        assert lone.timings_ms["queue_wait"] < 150, lone.timings_ms  # not held for the 300 ms window

        sample = worker.metrics.registry.get_sample_value
        passes_before = sample("embedstream_batch_size_count", {"lane": "online"})
        futures = [client.submit(settings.kafka.topic_queries, _query(client, f"question number {k}"), QueryReply, timeout_s=60)
                   for k in range(8)]
        replies = [f.result(timeout=60) for f in futures]
        assert all(r.error is None and r.dims == 384 for r in replies)
        passes = sample("embedstream_batch_size_count", {"lane": "online"}) - passes_before
        assert passes < 8  # the burst was batched: at least two queries shared a forward pass


def _query(client, text: str) -> QueryRequest:
    return QueryRequest(request_id=uuid.uuid4().hex, text=text, reply_to=client.reply_topic, prompt="query")
