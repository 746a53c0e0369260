"""A reply nobody acknowledges does not hold a lane: ``Lane.commit`` returns at once, commits the work that
finished, and keeps the unacknowledged reply's record uncommitted (on the real broker; the replies go to a
broker address nothing listens on, as to a partition whose leader died)."""

from __future__ import annotations

import shutil
import socket
import time

import pytest
from conftest import isolated_settings, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from embedstream.producers.topics import ensure_topics
from embedstream.schemas import QueryReply, QueryRequest
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.transport.lane import Lane
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.transport.outbox import Outbox

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(shutil.which("java") is None, reason="java not installed")]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on return: connections to it are refused


def test_commit_does_not_wait_for_a_reply_nobody_acknowledges(kafka_bootstrap):
    settings = isolated_settings(kafka_bootstrap, "settle")
    ensure_topics(settings.kafka, partitions=2)
    k = settings.kafka
    producer = KafkaProducer(**k.client_kwargs(), linger_ms=0)
    for partition in (0, 1):
        producer.send(k.topic_queries, value=b"{}", partition=partition)
    producer.flush()
    producer.close()
    away = k.model_copy(update={"bootstrap_servers": f"127.0.0.1:{_closed_port()}"})
    outbox = Outbox(away, "settle", WorkerMetrics())  # its sends are never acknowledged
    lane = Lane("online", k, [k.topic_queries], k.group_online, outbox, worker_id="settle", max_poll_records=16,
                librdkafka=True, flush_timeout_s=30.0)
    taken: list = []
    try:
        wait_for(lambda: (taken.extend(lane.poll(100)), len(taken) >= 2)[-1], 60, "both records fetched")
        records = {record.partition: record for record in taken}
        request = QueryRequest(request_id="r0", text="q", reply_to=k.topic_replies)
        lane.reply(records[0], request, QueryReply(request_id="r0", model="m"), lane.track(records[0]))
        OffsetTracker.done(lane.track(records[1]))  # partition 1's record finished (a sink write)
        started = time.monotonic()
        lane.commit()
        took = time.monotonic() - started
        assert took < 1.0, f"commit waited {took:.1f} s for an acknowledgement"  # it flushed up to 30 s
        group = KafkaConsumer(**k.client_kwargs(), group_id=k.group_online, enable_auto_commit=False)
        committed: dict = {}
        try:  # the online lane commits without waiting too: its result comes with a later poll
            wait_for(lambda: (lane.poll(50), committed.update(
                {p: group.committed(TopicPartition(k.topic_queries, p)) for p in (0, 1)}), committed[1] == 1)[-1],
                30, "partition 1's offset committed")
        finally:
            group.close()
        assert committed == {0: None, 1: 1}  # the finished record committed, the unacknowledged one not
        print(f"\ncommit with a reply unacknowledged returned in {took * 1000:.1f} ms; committed {committed}")
    finally:
        lane.consumer.close()
        outbox.live.producer.purge()
        outbox.producer.purge()
