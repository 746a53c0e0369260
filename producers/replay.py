"""Replay the documents log: read full documents from a start point and publish their chunks again.

The compacted documents topic (key = doc_id, value = DocumentRecord, null = deleted) is the
source of truth a re-index rebuilds from, with any model or chunk size. The replay's position is
kept as committed offsets of its own consumer group, committed only after the chunks it
published for those records were acknowledged, so a crashed replay resumes where it stopped and
re-publishing is harmless (point ids are deterministic).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.producers.chunker import Chunker
from embedstream.producers.publisher import ChunkPublisher, PublishError
from embedstream.producers.sources import Document
from embedstream.schemas.bounds import doc_id_refusal
from embedstream.schemas.codec import DecodeError, decode, encode
from embedstream.schemas.events import DeadLetter, DocumentDelete, DocumentRecord, ErrorInfo

log = logs.get("embedstream.replay")

_OFFSETS = re.compile(r"^\d+:\d+(,\d+:\d+)*$")


@dataclass(frozen=True)
class StartPosition:
    """Where a replay starts when its group has no committed position yet."""

    kind: str  # earliest | timestamp | offsets
    timestamp_ms: int | None = None
    offsets: dict[int, int] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> StartPosition:
        """'earliest', epoch milliseconds, an ISO-8601 time, or 'PARTITION:OFFSET,...'."""
        text = text.strip()
        if text == "earliest":
            return cls("earliest")
        if _OFFSETS.match(text):
            pairs = (part.split(":") for part in text.split(","))
            return cls("offsets", offsets={int(p): int(o) for p, o in pairs})
        if text.isdigit():
            return cls("timestamp", timestamp_ms=int(text))
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"--from must be 'earliest', epoch ms, an ISO-8601 time or PARTITION:OFFSET[,...]; got {text!r}"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return cls("timestamp", timestamp_ms=int(moment.timestamp() * 1000))


@dataclass
class ReplayProgress:
    """Records read / to read in this pass, and what was published."""

    read: int = 0
    total: int = 0
    documents: int = 0
    deletes: int = 0
    chunks: int = 0
    bad: int = 0
    resumed: bool = False


class DocumentReplay:
    """One pass over the documents log, from the group's committed position (or ``start``) to the
    end offsets seen when the pass begins; chunks go to ``publisher`` (its lane and collection)."""

    def __init__(self, kafka: KafkaSettings, group_id: str, start: StartPosition, publisher: ChunkPublisher,
                 chunker: Chunker, *, commit_every_s: float = 2.0, poll_records: int = 256,
                 ignore_committed: bool = False):
        self.kafka = kafka
        self.topic = kafka.topic_documents
        self.group_id = group_id
        self.start = start
        self.publisher = publisher
        self.chunker = chunker
        self.commit_every_s = commit_every_s
        self.ignore_committed = ignore_committed
        self.poll_records = poll_records
        # librdkafka (the default path's client); manual assignment: no group join, offsets still stored in the group.
        # partition.eof: a partition whose last records were compacted away still says where it ends
        self.consumer = Consumer(kafka.librdkafka_config(**{
            "group.id": group_id, "client.id": f"embedstream-replay-{group_id}", "enable.auto.commit": False,
            "enable.auto.offset.store": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
            "enable.partition.eof": True}))
        self._dead_letters = Producer(kafka.producer_config(**{"client.id": f"embedstream-replay-{group_id}"}))
        self._letter_failures: list[str] = []
        self.partitions = self._partitions()
        self.positions: dict[int, int] = {}  # partition -> the next offset this pass hands out

    def _partitions(self, timeout_s: float = 30.0) -> list[int]:
        end = time.monotonic() + timeout_s
        while True:
            found = self.consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if found is not None and found.error is None and found.partitions:
                return sorted(found.partitions)
            if time.monotonic() > end:
                raise RuntimeError(f"topic {self.topic!r} has no partitions (does it exist?)")
            time.sleep(0.2)

    def _starts(self, progress: ReplayProgress) -> dict[int, int]:
        """Committed offsets win (resume); otherwise the requested start (each within the partition's log)."""
        bounds = {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10) for p in self.partitions}
        starts: dict[int, int] = {}
        if not self.ignore_committed:
            for tp in self.consumer.committed([TopicPartition(self.topic, p) for p in self.partitions], timeout=10):
                if tp.offset != OFFSET_INVALID and tp.offset >= 0:
                    starts[tp.partition] = tp.offset
                    progress.resumed = True
        missing = [p for p in self.partitions if p not in starts]
        if self.start.kind == "timestamp" and missing:
            found = self.consumer.offsets_for_times(
                [TopicPartition(self.topic, p, self.start.timestamp_ms) for p in missing], timeout=10)
            starts.update({tp.partition: tp.offset if tp.offset >= 0 else bounds[tp.partition][1] for tp in found})
        for p in missing:
            wanted = self.start.offsets.get(p, 0) if self.start.kind == "offsets" else starts.get(p, 0)
            starts[p] = min(max(wanted, bounds[p][0]), bounds[p][1])
        return starts

    def run(self, on_progress: Callable[[ReplayProgress], None] | None = None,
            should_stop: Callable[[], bool] | None = None) -> ReplayProgress:
        """Replay up to the current end; returns what was read and published."""
        progress = ReplayProgress()
        self.positions = self._starts(progress)
        ends = {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in self.partitions}
        progress.total = sum(max(0, ends[p] - self.positions[p]) for p in self.partitions)
        self.consumer.assign([TopicPartition(self.topic, p, self.positions[p]) for p in self.partitions
                              if self.positions[p] < ends[p]])
        if on_progress:
            on_progress(progress)
        last_commit = time.monotonic()
        while any(self.positions[p] < ends[p] for p in self.partitions):
            if should_stop and should_stop():
                break
            records = []
            for message in self.consumer.consume(self.poll_records, 0.5):
                error, p = message.error(), message.partition()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    if error.fatal():
                        raise KafkaException(error)
                    log.warning("replay consumer error", error=error.str()[:300])
                elif error is not None or message.offset() >= ends[p]:  # at this pass's end (past gaps, markers)
                    self.positions[p] = max(self.positions[p], ends[p])
                else:
                    records.append(message)
                    self.positions[p] = message.offset() + 1
            self._publish(records, progress)
            progress.read += len(records)
            if on_progress:
                on_progress(progress)
            if time.monotonic() - last_commit >= self.commit_every_s:
                self._commit()
                last_commit = time.monotonic()
        self._commit()
        return progress

    def _publish(self, records: list, progress: ReplayProgress) -> None:
        """Publish in log order; documents are chunked together up to the next tombstone."""
        documents: list[Document] = []
        for record in records:
            key = record.key().decode("utf-8", "replace") if record.key() is not None else None
            if record.value() is None:  # tombstone: the document was deleted (after what came before it)
                refused = doc_id_refusal(key) if key else None
                if refused:
                    self._dead_letter(record, ErrorInfo(code="invalid_event", message=f"tombstone key: doc_id {refused}"))
                    progress.bad += 1
                    continue
                if key:
                    self._publish_documents(documents, progress)
                    documents = []
                    self.publisher.publish_delete(DocumentDelete(doc_id=key, collection=self.publisher.collection))
                    progress.deletes += 1
                continue
            try:
                event = decode(record.value(), DocumentRecord)
            except DecodeError as err:
                self._dead_letter(record, err.to_error_info())
                progress.bad += 1
                continue
            documents.append(Document(event.doc_id, event.text, event.metadata))
        self._publish_documents(documents, progress)

    def _publish_documents(self, documents: list[Document], progress: ReplayProgress) -> None:
        if not documents:
            return
        chunked = self.chunker.chunk_many([d.text for d in documents])
        for document, chunks in zip(documents, chunked):
            progress.chunks += self.publisher.publish_chunks(document, chunks, trim=True, ids=self.chunker.ids)
        progress.documents += len(documents)

    def _dead_letter(self, record, error: ErrorInfo) -> None:
        letter = DeadLetter.from_record(record.topic(), record.partition(), record.offset(), record.key(), record.value(),
                                        error, worker=f"replay:{self.group_id}")
        def delivered(error, _message) -> None:
            if error is not None:
                self._letter_failures.append(error.str())

        self._dead_letters.produce(self.kafka.topic_dead_letters, key=record.key(), value=encode(letter),
                                   on_delivery=delivered)
        self._dead_letters.poll(0)

    def _commit(self) -> None:
        """Positions become durable only after everything published for them was acknowledged."""
        self.publisher.flush()
        left = self._dead_letters.flush()
        failures, self._letter_failures = self._letter_failures, []
        if left or failures:
            raise PublishError(f"dead letters to {self.kafka.topic_dead_letters} not written: {left} unacknowledged, "
                               f"{len(failures)} failed{f' (first: {failures[0]})' if failures else ''}")
        if self.positions:
            self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in self.positions.items()],
                                 asynchronous=False)

    def close(self) -> None:
        self.consumer.close()
        self._dead_letters.flush(10.0)
