"""Workers started before their topics exist (issue #13 item 4), on the real broker.

Reported: 4 of 12 fresh runs (embed worker twice, CDC bridge twice) never consumed anything when a
subscribed topic appeared while the group was joining; 0 of 8 with the topics created first. Each
round here starts the workers on a fresh namespace, creates the topics after a different delay
(during start-up, during the first join attempts, after them), and requires consumption.
"""

from __future__ import annotations

import time

import pytest
from conftest import isolated_settings, memory_store, wait_for
from kafka import KafkaProducer
from worker_rig import Running, RunningWorker

from embedstream.producers.chunker import Chunker
from embedstream.producers.query_client import QueryClient
from embedstream.producers.search_routing import query_topic
from embedstream.producers.topics import all_topics, ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.workers.cdc_bridge import CdcBridge, CdcOptions
from embedstream.workers.transport.rd_consumer import RdConsumer
from cdc_events import CONFIG, envelope, key, raw, row

pytestmark = pytest.mark.kafka

DELAYS_S = (0.0, 1.5, 4.0)  # topics created: at once, while the first join runs, after it gave up


@pytest.mark.timeout(600)
def test_the_embed_worker_consumes_topics_created_after_it_started(kafka_bootstrap, minilm_engine):
    for round_, delay in enumerate(DELAYS_S):
        settings = isolated_settings(kafka_bootstrap, f"late{round_}")
        store = memory_store()
        with RunningWorker(settings, minilm_engine, store, lanes=("online", "bulk")) as worker:
            time.sleep(delay)
            ensure_topics(settings.kafka, partitions=2)
            producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
            for i, topic in enumerate((settings.kafka.topic_chunks_online, settings.kafka.topic_chunks_bulk) * 2):
                producer.send(topic, key=f"d{i}".encode(),
                              value=encode(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"chunk {i} about files")))
            producer.close()
            wait_for(lambda: store.collection_exists("docs") and store.count("docs") == 4, 90,
                     f"round {round_} (topics after {delay} s): every chunk indexed")
            with QueryClient(settings.kafka) as client:
                assert client.embed("and queries?", timeout_s=60).error is None
            assert worker.failure is None


@pytest.mark.timeout(600)
def test_the_cdc_bridge_consumes_a_topic_created_after_it_started(kafka_bootstrap, minilm_engine):
    chunker = Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=40, overlap_tokens=0)
    for round_, delay in enumerate(DELAYS_S):
        settings = isolated_settings(kafka_bootstrap, f"latecdc{round_}")
        settings.kafka.group_cdc = f"{settings.kafka.group_online}-cdc"
        source = f"{settings.kafka.topic_chunks_online}.cdc"
        bridge = CdcBridge(settings, chunker, CdcOptions(source, CONFIG))
        with Running(bridge):
            time.sleep(delay)
            ensure_topics(settings.kafka, partitions=2, topics=[source, *all_topics(settings.kafka)])
            producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
            for i in range(3):
                producer.send(source, key=raw(key(i)), value=raw(envelope("c", after=row(i, f"title {i}", "a body"))))
            producer.close()
            wait_for(lambda: bridge.metrics.events.labels(op="c")._value.get() == 3, 90,
                     f"round {round_} (topic after {delay} s): every change applied")
            assert bridge.failure is None
            assert isinstance(bridge.lane.consumer, RdConsumer)  # the CDC lane: librdkafka by default (issue #41)


@pytest.mark.timeout(300)
def test_an_online_worker_creates_its_topics_and_answers_on_a_fresh_namespace(kafka_bootstrap, minilm_engine):
    """Issue #29: `worker embed --lanes online` then the gateway on a fresh broker answered nothing: nobody made
    the online chunk topic, and the lane waited for it before serving the queries topic it had."""
    settings = isolated_settings(kafka_bootstrap, "fresh")
    store = memory_store()
    with RunningWorker(settings, minilm_engine, store, lanes=("online",)) as worker:
        with QueryClient(settings.kafka) as client:
            assert client.embed("a first question", timeout_s=60).error is None
        lane = worker.lanes["online"]
        assert lane.missing == [] and worker.readiness_details() == {}
        assert set(lane.subscribed) == {settings.kafka.topic_queries, settings.kafka.topic_chunks_online,
                                        query_topic(settings.kafka, settings.qdrant.collection)}  # its searches' queries


@pytest.mark.timeout(300)
def test_a_lane_not_allowed_to_create_serves_the_topics_that_exist_and_picks_up_the_others(kafka_bootstrap,
                                                                                            minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "nocreate")
    settings.kafka.create_topics = False
    ensure_topics(settings.kafka, partitions=2, topics=[settings.kafka.topic_queries, settings.kafka.topic_replies,
                                                        settings.kafka.topic_dead_letters,
                                                        query_topic(settings.kafka, settings.qdrant.collection)])
    store = memory_store()
    with RunningWorker(settings, minilm_engine, store, lanes=("online",)) as worker:
        with QueryClient(settings.kafka) as client:
            assert client.embed("served while the chunk topic is missing", timeout_s=60).error is None
        assert worker.readiness_details() == {"missing_topics": {"online": [settings.kafka.topic_chunks_online]}}
        assert worker.readiness_checks()["topics"]() is False
        ensure_topics(settings.kafka, partitions=2, topics=[settings.kafka.topic_chunks_online])
        producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
        producer.send(settings.kafka.topic_chunks_online, key=b"d",
                      value=encode(ChunkEvent(doc_id="d", chunk_id=0, text="a chunk on a late topic")))
        producer.close()
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == 1, 90, "the late topic's chunk")
        assert worker.readiness_details() == {} and worker.readiness_checks()["topics"]()
        with QueryClient(settings.kafka) as client:
            assert client.embed("and still served after the re-subscription", timeout_s=60).error is None
        assert worker.failure is None
