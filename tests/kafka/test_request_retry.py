"""Request-reply through lost records on the real broker: an idempotent request with no reply is sent again
within its deadline, duplicate replies are harmless, requests and replies are unkeyed and spread over the
partitions whose leaders answer, and a client's own reply topic lives as long as the client."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections import Counter, deque

import kafka
import pytest
from confluent_kafka import Producer

from embedstream.config import KafkaSettings
from embedstream.producers.live_partitions import LiveSender, live_producer
from embedstream.producers.query_client import QueryClient
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import QueryReply, QueryRequest, decode, encode

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(shutil.which("java") is None, reason="java not installed")]


@pytest.fixture
def settings(kafka_bootstrap) -> KafkaSettings:
    from conftest import isolated_settings

    found = isolated_settings(kafka_bootstrap, "retry").kafka
    ensure_topics(found, partitions=4)
    return found


class Responder:
    """Plays the embed workers: each request copy seen is counted by request_id; ``drop_first`` leaves the first
    copy of each unanswered (a request lost with its leader), ``twice`` answers every copy twice."""

    def __init__(self, settings: KafkaSettings, drop_first: bool = False, twice: bool = False):
        self.settings, self.drop_first, self.twice = settings, drop_first, twice
        self.copies: Counter[str] = Counter()
        self.keys: list[bytes | None] = []
        self.partitions: Counter[int] = Counter()
        self.consumer = kafka.KafkaConsumer(**settings.client_kwargs(), group_id=None, fetch_max_wait_ms=50)
        self.consumer.assign([kafka.TopicPartition(settings.topic_queries, p)
                              for p in self.consumer.partitions_for_topic(settings.topic_queries)])
        self.consumer.seek_to_end()
        for tp in self.consumer.assignment():
            self.consumer.position(tp)  # resolved now: requests sent from here on are all seen
        self.producer = Producer(settings.librdkafka_config(**{"linger.ms": 0, "allow.auto.create.topics": False}))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            for batch in self.consumer.poll(timeout_ms=50).values():
                for record in batch:
                    request = decode(record.value, QueryRequest)
                    self.copies[request.request_id] += 1
                    self.keys.append(record.key)
                    self.partitions[record.partition] += 1
                    if self.drop_first and self.copies[request.request_id] == 1:
                        continue
                    for _ in range(2 if self.twice else 1):
                        reply = QueryReply(request_id=request.request_id, embedding=[float(len(request.text))], dims=1,
                                           model="echo")
                        self.producer.produce(request.reply_to, value=encode(reply))
            self.producer.poll(0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.producer.flush(5)
        self.consumer.close()


def test_a_request_lost_once_is_answered_by_its_retry_within_its_deadline(settings):
    responder = Responder(settings, drop_first=True)
    try:
        with QueryClient(settings, retry_after_s=0.3) as client:
            started = time.monotonic()
            reply = client.embed("lost once", timeout_s=10)
            took = time.monotonic() - started
            assert reply.error is None and reply.embedding == [9.0]
            assert 0.3 <= took < 5.0, took  # the retry after 0.3 s, not the 10 s deadline
            assert client.retries >= 1
            request = QueryRequest(request_id=uuid.uuid4().hex, text="not idempotent", reply_to=client.reply_topic)
            with pytest.raises(TimeoutError):  # retry=False: its one copy was dropped, nothing comes
                client.submit(settings.topic_queries, request, QueryReply, timeout_s=1.5, retry=False).result(5)
        print(f"\nanswered by the retry after {took * 1000:.0f} ms; {client.retries} sent again")
    finally:
        responder.close()
    assert set(responder.keys) == {None}  # unkeyed: the request_id travels in the value


def test_duplicate_replies_are_harmless_and_requests_spread_over_partitions(settings):
    responder = Responder(settings, twice=True)
    try:
        with QueryClient(settings) as client:
            texts = [f"text {'x' * i}" for i in range(40)]
            replies = [client.embed(text, timeout_s=10) for text in texts]
            assert [r.embedding for r in replies] == [[float(len(t))] for t in texts]
            assert client.retries == 0  # answered in time: no copy sent again
    finally:
        responder.close()
    assert len(responder.partitions) >= 2, responder.partitions  # not pinned to one partition


def test_live_sender_leaves_a_partition_with_a_stuck_record_alone_until_it_is_acknowledged(settings):
    producer = live_producer(settings, "test-live-sender", 10.0)
    sender = LiveSender(producer, stuck_s=0.2)
    topic = settings.topic_replies
    acked: list[int] = []
    used = Counter(sender.send(topic, b"v", lambda err, msg: acked.append(msg.partition())) for _ in range(200))
    assert producer.flush(10) == 0 and len(acked) == 200
    assert set(used) == {0, 1, 2, 3} and sender.stuck(topic) == []
    sender._waiting[(topic, 2)] = deque([time.monotonic() - 1.0])  # a record partition 2's leader never acknowledged
    assert sender.stuck(topic) == [2]
    used = Counter(sender.send(topic, b"v", lambda err, msg: None) for _ in range(200))
    assert 2 not in used and set(used) == {0, 1, 3}
    sender._acknowledged(topic, 2)  # its leader (a new one) acknowledged it: the partition is used again
    assert sender.stuck(topic) == []
    producer.flush(10)


def test_own_reply_topic_is_made_at_start_and_deleted_at_close(settings):
    responder = Responder(settings)
    admin = kafka.KafkaAdminClient(**settings.client_kwargs())
    try:
        client = QueryClient(settings, own_reply_topic="gw-a")
        try:
            assert client.reply_topic == f"{settings.topic_replies}.gw-a"
            assert client.reply_topic in admin.list_topics()
            assert client.embed("mine", timeout_s=10).embedding == [4.0]
        finally:
            client.close()
        deadline = time.monotonic() + 30
        while client.reply_topic in admin.list_topics() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.reply_topic not in admin.list_topics()
    finally:
        admin.close()
        responder.close()
