"""What a worker sends besides its results: dead letters and request replies, through one producer.

A record whose outcome is a dead letter or a reply counts as finished only once the broker
acknowledged it; until then its offset is not committed. A reply that cannot be delivered (a bad
``reply_to``: an invalid or internal topic name, one the broker refuses) becomes a dead letter with
the reason instead of an exception in the loop. A dead letter too large for the producer keeps a
bounded prefix of the raw value, with the full value's size and sha256 digest in the reason.
"""

from __future__ import annotations

import hashlib
import threading

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.schemas import DeadLetter, ErrorInfo
from embedstream.schemas.codec import encode
from embedstream.workers.kafka_io import new_producer
from embedstream.workers.offsets import OffsetTracker

log = logs.get("embedstream.worker")

DEAD_LETTER_PREFIX_BYTES = 64 * 1024  # what an oversized dead letter keeps of the raw value
_ENVELOPE_MARGIN_BYTES = 4 * 1024  # record batch header, key, the letter's other fields


def bounded_raw_value(value: bytes | None, limit: int) -> tuple[bytes, str]:
    """The raw value if it fits ``limit``; else its first bytes and a note of its size and sha256."""
    raw = bytes(value or b"")
    if len(raw) <= limit:
        return raw, ""
    prefix = raw[: min(DEAD_LETTER_PREFIX_BYTES, limit)]
    note = (f" [raw value cut to its first {len(prefix):,} of {len(raw):,} bytes; "
            f"sha256 of the whole value {hashlib.sha256(raw).hexdigest()}]")
    return prefix, note


class Outbox:
    """Dead letters and replies of one worker; ``settle`` before committing."""

    def __init__(self, kafka: KafkaSettings, worker_id: str, metrics, producer=None):
        self.kafka = kafka
        self.worker_id = worker_id
        self.metrics = metrics
        self.producer = producer if producer is not None else new_producer(kafka)
        max_request = int(self.producer.config.get("max_request_size", 1024 * 1024))
        # JSON escaping or base64 can grow a value by a third; keep the letter under the request limit
        self.max_raw_bytes = max(1024, (max_request - _ENVELOPE_MARGIN_BYTES) * 3 // 4)
        self._undelivered: list[tuple[object, ErrorInfo, list, str]] = []
        self._lock = threading.Lock()

    def dead_letter(self, record, error: ErrorInfo, handle: list, lane: str) -> None:
        """Publish the record with its reason; its offset becomes committable when the broker acks."""
        raw, note = bounded_raw_value(record.value, self.max_raw_bytes)
        if note:
            error = ErrorInfo(code=error.code, message=error.message + note)
        letter = DeadLetter.from_record(record.topic, record.partition, record.offset, record.key, raw,
                                        error, worker=self.worker_id)
        future = self.producer.send(self.kafka.topic_dead_letters, key=record.key, value=encode(letter))
        future.add_callback(lambda _meta: OffsetTracker.done(handle))
        future.add_errback(lambda exc: log.error("dead letter not written", error=str(exc)[:300],
                                                 topic=record.topic, partition=record.partition, offset=record.offset))
        self.metrics.dead_letters.labels(lane=lane, code=error.code).inc()
        log.warning("dead-lettered", topic=record.topic, partition=record.partition, offset=record.offset,
                    code=error.code, reason=error.message[:500])

    def reply(self, record, request, reply, handle: list, lane: str) -> None:
        """Answer on the request's own reply topic, keyed by its correlation id; finished once acked.

        A reply the client or the broker refuses is dead-lettered (``reply_failed``) at the next
        ``settle``; the request's offset stays uncommitted until then."""
        try:
            future = self.producer.send(request.reply_to, key=request.request_id.encode(), value=encode(reply))
        except Exception as exc:  # noqa: BLE001 - invalid topic name, value too large, ...: the record's fault
            self._refused(record, request, exc, handle, lane)
            return
        future.add_callback(lambda _meta: OffsetTracker.done(handle))
        future.add_errback(lambda exc: self._refused(record, request, exc, handle, lane))

    def _refused(self, record, request, exc: BaseException, handle: list, lane: str) -> None:
        reason = ErrorInfo(code="reply_failed", message=f"the reply to {request.reply_to[:300]!r} could not be "
                                                        f"delivered: {type(exc).__name__}: {str(exc)[:300]}")
        with self._lock:  # errbacks run on the producer's IO thread: dead-letter from the loop's thread
            self._undelivered.append((record, reason, handle, lane))

    def settle(self, timeout_s: float) -> None:
        """Wait for the acks of everything sent; dead-letter the replies that could not be delivered."""
        self._flush(timeout_s)
        with self._lock:
            undelivered, self._undelivered = self._undelivered, []
        for record, reason, handle, lane in undelivered:
            self.dead_letter(record, reason, handle, lane)
        if undelivered:
            self._flush(timeout_s)

    def _flush(self, timeout_s: float) -> None:
        try:
            self.producer.flush(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 - a producer that cannot flush leaves those records uncommitted
            log.error("dead letters or replies not acknowledged; committing only finished work", error=str(exc)[:300])

    def close(self) -> None:
        self.producer.close()
