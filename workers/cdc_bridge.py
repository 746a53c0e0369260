"""The CDC bridge: a Debezium change-event topic -> chunk and delete events on a chunk lane.

c / r / u: the row's text is chunked for the target model and every chunk is published (keyed by
doc_id, each with its content hash), followed by a delete of the chunks at or beyond the new
count, so chunks that vanished when a document shrank go too. The embed workers skip chunks
whose stored point already has the same content hash, model and metadata, so an update only
re-embeds what changed. d and tombstones delete every chunk of the document; t (truncate) is
dead-lettered (``truncate_refused``) or ignored, as configured.

Records are handled in partition order and published in that order under the document's key, so
a document's events stay ordered end to end. Offsets are committed only after the producer
acknowledged everything published for them (dead letters included); a crash can only cause a
redelivery, which is harmless: chunks are idempotent upserts and skipped when unchanged.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from kafka import KafkaConsumer, KafkaProducer
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.errors import KafkaError

from embedstream import logs
from embedstream.config import Settings
from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig, CdcError, Change, parse_change
from embedstream.producers.publisher import ChunkPublisher, PublishError
from embedstream.producers.topics import ensure_topics
from embedstream.producers.sources import Document
from embedstream.schemas.events import Lane
from embedstream.workers.kafka_io import WorkerLoop, broker_reachable, commit_finished, send_dead_letter, subscribe
from embedstream.workers.kafka_io import run_until_signalled as run_until_signalled_generic
from embedstream.workers.metrics import CdcMetrics
from embedstream.workers.offsets import OffsetTracker

log = logs.get("embedstream.cdc")

TruncatePolicy = Literal["dead-letter", "ignore"]
METRICS_LANE = "cdc"


@dataclass
class CdcOptions:
    topic: str
    config: CdcConfig
    lane: Lane = "online"
    collection: str | None = None  # None: the embed workers' default collection
    on_truncate: TruncatePolicy = "dead-letter"
    group: str | None = None  # None: settings.kafka.group_cdc
    poll_timeout_ms: int = 200
    max_poll_records: int = 500
    publish_backoff_s: tuple[float, float] = (0.5, 10.0)
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-cdc-{threading.get_ident()}")

    def __post_init__(self) -> None:
        if self.on_truncate not in ("dead-letter", "ignore"):
            raise ValueError(f"on_truncate must be 'dead-letter' or 'ignore', got {self.on_truncate!r}")


def truncate_error(change: Change) -> CdcError:
    where = f" of {change.source}" if change.source else ""
    return CdcError("truncate_refused", f"truncate{where} refused: the bridge cannot tell which documents the table "
                                        "held (run with --on-truncate ignore to skip truncates)")


def apply_change(publisher: ChunkPublisher, change: Change, chunks: list[str]) -> tuple[int, int]:
    """Publish what applies one change, in the order it must be applied; returns (chunks, deletes) sent.

    c / r / u: the document goes to the documents log (the re-index source), its chunks to the lane,
    then a delete of the chunks past the new count. d / tombstone: a delete of every chunk and a
    tombstone in the documents log. An update that moved the row to another id deletes the old id first.
    """
    assert change.doc_id is not None
    if change.is_delete:
        publisher.delete_document(change.doc_id)
        return 0, 1
    deletes = 1
    if change.previous_doc_id is not None:
        publisher.delete_document(change.previous_doc_id)
        deletes += 1
    document = Document(change.doc_id, change.text or "", dict(change.metadata))
    return publisher.publish_chunks(document, chunks, trim=True, record=True), deletes


class _Assignments(ConsumerRebalanceListener):
    """Logs only. kafka-python 3 calls sync listeners on its IO loop, where blocking calls (commit,
    flush) are refused or stall the loop; nothing needs them here: every poll is published and
    committed before the next, and a commit lost to a rebalance only means a harmless redelivery."""

    def on_partitions_revoked(self, revoked):
        log.info("partitions revoked", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in revoked))

    def on_partitions_assigned(self, assigned):
        log.info("partitions assigned", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))


class CdcBridge(WorkerLoop):
    """Consumes one Debezium topic in its own group and publishes chunk events to one lane."""

    name = "cdc bridge"

    def __init__(self, settings: Settings, chunker: Chunker, options: CdcOptions, metrics: CdcMetrics | None = None,
                 create_topics: bool = True):
        super().__init__()
        self.settings = settings
        self.kafka = settings.kafka
        self.chunker = chunker
        self.options = options
        self.metrics = metrics or CdcMetrics()
        self.offsets = OffsetTracker()
        if create_topics:
            ensure_topics(self.kafka, topics=[self.kafka.topic_dead_letters])
        self.publisher = ChunkPublisher(self.kafka, lane=options.lane, collection=options.collection,
                                        create_topics=create_topics)
        client = self.kafka.client_kwargs()
        self.producer = KafkaProducer(**client, acks="all", linger_ms=0, retries=5)  # dead letters
        self.consumer = KafkaConsumer(
            **client,
            group_id=options.group or self.kafka.group_cdc,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",  # Debezium with exactly-once writes in transactions
            max_poll_records=options.max_poll_records,
            client_id=f"embedstream-cdc-{options.worker_id}",
            metadata_max_age_ms=10_000,
        )
        subscribe(self.consumer, [options.topic], _Assignments())

    # -- one poll ------------------------------------------------------------------------------
    def run_once(self) -> int:
        batches = self.consumer.poll(timeout_ms=self.options.poll_timeout_ms)
        records = [r for recs in batches.values() for r in recs]
        if records:
            self._handle(records)
        self._commit()
        self.metrics.lag(METRICS_LANE, self.consumer)
        return len(records)

    def _handle(self, records: list) -> None:
        staged: list[tuple[list, Change]] = []
        for record in records:
            handle = self.offsets.track(record.topic, record.partition, record.offset)
            try:
                change = parse_change(record.key, record.value, self.options.config)
                if change.op == "t":
                    if self.options.on_truncate != "ignore":
                        raise truncate_error(change)
                    log.info("truncate ignored", source=change.source, offset=record.offset)
                    self.metrics.events.labels(op="t").inc()
                    OffsetTracker.done(handle)
                    continue
            except CdcError as err:
                send_dead_letter(self.producer, self.kafka.topic_dead_letters, record, err.to_error_info(), handle,
                                 self.options.worker_id, self.metrics, METRICS_LANE)
                continue
            staged.append((handle, change))
        if not staged:
            return
        upserts = [change for _, change in staged if change.is_upsert]
        chunked = iter(self.chunker.chunk_many([c.text or "" for c in upserts]) if upserts else [])
        plan = [(change, next(chunked) if change.is_upsert else []) for _, change in staged]
        self._publish(plan)
        for handle, change in staged:
            OffsetTracker.done(handle)
            self.metrics.events.labels(op=change.op).inc()

    def _publish(self, plan: list[tuple[Change, list[str]]]) -> None:
        """Send in order and wait for the acks; on failure send it all again (harmless) after a pause."""
        delay, ceiling = self.options.publish_backoff_s
        while True:
            try:
                sent = [apply_change(self.publisher, change, chunks) for change, chunks in plan]
                self.publisher.flush()
                break
            except (PublishError, KafkaError) as exc:
                if self.stop_event.is_set():
                    raise
                self.metrics.publish_failures.inc()
                log.warning("publishing chunk events failed; retrying", error=str(exc)[:300], retry_in_s=delay)
                self.stop_event.wait(delay)
                delay = min(delay * 2, ceiling)
        self.metrics.chunks.inc(sum(c for c, _ in sent))
        self.metrics.deletes.inc(sum(d for _, d in sent))

    def _commit(self) -> None:
        commit_finished(self.consumer, self.producer, self.offsets, lane=METRICS_LANE)

    # -- lifecycle -----------------------------------------------------------------------------
    def started_fields(self) -> dict:
        c = self.options.config
        return {"topic": self.options.topic, "lane": self.options.lane, "id_field": c.id_field,
                "text_fields": list(c.text_fields), "on_truncate": self.options.on_truncate}

    def close(self) -> None:
        try:
            self._commit()
        except Exception as exc:  # noqa: BLE001 - closing: report and carry on
            log.warning("final commit failed", error=str(exc))
        self.consumer.close(autocommit=False)
        try:
            self.publisher.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("closing the publisher failed", error=str(exc))
        self.producer.close()


def run_until_signalled(bridge: CdcBridge, metrics_port: int | None) -> None:
    """Serve /healthz /readyz /metrics and stop cleanly on SIGTERM/SIGINT (final commit)."""
    checks: dict[str, Callable[[], bool]] = {"broker": lambda: broker_reachable(bridge.consumer)}
    run_until_signalled_generic(bridge, metrics_port, checks, "cdc bridge")

