"""Requests and replies sent where a leader answers: unkeyed records, each put on a partition of its topic whose
earlier records are being acknowledged.

Requests and replies are correlated by the ``request_id`` in their value, not by a key, so nothing pins one to
a partition. librdkafka's own choice for a record without a key (its sticky partitioner) is no help when a
broker dies: it skips a partition only when the metadata names no leader for it, and a ``kill -9``'d leader
stays named until the controller fences it (``broker.session.timeout.ms``, 9 s by default), so a third or more
of the records would wait out the fence. Here the partition is picked by the sender: at random among those with
no record waiting for its acknowledgement longer than ``stuck_s`` (their leader is gone, or cut off); when every
partition is stuck, among all of them. A partition comes back once its waiting records are acknowledged (a
new leader took it). ``acks=1`` (the leader's write), not idempotent: an acknowledgement then says the leader
answers, and a follower that died does not hold it back (with ``acks=all`` every partition that has the dead
node in sync waits for the fence, and all would read as stuck). A request or reply the leader loses with it
is sent again by the client (``QueryClient`` retries idempotent requests); duplicates are harmless, the
client keeps the first reply.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque

from confluent_kafka import Producer

from embedstream.config import KafkaSettings

STUCK_S = 0.5  # a record unacknowledged this long marks its partition's leader as not answering
_METADATA_TTL_S = 60.0  # how long a topic's partition count is trusted (a grown topic is used within this)


def live_producer(settings: KafkaSettings, client_id: str, message_timeout_s: float, **extra) -> Producer:
    """A producer for requests and replies: the leader's acknowledgement only (see the module docstring)."""
    return Producer(settings.librdkafka_config(**extra, **{
        "client.id": client_id, "acks": 1, "enable.idempotence": False, "linger.ms": 0,
        # a reply topic deleted by its client (``QueryClient.close``) must not be made again by a broker that
        # creates topics on a metadata request: this producer's periodic one would
        "allow.auto.create.topics": False,
        "message.timeout.ms": int(message_timeout_s * 1000)}))


class LiveSender:
    """Sends unkeyed records through ``producer`` to partitions whose leaders acknowledge. Thread-safe.

    Delivery reports run where the producer is polled (the caller's loop); ``send`` serves the ones due."""

    def __init__(self, producer: Producer, stuck_s: float = STUCK_S, metadata_timeout_s: float = 5.0,
                 refresh_inline: bool = True):
        self.producer = producer
        self.refresh_inline = refresh_inline  # False: a known count is refreshed by ``refresh`` (another thread)
        self.stuck_s = stuck_s
        self.metadata_timeout_s = metadata_timeout_s
        self._waiting: dict[tuple[str, int], deque[float]] = {}  # send times of unacknowledged records
        self._partitions: dict[str, tuple[int, float]] = {}  # topic -> (partition count, when learned)
        self._lock = threading.Lock()

    def send(self, topic: str, value: bytes, on_delivery, headers=None) -> int:
        """Queue ``value`` on a live partition of ``topic`` (-1: unknown partitions, librdkafka picks); returns it.

        Raises what ``Producer.produce`` raises (``BufferError`` when librdkafka's queue is full,
        ``KafkaException`` for a topic it refuses)."""
        self.producer.poll(0)  # acknowledgements due: a healthy partition must not read as stuck
        partition = self.pick(topic)

        def delivered(error, message) -> None:
            self._acknowledged(topic, partition)
            on_delivery(error, message)

        with self._lock:
            if partition >= 0:
                self._waiting.setdefault((topic, partition), deque()).append(time.monotonic())
        try:
            self.producer.produce(topic, value=value, partition=partition, on_delivery=delivered,
                                  **({"headers": headers} if headers else {}))
        except BaseException:
            self._acknowledged(topic, partition)
            raise
        return partition

    def pick(self, topic: str) -> int:
        count = self._count(topic)
        if count <= 0:
            return -1
        now = time.monotonic()
        with self._lock:
            live = [p for p in range(count) if not self._stuck((topic, p), now)]
        return random.choice(live or range(count))

    def stuck(self, topic: str) -> list[int]:
        """The partitions of ``topic`` now avoided (a record waiting longer than ``stuck_s``)."""
        now = time.monotonic()
        with self._lock:
            return sorted(p for (t, p) in self._waiting if t == topic and self._stuck((t, p), now))

    def _stuck(self, key: tuple[str, int], now: float) -> bool:
        waiting = self._waiting.get(key)
        return bool(waiting) and now - waiting[0] > self.stuck_s

    def _acknowledged(self, topic: str, partition: int) -> None:
        """A record's report (delivered or failed): its partition waits for one record less (oldest first:
        librdkafka reports a partition's records in order)."""
        if partition < 0:
            return
        with self._lock:
            waiting = self._waiting.get((topic, partition))
            if waiting:
                waiting.popleft()

    def _count(self, topic: str) -> int:
        """The topic's partition count from the producer's metadata, learned once a minute (0: unknown)."""
        known = self._partitions.get(topic)
        now = time.monotonic()
        if known is not None and (now - known[1] < _METADATA_TTL_S or (known[0] and not self.refresh_inline)):
            return known[0]
        return self._learn(topic, known, now)

    def refresh(self) -> None:
        """Learn again the partition counts older than a minute (a sender whose ``send`` must never wait)."""
        now = time.monotonic()
        for topic, known in list(self._partitions.items()):
            if now - known[1] >= _METADATA_TTL_S:
                self._learn(topic, known, now)

    def _learn(self, topic: str, known: tuple[int, float] | None, now: float) -> int:
        try:
            found = self.producer.list_topics(topic, timeout=self.metadata_timeout_s).topics.get(topic)
            count = len(found.partitions) if found is not None and found.error is None else 0
        except Exception:  # noqa: BLE001 - no metadata now: keep what was known, else let librdkafka pick
            count = 0
        if count:
            self._partitions[topic] = (count, now)
            return count
        count = known[0] if known else 0  # not learned now: ask again in a second (a topic being made) or five
        self._partitions[topic] = (count, now - _METADATA_TTL_S + (5.0 if count else 1.0))
        return count
