"""Kafka plumbing shared by every worker: dead letters, replies, broker probe, signal-driven run.

One place for the rules all workers follow: a dead letter counts as finished only once the broker
acknowledged it; replies are keyed by request id; SIGTERM/SIGINT stop the loop after a final commit.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from kafka import TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from embedstream import logs
from embedstream.gcfreeze import freeze_startup_objects
from embedstream.schemas import DeadLetter, ErrorInfo
from embedstream.schemas.codec import encode
from embedstream.workers.health import serve
from embedstream.workers.offsets import OffsetTracker

log = logs.get("embedstream.worker")


class WorkerLoop:
    """The run/stop contract every worker shares: poll-batch-process-commit until stopped, then close."""

    name = "worker"

    def __init__(self) -> None:
        self.stop_event = threading.Event()
        self.ready = threading.Event()

    def started_fields(self) -> dict:
        """What the start-up log line says about this worker."""
        return {}

    def run_once(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def warm_up(self) -> None:
        """Work done before the worker reports ready (e.g. building kernels for query shapes)."""

    def run(self) -> None:
        self.warm_up()
        log.info(f"{self.name} started", **self.started_fields())
        self.ready.set()
        try:
            while not self.stop_event.is_set():
                self.run_once()
        finally:
            self.close()

    def stop(self) -> None:
        self.stop_event.set()


def send_dead_letter(producer, topic: str, record, error: ErrorInfo, handle, worker_id: str, metrics, lane: str) -> None:
    """Publish the record with its reason; its offset becomes committable when the broker acks."""
    letter = DeadLetter.from_record(record.topic, record.partition, record.offset, record.key, record.value,
                                    error, worker=worker_id)
    future = producer.send(topic, key=record.key, value=encode(letter))
    future.add_callback(lambda _meta: OffsetTracker.done(handle))
    future.add_errback(lambda exc: log.error("dead letter not written", error=str(exc)))
    metrics.dead_letters.labels(lane=lane, code=error.code).inc()
    log.warning("dead-lettered", topic=record.topic, partition=record.partition, offset=record.offset,
                code=error.code, reason=error.message)


def send_reply(producer, request, reply) -> None:
    """Answer on the request's own reply topic, keyed by its correlation id."""
    producer.send(request.reply_to, key=request.request_id.encode(), value=encode(reply))


def broker_reachable(consumer) -> bool:
    """True while the client holds a connection to some broker.

    kafka-python 3's ``bootstrap_connected()`` is only true while bootstrapping is in progress, so
    after start-up it reads False even on a healthy client; look at the broker connections instead.
    """
    try:
        client = consumer._client  # the public API has no "connected to the cluster" question
        brokers = client.cluster.brokers()
        return any(client.connected(getattr(b, "node_id", None) if hasattr(b, "node_id") else b.nodeId) for b in brokers)
    except Exception:  # noqa: BLE001 - another client version: fall back to the public call
        return bool(consumer.bootstrap_connected())


def run_until_signalled(worker, metrics_port: int | None, checks: dict[str, Callable[[], bool]], name: str,
                        host: str = "0.0.0.0") -> None:
    """Serve /healthz /readyz /metrics, run the loop in a thread, stop cleanly on SIGTERM/SIGINT."""
    thread = threading.Thread(target=worker.run, name=name)
    server = None
    if metrics_port:
        server = serve(metrics_port, worker.metrics.registry, alive=lambda: thread.is_alive(),
                       checks={"model": lambda: worker.ready.is_set(), **checks}, host=host)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.stop())
    frozen = freeze_startup_objects()  # the model is loaded: no full GC walks it mid-request
    log.info("startup objects frozen for the garbage collector", objects=frozen)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if server:
        server.shutdown()
    log.info(f"{name} stopped")


def commit_finished(consumer, producer, tracker: OffsetTracker, *, wait: bool = True, flush_timeout_s: float = 30.0,
                    **context) -> None:
    """Commit the offsets of finished work on the partitions the consumer still owns.

    Dead letters and replies are acknowledged first (their records count as finished only then);
    a producer that cannot flush leaves those records uncommitted instead of hanging the loop.
    ``wait=False`` is for rebalance listeners: kafka-python 3 runs them on its IO thread, which
    refuses blocking calls, and an async commit still reaches the coordinator before the re-join.
    A failed synchronous commit keeps its offsets for the next call.
    """
    try:
        producer.flush(timeout=flush_timeout_s)
    except KafkaError as exc:
        log.error("dead letters or replies not acknowledged; committing only finished work",
                  error=str(exc)[:300], **context)
    offsets = tracker.drain()
    owned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    commit = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items() if (t, p) in owned}
    if not commit:
        return
    if not wait:
        def reported(_offsets, result) -> None:
            if isinstance(result, Exception):
                log.warning("offset commit at revocation failed", error=str(result)[:300], **context)

        consumer.commit_async(commit, callback=reported)
        return
    try:
        consumer.commit(commit)
    except KafkaError as exc:  # broker away past the request timeout, or a rebalance: retry later
        log.warning("offset commit failed; will retry", error=str(exc)[:300], **context)
        tracker.retry({(tp.topic, tp.partition): meta.offset for tp, meta in commit.items()})


def subscribe(consumer, topics: list[str], listener) -> None:
    """Subscribe, then load the topics' metadata before the first group join.

    Joined without it, the group starts with no partitions and kafka-python 3.0.12 can then stall
    in its next fetch for good. Loaded before subscribing, the group's metadata snapshot misses it
    and the first refresh forces a second rebalance; so: after subscribe, before the first poll.
    """
    consumer.subscribe(topics, listener=listener)
    for topic in topics:
        consumer.partitions_for_topic(topic)
