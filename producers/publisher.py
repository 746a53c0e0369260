"""Publish chunk and delete events to the chunk topics, keyed by doc_id so each document stays ordered.

Creating the topics is :mod:`embedstream.producers.topics`' job; the publisher asks it for its own.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError as RdKafkaError
from confluent_kafka import KafkaException, Producer
from kafka import errors as kafka_errors

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.errors import CodedError
from embedstream.producers.chunker import Chunker, ChunkIds
from embedstream.producers.sources import Document
from embedstream.producers.topics import DEFAULT_PARTITIONS, ensure_topics, lane_topic
from embedstream.schemas.codec import encode
from embedstream.schemas.events import ChunkEvent, DocumentDelete, DocumentRecord, Lane, content_hash, now_ms

log = logs.get("embedstream.publisher")

DELIVERY_TIMEOUT_MS = 120_000  # a send not acknowledged by then fails (and flush raises)


class PublishError(CodedError, RuntimeError):
    """Some sends failed after the producer's retries; raised by flush() so failures are never silent."""

    code = "publish_failed"

    def __init__(self, message: str):
        super().__init__(self.code, message)


# librdkafka's own (negative) codes that mean "the cluster is away or busy": retriable, as kafka-python says it
_LOCAL_TRANSIENT = {RdKafkaError._MSG_TIMED_OUT, RdKafkaError._TIMED_OUT, RdKafkaError._TRANSPORT,
                    RdKafkaError._ALL_BROKERS_DOWN, RdKafkaError._UNKNOWN_TOPIC, RdKafkaError._UNKNOWN_PARTITION,
                    RdKafkaError._QUEUE_FULL}


def as_kafka_error(error: RdKafkaError) -> kafka_errors.KafkaError:
    """A librdkafka error as the kafka-python error class of its code, so ``failure_kind`` reads its
    ``retriable`` (a broker away or a leader moving: back off; a record too large: dead-letter it)."""
    code = error.code()
    if code >= 0:
        return kafka_errors.for_code(code)(error.str())
    if code in _LOCAL_TRANSIENT:
        return kafka_errors.KafkaTimeoutError(error.str())
    return kafka_errors.KafkaError(error.str())  # not retriable: the record, or this producer, is at fault


class ChunkPublisher:
    """Chunks documents and produces ChunkEvent / DocumentDelete records to one lane's topic.

    With ``record_documents`` (default) each published document is also written whole to the
    compacted documents topic, and :meth:`delete_document` writes its tombstone there: that log
    is what ``embedstream reindex`` replays. A replay itself publishes with it off.
    Sends are asynchronous; :meth:`flush` waits for them and raises :class:`PublishError` if any
    failed. Deletes go to the same lane topic, so publish a document's deletes on the lane its
    chunks used, or they are not ordered with them. Safe to share between threads.

    The producer is librdkafka's with ``KafkaSettings.producer_config`` (acks=all, idempotent: retries neither
    reorder nor duplicate a document's events); ``producer_config`` adds or overrides librdkafka settings.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        lane: Lane = "bulk",
        model: str | None = None,
        collection: str | None = None,
        *,
        create_topics: bool = True,
        partitions: int = DEFAULT_PARTITIONS,
        producer_config: Mapping[str, Any] | None = None,
        record_documents: bool = True,
    ):
        self.settings = settings
        self.lane: Lane = lane
        self.topic = lane_topic(settings, lane)
        self.model = model
        self.collection = collection
        self.record_documents = record_documents
        if create_topics:
            wanted = [self.topic] + ([settings.topic_documents] if record_documents else [])
            ensure_topics(settings, partitions, topics=wanted)
        self._producer = Producer(settings.producer_config(**{
            "client.id": f"embedstream-publisher-{lane}",
            # Bulk: a few ms of batching buys throughput; online: every event goes at once.
            "linger.ms": 5 if lane == "bulk" else 0,
            "batch.size": 256 * 1024 if lane == "bulk" else 16 * 1024,
            "compression.type": "lz4",
            "message.timeout.ms": DELIVERY_TIMEOUT_MS,
            **(producer_config or {}),
        }))
        self._lock = threading.Lock()
        self._failures = 0
        self._first_failure: kafka_errors.KafkaError | None = None
        self.sent = 0

    def publish_document(self, doc: Document | Mapping[str, Any], chunker: Chunker, replace: bool = False) -> int:
        """Chunk a document and send one ChunkEvent per chunk (chunk_id = index); returns the chunk count.

        ``replace=True`` follows the chunks with a delete of those past the new count, so chunks left
        over from a longer earlier version disappear; the document never leaves the index meanwhile,
        and the embed workers embed only the chunks whose text changed (as for a CDC update).
        """
        document = Document.coerce(doc)
        chunks = chunker.chunk(document.text)
        return self._publish_chunks(document, chunks, replace, ids=_ids(chunker.ids, chunks))

    def publish_documents(
        self,
        docs: Iterable[Document | Mapping[str, Any]],
        chunker: Chunker,
        replace: bool = False,
        batch_size: int = 64,
    ) -> int:
        """publish_document() for a stream of documents, chunked in batches (tokenized in parallel,
        off the GIL, so the producer's I/O thread keeps sending); returns the total chunk count."""
        total = 0
        batch: list[Document] = []
        for doc in docs:
            batch.append(Document.coerce(doc))
            if len(batch) >= batch_size:
                total += self._publish_batch(batch, chunker, replace)
                batch = []
        if batch:
            total += self._publish_batch(batch, chunker, replace)
        return total

    def _publish_batch(self, batch: list[Document], chunker: Chunker, replace: bool) -> int:
        chunked = chunker.chunk_many([doc.text for doc in batch])
        encoded = iter(chunker.token_ids_many([c for chunks in chunked for c in chunks]))  # one batched call
        return sum(self._publish_chunks(doc, chunks, replace, ids=_ids(chunker.ids, chunks, encoded))
                   for doc, chunks in zip(batch, chunked))

    def publish_chunks(self, document: Document, chunks: list[str], trim: bool = True, record: bool = False,
                       ids: ChunkIds | None = None, fields: dict[str, str | None] | None = None) -> int:
        """Publish already-chunked text (a documents-log record only with ``record``, e.g. from the CDC
        bridge; a replay must not); with ``trim`` a delete of the chunks past the new count follows, so
        a document that shrank loses its leftover chunks. With ``ids`` (a model chunker's ``ids``) the
        chunks carry their token ids; ``fields`` (the source's text fields) go into the documents-log record."""
        return self._publish_chunks(document, chunks, trim, record=record, ids=_ids(ids, chunks), fields=fields)

    def _publish_chunks(self, document: Document, chunks: list[str], trim: bool, record: bool = True,
                        ids: tuple[ChunkIds, list[str | None]] | None = None,
                        fields: dict[str, str | None] | None = None) -> int:
        created = now_ms()
        if self.record_documents and record:
            record_event = DocumentRecord(doc_id=document.doc_id, text=document.text, metadata=document.metadata,
                                          created_at_ms=created, fields=fields)
            self._send(document.doc_id, encode(record_event), self.settings.topic_documents)
        for index, text in enumerate(chunks):
            token_ids = ids[1][index] if ids is not None else None
            pretokenized = {} if token_ids is None else {
                "token_ids": token_ids, "token_dtype": ids[0].dtype, "tokenizer": ids[0].fingerprint}
            self.publish_chunk(
                ChunkEvent(
                    doc_id=document.doc_id,
                    chunk_id=index,
                    text=text,
                    metadata=document.metadata,
                    collection=self.collection,
                    model=self.model,
                    content_hash=content_hash(text),
                    lane=self.lane,
                    created_at_ms=created,
                    **pretokenized,
                )
            )
        if trim:
            self.publish_delete(DocumentDelete(doc_id=document.doc_id, from_chunk=len(chunks), collection=self.collection))
        return len(chunks)

    def publish_chunk(self, event: ChunkEvent) -> None:
        """Send one chunk event as is (keyed by its doc_id)."""
        self._send(event.doc_id, encode(event))

    def publish_delete(self, event: DocumentDelete) -> None:
        """Send a delete; it is applied after the document's earlier events on this lane."""
        self._send(event.doc_id, encode(event))

    def delete_document(self, doc_id: str) -> None:
        """Delete every chunk of a document and tombstone it in the documents log (replays skip it)."""
        self.publish_delete(DocumentDelete(doc_id=doc_id, collection=self.collection))
        if self.record_documents:
            self._send(doc_id, None, self.settings.topic_documents)

    def _send(self, doc_id: str, value: bytes | None, topic: str | None = None) -> None:
        """Queue one record; while librdkafka's local queue is full, serve delivery reports until it has room."""
        target = topic or self.topic
        while True:
            try:
                self._producer.produce(target, key=doc_id.encode("utf-8"), value=value, on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.1)
            except KafkaException as exc:  # refused before sending (too large for the producer, bad topic name)
                self._on_failure(exc.args[0], target)
                break
        self._producer.poll(0)  # delivery reports of earlier sends
        if topic is None:
            with self._lock:
                self.sent += 1  # lane events only

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._on_failure(error, message.topic())

    def _on_failure(self, error: RdKafkaError, topic: str) -> None:
        with self._lock:
            self._failures += 1
            if self._first_failure is None:
                self._first_failure = as_kafka_error(error)
        log.error("publish failed", topic=topic, error=error.str())

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every send is acknowledged; raise PublishError if any failed since the last flush."""
        left = self._producer.flush() if timeout_s is None else self._producer.flush(timeout_s)
        if left:
            raise PublishError(f"flush to {self.topic} did not complete: {left} record(s) not acknowledged "
                               f"within {timeout_s:g} s") from kafka_errors.KafkaTimeoutError()
        with self._lock:
            failures, first = self._failures, self._first_failure
            self._failures, self._first_failure = 0, None
        if failures:
            raise PublishError(f"{failures} record(s) to {self.topic} failed; first error: {first!r}") from first

    def close(self, timeout_s: float = 30.0) -> None:
        """Flush and close the producer."""
        self.flush(timeout_s)  # librdkafka's producer has no close: it goes with its last reference

    def __enter__(self) -> ChunkPublisher:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # do not mask the original error with a flush failure
            try:
                self.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the publisher after an error failed", topic=self.topic)


def _ids(ids: ChunkIds | None, chunks: list[str], encoded=None) -> tuple[ChunkIds, list[str | None]] | None:
    """The chunks' wire ids with what made them: taken from ``encoded`` (an iterator over a batch's
    ids, in order) or encoded now; None without a model chunker."""
    if ids is None:
        return None
    return ids, [next(encoded) for _ in chunks] if encoded is not None else ids.encode(chunks)
