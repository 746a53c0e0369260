"""The online lanes' librdkafka consumer (``RdConsumer``) on the real broker: what a lane relies on.

Pausing (a full queue) loses and repeats nothing; a second member joining takes partitions over from the
first's committed offsets and, between them, every record is finished exactly once; the lag it reports
is the records behind the log end."""

from __future__ import annotations

import shutil
import time

import pytest
from conftest import isolated_settings, wait_for
from kafka import KafkaProducer

from embedstream.producers.topics import ensure_topics
from embedstream.workers.transport.lane import Lane
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.transport.outbox import Outbox
from embedstream.workers.transport.rd_consumer import RdConsumer

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(shutil.which("java") is None, reason="java not installed"),
]


def _produce(settings, topic: str, count: int, partitions: int = 1) -> None:
    producer = KafkaProducer(**settings.kafka.client_kwargs(), linger_ms=0)
    for i in range(count):
        producer.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), partition=i % partitions,
                      headers=[("n", str(i).encode())] if i % 2 else None)
    producer.flush()
    producer.close()


def _lane(settings, name: str, topic: str, metrics) -> Lane:
    outbox = Outbox(settings.kafka, name, metrics)
    return Lane(name, settings.kafka, [topic], settings.kafka.group_online, outbox, worker_id=name,
                max_poll_records=16, librdkafka=True)


def _one_partition_lane(bootstrap: str, name: str, records: int) -> Lane:
    """A librdkafka lane on a fresh one-partition topic holding ``records`` records."""
    settings = isolated_settings(bootstrap, name)
    ensure_topics(settings.kafka, partitions=1)
    _produce(settings, settings.kafka.topic_queries, records)
    return _lane(settings, "online", settings.kafka.topic_queries, WorkerMetrics())


def test_pause_and_resume_lose_and_repeat_nothing(kafka_bootstrap):
    lane = _one_partition_lane(kafka_bootstrap, "rdpause", 120)
    assert isinstance(lane.consumer, RdConsumer)
    seen: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while len(seen) < 120 and time.monotonic() < deadline:
            records = lane.poll(100)
            seen += [(r.offset, r.value) for r in records]
            assert all(r.headers == ([("n", str(r.offset).encode())] if r.offset % 2 else []) for r in records)
            if records:  # a full queue after each batch: paused, polled (nothing comes), resumed
                held = lane.hold()
                assert held and all(not lane.poll(20) for _ in range(3))
                lane.release(held)
        assert seen == [(i, f"v{i}".encode()) for i in range(120)]
    finally:
        lane.consumer.close()


def test_a_second_member_takes_over_committed_work_and_every_record_finishes_once(kafka_bootstrap):
    settings = isolated_settings(kafka_bootstrap, "rdrebalance")
    ensure_topics(settings.kafka, partitions=4)
    topic = settings.kafka.topic_queries
    _produce(settings, topic, 400, partitions=4)
    metrics = WorkerMetrics()
    first = _lane(settings, "first", topic, metrics)
    finished: list[tuple[int, int, bytes]] = []

    def step(lane: Lane) -> None:
        for record in lane.poll(100):
            OffsetTracker.done(lane.track(record))
            finished.append((record.partition, record.offset, record.value))
        lane.commit()

    second = None
    try:
        wait_for(lambda: (step(first), len(finished) >= 100)[-1], 60, "the first member finishes 100 records")
        assert first.joined()
        second = _lane(settings, "second", topic, metrics)
        # the second member's share arrives with the group's next heartbeats (KIP-848: the broker assigns), maybe
        # after the first finished everything: wait for both, each member holding partitions of its own
        wait_for(lambda: (step(first), step(second), len(finished) >= 400 and second.joined()
                          and bool(first.consumer.assignment()) and bool(second.consumer.assignment())
                          and first.record_lag(metrics) == 0 and second.record_lag(metrics) == 0)[-1],
                 90, "all 400 finished, the partitions shared by the two members")
        assert second.joined() and first.consumer.assignment() and second.consumer.assignment()
        assert not first.consumer.assignment() & second.consumer.assignment()
    finally:
        for lane in (first, second):
            if lane is not None:
                lane.close()
    keys = [(p, o) for p, o, _ in finished]
    assert len(keys) == len(set(keys)) == 400  # none lost, none finished twice
    expected = {(i % 4, i // 4): f"v{i}".encode() for i in range(400)}
    assert {(p, o): v for p, o, v in finished} == expected


def test_lag_counts_the_records_behind_the_log_end(kafka_bootstrap):
    lane = _one_partition_lane(kafka_bootstrap, "rdlag", 50)
    try:
        taken: list = []
        wait_for(lambda: (taken.extend(lane.poll(100)), len(taken) >= 16)[-1], 60, "a first batch")
        lane.consumer.max_poll_records = 1
        taken += lane.poll(100)
        assert lane.record_lag(WorkerMetrics()) == 50 - len(taken)
    finally:
        lane.consumer.close()
