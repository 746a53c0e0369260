"""A lane: one consumer group's work inside a worker, from fetch to commit.

A lane owns its consumer, a bounded queue of decoded work, the offsets that may be committed, the
pause/resume backpressure on that queue, and what a rebalance does to them (finished work is
committed, queued work of revoked partitions is dropped: the new owner gets it redelivered). The
embed worker runs one lane per consumer group (online, bulk); the rerank worker and the CDC bridge
run one each. Records leave a lane as written results, replies or dead letters, never silently.
Only the thread that owns the consumer polls, pauses, commits and handles rebalances; a staged
worker's other threads reach a lane only through its ``SyncQueue`` and the outbox.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.producers.topics import TopicsError, ensure_topics, is_project_topic
from embedstream.schemas import ErrorInfo
from embedstream.vectorstore.faults import store_fault
from embedstream.workers.transport.kafka_io import (broker_reachable, commit_finished, group_joined, missing_topics,
                                                    new_consumer, subscribe)
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.transport.outbox import Outbox
from embedstream.workers.transport.rd_consumer import RdConsumer
from embedstream.workers.scheduler import WorkQueue

log = logs.get("embedstream.worker")


@dataclass
class Taken:
    """A record taken from a lane: where it came from, and the handle that finishes its offset."""

    lane: str  # the metrics label (the rerank worker's one lane serves "rerank" and "search")
    record: Any  # the Kafka record, kept for its dead letter
    handle: list

    @property
    def topic(self) -> str:
        return self.record.topic

    @property
    def partition(self) -> int:
        return self.record.partition

    @property
    def offset(self) -> int:
        return self.record.offset


class SyncQueue(WorkQueue):
    """A lane queue shared by two threads: intake pushes (and drops revoked work), the model stage takes.

    Every change happens under one condition, shared by all lanes of a worker, so a batch can be
    formed from both lanes at once; each push and take notifies the waiters (the model stage waiting
    for work, the intake waiting for room)."""

    def __init__(self, cond: threading.Condition):
        super().__init__()
        self.cond = cond
        self.pushed = 0  # items ever pushed: "how many arrived while I waited"

    def push(self, item) -> None:
        self.push_many([item])

    def push_many(self, items: list) -> None:
        with self.cond:
            for item in items:
                super().push(item)
            self.pushed += len(items)
            self.cond.notify_all()

    def take(self, count: int) -> list:
        with self.cond:
            taken = super().take(count)
            self.cond.notify_all()
            return taken

    def keep(self, wanted: Callable) -> None:
        with self.cond:
            super().keep(wanted)

    def lengths(self) -> list[int]:
        with self.cond:
            return super().lengths()


class Lane:
    """Consumer + queue + offsets + backpressure + revocation handling of one consumer group."""

    def __init__(self, name: str, kafka: KafkaSettings, topics: list[str], group: str, outbox: Outbox, *,
                 worker_id: str, max_poll_records: int, full: Callable[[WorkQueue], bool] = lambda _q: False,
                 flush_timeout_s: float = 30.0, queue: WorkQueue | None = None,
                 on_revoke: Callable[[set], None] | None = None, librdkafka: bool = True, **consumer_extra):
        self.name = name
        self.topics = topics
        self.outbox = outbox
        self.queue: WorkQueue = queue if queue is not None else WorkQueue()
        self.on_revoke = on_revoke  # called first on revocation (a staged worker lets in-flight writes finish)
        self.offsets = OffsetTracker()
        self.paused = False
        self._full = full
        self.flush_timeout_s = flush_timeout_s
        self.kafka = kafka
        make = RdConsumer if librdkafka else new_consumer  # kafka-python: a choice (``KafkaSettings.*_client``)
        self.consumer = make(kafka, group, f"embedstream-{name}-{worker_id}", max_poll_records, **consumer_extra)
        self.subscribed_at: float | None = None  # set on the first subscription (to the topics that exist)
        self.subscribed: list[str] = []  # the topics subscribed to: those of ``topics`` that exist
        self.missing: list[str] = list(topics)  # the lane's topics the broker does not have (yet): /readyz says them
        self._may_create = kafka.create_topics  # false once the broker refused a creation
        self.last_lag = 0
        self.rewind: dict[tuple[str, int], int] = {}  # revoked partitions' first unfinished offsets
        self._next_topic_check = 0.0
        self._next_wait_log = 0.0

    # -- intake ---------------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> list:
        """Fetch records (none while the queue is full: the partitions are paused); each is tracked.

        The lane serves the topics that exist and picks up the others when they appear (``follow_topics``);
        a lane none of whose topics exist yet polls nothing."""
        self.follow_topics()
        if not self.subscribed:
            time.sleep(max(timeout_ms, 50) / 1000)
            return []
        self.apply_backpressure()
        batches = self.consumer.poll(timeout_ms=timeout_ms)
        return [record for records in batches.values() for record in records]

    def follow_topics(self) -> None:
        """Create the project's missing topics where the broker allows it, subscribe to the lane's topics that exist.

        Checked every second while a topic is missing, never once all exist. The project's own topics
        (``producers.topics.is_project_topic``) are created with its partition defaults unless
        ``kafka.create_topics`` is off or the broker refuses (an ACL, a policy: said once, then waited
        for); a foreign topic (a Debezium source) is only waited for. Subscribing to the existing ones
        first and re-subscribing as others appear, rather than waiting for all: an online lane whose
        chunk topic nobody made never served the queries on the topic it had (issue #29). A topic joins
        the subscription only once it exists."""
        if not self.missing:
            return
        now = time.monotonic()
        if now < self._next_topic_check:
            return
        self._next_topic_check = now + 1.0
        missing = missing_topics(self.kafka, self.topics)
        creatable = [topic for topic in missing if is_project_topic(self.kafka, topic)] if self._may_create else []
        if creatable:
            try:
                ensure_topics(self.kafka, topics=creatable, wait_for_brokers_s=0)  # no wait: serve, look again
                missing = missing_topics(self.kafka, self.topics)
            except TopicsError as exc:  # no CREATE right, a policy, too few brokers: wait
                self._may_create = exc.retriable  # a timeout: try again at the next check
                log.warning("cannot create topics; waiting for them", lane=self.name, topics=creatable,
                            error=f"{type(exc).__name__}: {str(exc)[:300]}", retrying=exc.retriable)
        present = [topic for topic in self.topics if topic not in missing]
        if present != self.subscribed:
            subscribe(self.consumer, present, _Rebalance(self))
            if self.subscribed_at is None:
                self.subscribed_at = time.monotonic()
            if self.subscribed:
                log.info("topics appeared; subscribed to them", lane=self.name, topics=present)
            self.subscribed = present
        self.missing = missing
        if missing and now >= self._next_wait_log:
            log.warning("serving the topics that exist; waiting for the others", lane=self.name,
                        serving=present, missing=missing)
            self._next_wait_log = now + 30.0

    def joined(self) -> bool:
        """Subscribed and a stable member of its group (it may hold no partition: more members than partitions)."""
        return self.subscribed_at is not None and group_joined(self.consumer)

    def record_lag(self, metrics) -> int:
        """Records behind the log end on the assigned partitions (the gauge, and /healthz's progress check)."""
        self.last_lag = metrics.lag(self.name, self.consumer)
        return self.last_lag

    def track(self, record) -> list:
        """Register a fetched record; its offset commits once ``OffsetTracker.done(handle)``."""
        return self.offsets.track(record.topic, record.partition, record.offset)

    def joining_timeout(self, wanted_ms: int) -> int:
        """A consumer still joining its group needs blocking polls to finish the join."""
        return wanted_ms if self.consumer.assignment() else max(wanted_ms, 100)

    def apply_backpressure(self) -> None:
        """Pause the lane's partitions while its queue is full (bounded memory), resume when drained."""
        full = self._full(self.queue)
        if full and not self.paused:
            self.consumer.pause(*self.consumer.assignment())
            self.paused = True
        elif not full and self.paused:
            self.consumer.resume(*self.consumer.paused())
            self.paused = False

    # -- outcomes -------------------------------------------------------------------------------
    def dead_letter(self, record, error: ErrorInfo, handle: list, metrics_lane: str | None = None) -> None:
        self.outbox.dead_letter(record, error, handle, metrics_lane or self.name)

    def reply(self, record, request, reply, handle: list, metrics_lane: str | None = None) -> None:
        self.outbox.reply(record, request, reply, handle, metrics_lane or self.name)

    def forward(self, record, topic: str, request, handle: list) -> None:
        """Hand the request on to the workers that answer it on ``topic``."""
        self.outbox.forward(record, topic, request, handle, self.name)

    # -- offsets and ownership ------------------------------------------------------------------
    def commit(self, wait: bool = True, revoked: frozenset = frozenset()) -> None:
        """Commit finished contiguous runs (``revoked``: theirs too); a reply's record once acked, never awaited."""
        self.outbox.settle()
        commit_finished(self.consumer, self.offsets, wait=wait, revoked=revoked, lane=self.name)

    def drop(self, partitions: set[tuple[str, int]]) -> None:
        """Forget queued work and offsets of partitions this worker no longer owns.

        Where each one's unfinished work began is kept (``rewind``): kafka-python 3.0.12 keeps the fetch
        position of a partition that an eager rebalance revokes and then assigns back to the same
        member, so the dropped records would otherwise never come again."""
        self.queue.keep(lambda item: (item.topic, item.partition) not in partitions)
        self.rewind.update(self.offsets.forget(partitions))

    def rewind_assigned(self, assigned) -> None:
        """Partitions assigned back after a revocation: fetch again from their first unfinished record."""
        for tp in assigned:
            offset = self.rewind.pop((tp.topic, tp.partition), None)
            if offset is not None:
                self.consumer.seek(tp, offset)  # local state only (no broker call): allowed on the IO thread
        self.rewind.clear()  # the rest went to other members: they start from the committed offsets

    def hold(self) -> list:
        """Pause every assigned partition (a sink outage); returns what to ``release`` later."""
        assigned = list(self.consumer.assignment())
        self.consumer.pause(*assigned)
        return assigned

    def keep_membership(self, timeout_ms: int = 50) -> None:
        """Poll while held: the group keeps this member, nothing is taken. A partition assigned during the
        hold is paused too, and what it fetched is sought back, to be fetched again after ``release``
        (an untracked record must never sit behind a position the lane may commit)."""
        for tp, records in self.consumer.poll(timeout_ms=timeout_ms).items():
            self.consumer.seek(tp, records[0].offset)
        fresh = set(self.consumer.assignment()) - set(self.consumer.paused())
        if fresh:
            self.consumer.pause(*fresh)

    def release(self, held: list) -> None:
        """Resume what ``hold`` paused and what was assigned during the hold (backpressure re-pauses if full)."""
        assigned = self.consumer.assignment()
        self.consumer.resume(*[tp for tp in {*held, *self.consumer.paused()} if tp in assigned])
        self.paused = False

    def reachable(self) -> bool:
        return broker_reachable(self.consumer)

    def close(self) -> None:
        try:
            self.outbox.settle(self.flush_timeout_s)
            self.commit()
        except Exception as exc:  # noqa: BLE001 - closing: report and carry on
            log.warning("final commit failed", lane=self.name, error=str(exc)[:300])
        self.consumer.close(autocommit=False)


class _Rebalance(ConsumerRebalanceListener):
    """Commit finished work, drop queued work of revoked partitions (it is redelivered to their new owner)."""

    def __init__(self, lane: Lane):
        self.lane = lane

    def on_partitions_revoked(self, revoked):
        partitions = {(tp.topic, tp.partition) for tp in revoked}
        if self.lane.on_revoke is not None:
            self.lane.on_revoke(partitions)
        # kafka-python 3 calls this on the consumer's IO thread, which refuses blocking calls: commit async
        self.lane.commit(wait=False, revoked=frozenset(partitions))
        self.lane.drop(partitions)

    def on_partitions_assigned(self, assigned):
        self.lane.rewind_assigned(assigned)
        log.info("partitions assigned", lane=self.lane.name,
                 partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))


# -- what a failed write means for its records ----------------------------------------------------
TRANSIENT, PERMANENT, UNKNOWN = "transient", "permanent", "unknown"


def failure_kind(exc: BaseException) -> str:
    """Classify a failed write (sink upsert/delete, publish) for the records in it.

    transient: the target is away or busy (a broker or a Qdrant node down, a cluster fault, timeouts,
    5xx/429, a retriable Kafka error): back off and keep the offset, however long it takes. permanent:
    the target rejected what was sent (invalid collection name, vector config mismatch, a 4xx, a
    non-retriable Kafka error such as a record too large): dead-letter the record with the reason.
    unknown: retried like a transient error, but only up to ``record_retry_limit_s``. What a store
    client's errors mean is the store's knowledge (``vectorstore.faults.store_fault``).
    """
    seen = 0
    while exc is not None and seen < 5:  # wrappers (PublishError) carry the client's error as the cause
        if isinstance(exc, KafkaError):
            return TRANSIENT if exc.retriable else PERMANENT
        kind = store_fault(exc)
        if kind is not None:
            return kind
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return TRANSIENT
        if isinstance(exc, (ValueError, TypeError, KeyError)):
            return PERMANENT
        exc, seen = exc.__cause__, seen + 1
    return UNKNOWN
