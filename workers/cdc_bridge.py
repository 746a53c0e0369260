"""The CDC bridge: a Debezium change-event topic -> chunk and delete events on a chunk lane.

c / r / u: the row's text is chunked for the target model and every chunk is published (keyed by
doc_id, each with its content hash), followed by a delete of the chunks at or beyond the new
count, so chunks that vanished when a document shrank go too. The embed workers decide per chunk
what needs a forward pass (:mod:`embedstream.workers.unchanged`): a status-only update rewrites
payloads with none, an edit re-embeds the chunks whose text changed (the chunker keeps the others'
boundaries) and moves the rest. d and tombstones delete every chunk of the document; t (truncate) is
dead-lettered (``truncate_refused``) or ignored, as configured. A value the source left out (Debezium's
placeholder for an unchanged TOASTed column) is filled in from the document's documents-log record
(:mod:`embedstream.workers.cdc_memory`), never indexed; when no record has it, the change is
dead-lettered (``unavailable_value``) and the index keeps the document as it was.

Records are handled in partition order and published in that order under the document's key, so
a document's events stay ordered end to end. Offsets are committed only after the producer
acknowledged everything published for them (dead letters included); a crash can only cause a
redelivery, which is harmless: chunks are idempotent upserts and skipped when unchanged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from embedstream import logs
from embedstream.config import Settings
from embedstream.producers.chunker import Chunker, ChunkIds
from embedstream.producers.debezium import CdcConfig, CdcError, Change, complete, moved_from, parse_change
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.sources import Document
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ErrorInfo
from embedstream.schemas.events import Lane
from embedstream.workers.cdc_memory import DocumentMemory
from embedstream.workers.loop import WorkerLoop, new_worker_id
from embedstream.workers.metrics import CdcMetrics
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.serve import run_until_signalled

__all__ = ["CdcBridge", "CdcOptions", "apply_change", "run_until_signalled", "truncate_error"]

log = logs.get("embedstream.cdc")

TruncatePolicy = Literal["dead-letter", "ignore"]
METRICS_LANE = "cdc"
PUBLISH_LINGER_MS = 100  # never waited out: every batch is flushed (see CdcBridge.__init__)


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
    worker_id: str = field(default_factory=lambda: new_worker_id("cdc"))
    # A bridge that died keeps its partitions this long: the replacement waits it out unless it joins under
    # the same static member id (instance_id), which takes them over at once. settings.kafka's win when set.
    session_timeout_ms: int = 10_000
    instance_id: str | None = None

    def __post_init__(self) -> None:
        if self.on_truncate not in ("dead-letter", "ignore"):
            raise ValueError(f"on_truncate must be 'dead-letter' or 'ignore', got {self.on_truncate!r}")


def truncate_error(change: Change) -> CdcError:
    where = f" of {change.source}" if change.source else ""
    return CdcError("truncate_refused", f"truncate{where} refused: the bridge cannot tell which documents the table "
                                        "held (run with --on-truncate ignore to skip truncates)")


def apply_change(publisher: ChunkPublisher, change: Change, chunks: list[str], ids: ChunkIds | None = None) -> tuple[int, int]:
    """Publish what applies one change, in the order it must be applied; returns (chunks, deletes) sent.

    c / r / u: the document goes to the documents log (the re-index source), its chunks to the lane,
    then a delete of the chunks past the new count. d / tombstone: a delete of every chunk and a
    tombstone in the documents log. An update that moved the row to another id deletes the old id first.
    With ``ids`` (the model chunker's) the chunks carry their token ids, so the embed worker does not
    tokenize them again.
    """
    assert change.doc_id is not None
    if change.is_delete:
        publisher.delete_document(change.doc_id)
        return 0, 1
    deletes = 1
    if change.previous_doc_id is not None:
        publisher.delete_document(change.previous_doc_id)
        deletes += 1
    assert not change.unavailable, "complete() the change first: never index what the source did not send"
    document = Document(change.doc_id, change.text or "", dict(change.metadata))
    return publisher.publish_chunks(document, chunks, trim=True, record=True, ids=ids, fields=change.fields), deletes


class CdcBridge(WorkerLoop):
    """Consumes one Debezium topic in its own group and publishes chunk events to one lane."""

    name = "cdc bridge"

    def __init__(self, settings: Settings, chunker: Chunker, options: CdcOptions, metrics: CdcMetrics | None = None,
                 create_topics: bool = True):
        super().__init__(settings.kafka, settings.worker, metrics or CdcMetrics(), options.worker_id)
        self.settings = settings
        self.chunker = chunker
        self.options = options
        if create_topics:
            ensure_topics(self.kafka, topics=[self.kafka.topic_dead_letters])
        # Every batch ends with a flush, which sends what lingers at once: a linger only gathers the batch's
        # events (its chunks, tail deletes and documents-log records) into one request per topic. A flush of
        # 5 events took 5.6 ms median with linger 0 (a request each) and 1.3 ms with 5 ms or more (the dev broker on
        # loopback, load average ~20).
        self.publisher = ChunkPublisher(self.kafka, lane=options.lane, collection=options.collection,
                                        create_topics=create_topics, producer_config={"linger.ms": PUBLISH_LINGER_MS})
        membership = {} if self.kafka.session_timeout_ms else {"session_timeout_ms": options.session_timeout_ms}
        if options.instance_id and not self.kafka.instance_id():
            membership["group_instance_id"] = options.instance_id
        self.lane = self.add_lane(METRICS_LANE, [options.topic], options.group or self.kafka.group_cdc,
                                  options.max_poll_records, **membership)
        self.memory = DocumentMemory(self.kafka)
        self.last_commit = 0.0

    # -- one poll ------------------------------------------------------------------------------
    def run_once(self) -> int:
        records = self.lane.poll(self.options.poll_timeout_ms)
        if records:
            self._handle(records)
        # A synchronous commit is a broker round trip before the next poll: while changes keep coming, commit
        # every commit_interval_s (a crash redelivers at most that much, harmlessly); after an empty poll, at once.
        now = time.monotonic()
        if not records or now - self.last_commit >= self.tuning.commit_interval_s:
            self.lane.commit()
            self.last_commit = now
        self.lane.record_lag(self.metrics)
        return len(records)

    def _handle(self, records: list) -> None:
        staged: list[tuple[object, list, Change]] = []
        for record in records:
            handle = self.lane.track(record)
            try:
                change = parse_change(record.key, record.value, self.options.config)
                if change.is_skipped:  # heartbeat, transaction metadata, schema change: no document changes
                    self.metrics.skipped.labels(kind=change.op).inc()
                    OffsetTracker.done(handle)
                    continue
                if change.op == "t":
                    if self.options.on_truncate != "ignore":
                        raise truncate_error(change)
                    log.info("truncate ignored", source=change.source, offset=record.offset)
                    self.metrics.events.labels(op="t").inc()
                    OffsetTracker.done(handle)
                    continue
            except CdcError as err:
                self.lane.dead_letter(record, err.to_error_info(), handle)
                continue
            staged.append((record, handle, change))
        staged = self._complete(staged)
        if not staged:
            return
        upserts = [change for _, _, change in staged if change.is_upsert]
        chunked = iter(self.chunker.chunk_many([c.text or "" for c in upserts]) if upserts else [])
        self._publish([(record, handle, change, next(chunked) if change.is_upsert else [])
                       for record, handle, change in staged])

    def _complete(self, staged: list[tuple]) -> list[tuple]:
        """Fill in what the source left out (see producers.debezium.complete), in record order: from a change
        earlier in this batch, else from the documents log; a change that cannot be completed is
        dead-lettered and the index keeps the document as it was."""
        earlier: dict[str, dict | None] = {}  # doc_id -> this batch's latest record of it (None: deleted)
        gone: dict[str, dict] = {}  # doc_id -> its record before this batch deleted it (a primary-key change)
        caught_up = False
        out = []
        for record, handle, change in staged:
            if change.unavailable:
                try:
                    # a primary-key change's create: the values come from the old key's document
                    moved = moved_from(record.headers, self.options.config) if change.op == "c" else None
                    doc_id = moved or change.doc_id
                    if earlier.get(doc_id) or doc_id in gone:
                        previous = earlier.get(doc_id) or gone[doc_id]
                    else:
                        if not caught_up:
                            self._read(self.memory.catch_up, "reading the documents log")
                            caught_up = True
                        previous = self._read(lambda: self.memory.latest(doc_id, deleted=moved is not None),
                                              "fetching a document record")
                    change = complete(change, previous, self.options.config)
                    self.metrics.filled.inc()
                except CdcError as err:
                    self.lane.dead_letter(record, err.to_error_info(), handle)
                    continue
            for deleted in (change.previous_doc_id, None if change.is_upsert else change.doc_id):
                if deleted is not None and earlier.get(deleted):
                    gone[deleted] = earlier[deleted]
                if deleted is not None:
                    earlier[deleted] = None
            if change.doc_id is not None and change.is_upsert:
                earlier[change.doc_id] = {"text": change.text, "metadata": change.metadata, "fields": change.fields}
            out.append((record, handle, change))
        return out

    def _read(self, read, what: str):
        """A documents-log read, backed off while Kafka is away; CdcError when it fails for good."""
        result: list = []
        reason = self.write_with_retry(lambda: result.append(read()), what, self.metrics.publish_failures.inc)
        if reason is not None:
            raise CdcError("unavailable_value", f"a value the source left out could not be looked up: {reason.message}")
        return result[-1]

    def _publish(self, plan: list[tuple], limit_s: float | None = None) -> None:
        """Send in order and wait for the acks; a failed send is sent again (harmless: idempotent).

        Transient failures (broker away) back off for as long as it takes; when the chunk lane refuses
        what was sent for good, each change alone finds the ones at fault, which are dead-lettered."""
        sent: list[tuple[int, int]] = []

        def send_all() -> None:
            sent[:] = [apply_change(self.publisher, change, chunks, self.chunker.ids) for _, _, change, chunks in plan]
            self.publisher.flush()

        reason = self.write_with_retry(send_all, "publishing chunk events", self.metrics.publish_failures.inc, limit_s)
        if reason is not None and len(plan) > 1:
            for step in plan:  # the failure already outlasted its bound: singles are not waited for again
                self._publish([step], limit_s=0.0)
            return
        for record, handle, change, _ in plan:
            self._settle(record, handle, change, reason)
        self.metrics.chunks.inc(sum(c for c, _ in sent) if reason is None else 0)
        self.metrics.deletes.inc(sum(d for _, d in sent) if reason is None else 0)

    def _settle(self, record, handle: list, change: Change, reason: ErrorInfo | None) -> None:
        if reason is not None:
            self.lane.dead_letter(record, reason, handle)
            return
        OffsetTracker.done(handle)
        self.metrics.events.labels(op=change.op).inc()

    # -- lifecycle -----------------------------------------------------------------------------
    def started_fields(self) -> dict:
        c = self.options.config
        return {"topic": self.options.topic, "lane": self.options.lane, "id_field": c.id_field,
                "text_fields": list(c.text_fields), "on_truncate": self.options.on_truncate}

    def close_resources(self) -> None:
        self.memory.close()
        try:
            self.publisher.close()
        except Exception as exc:  # noqa: BLE001 - closing: report and carry on
            log.warning("closing the publisher failed", error=str(exc)[:300])
