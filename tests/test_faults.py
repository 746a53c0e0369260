"""Fault tolerance on the real broker: Qdrant outages and poison streams lose nothing.

Each test ends with an exact count of points and ids in the store, and checks committed offsets.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from test_pipeline_kafka import RunningWorker

from producers.publisher import ensure_topics
from schemas import ChunkEvent
from schemas.codec import encode
from workers.sink import point_id

pytestmark = pytest.mark.kafka


class FlakyStore:
    """The real in-memory store, except that writes fail while ``down`` is set (an outage)."""

    def __init__(self, store):
        self.store = store
        self.down = False
        self.failed_writes = 0

    def upsert(self, *args, **kwargs):
        if self.down:
            self.failed_writes += 1
            raise ConnectionError("qdrant unavailable (simulated outage)")
        return self.store.upsert(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _committed(settings, topic: str, group: str) -> int:
    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
    total = sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in consumer.partitions_for_topic(topic))
    consumer.close()
    return total


def _publish(settings, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all", linger_ms=5)
    for i, value in enumerate(values):
        producer.send(topic, key=f"k{i % 17}".encode(), value=value)
    producer.flush()
    producer.close()


def test_qdrant_outage_stops_commits_then_resumes_without_loss(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "outage")
    ensure_topics(settings.kafka, partitions=2)
    topic = settings.kafka.topic_chunks_bulk
    events = [ChunkEvent(doc_id=f"doc{i // 3}", chunk_id=i % 3, text=f"chunk {i} on reading files") for i in range(120)]
    _publish(settings, topic, [encode(e) for e in events])
    store = FlakyStore(memory_store())
    store.down = True
    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)) as worker:
        worker.options.sink_backoff_s = (0.1, 0.5)
        wait_for(lambda: store.failed_writes >= 3, 120, "failed writes during the outage")
        assert _committed(settings, topic, settings.kafka.group_bulk) == 0  # nothing done, nothing committed
        assert worker.metrics.sink_failures._value.get() >= 3
        store.down = False
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(events), 120, "all points")
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(events), 60, "offsets committed")
    assert {p.id for p in store.scroll("docs")} == {point_id(e.doc_id, e.chunk_id) for e in events}


@pytest.mark.slow
def test_one_percent_poison_in_ten_thousand_events(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "poison")
    ensure_topics(settings.kafka, partitions=4)
    topic = settings.kafka.topic_chunks_bulk
    values, good_ids, poison = [], set(), 0
    for i in range(10_000):
        if i % 100 == 37:
            kind = poison % 3
            values.append([b"{broken json",
                           json.dumps({"schema_version": 1, "kind": "chunk", "chunk_id": 0, "text": "no doc"}).encode(),
                           encode(ChunkEvent(doc_id=f"p{i}", chunk_id=0, text="  "))][kind])
            poison += 1
        else:
            values.append(encode(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"note {i}: open the file")))
            good_ids.add(point_id(f"d{i}", 0))
    _publish(settings, topic, values)
    store = memory_store()
    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)):
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(good_ids), 600, "good events")
        letters = read_dead_letters(settings, poison, timeout_s=60)
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(values), 60, "offsets committed")
    assert poison == 100 and len(letters) == poison
    assert {l.error.code for l in letters} == {"malformed_json", "invalid_event", "empty_text"}
    assert {p.id for p in store.scroll("docs")} == good_ids
