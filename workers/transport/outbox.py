"""What a worker sends besides its results: dead letters (one producer), request replies and requests handed on
(another: ``producers.live_partitions``, unkeyed, on partitions whose leaders answer).

A record whose outcome is a dead letter or a reply counts as finished only once the broker
acknowledged it; until then its offset is not committed. Nothing here waits for an acknowledgement
while the lanes run: ``settle`` serves the reports that arrived and returns, so a reply queued for a
partition whose leader died holds back only its own record's offset, never the poll loop (it used to
flush, up to 30 s, every commit). ``close`` waits, with a bound. A reply that cannot be delivered (a bad
``reply_to``: an invalid or internal topic name, one the broker refuses) becomes a dead letter with
the reason instead of an exception in the loop. A dead letter too large for the producer keeps a
bounded prefix of the raw value, with the full value's size and sha256 digest in the reason.
"""

from __future__ import annotations

import hashlib
import threading
import time

from confluent_kafka import KafkaException

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.producers.live_partitions import LiveSender, live_producer
from embedstream.schemas import DeadLetter, ErrorInfo
from embedstream.schemas.codec import encode
from embedstream.workers.transport.kafka_io import MAX_REQUEST_BYTES, new_producer
from embedstream.workers.transport.offsets import OffsetTracker

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

    def __init__(self, kafka: KafkaSettings, worker_id: str, metrics):
        self.kafka = kafka
        self.worker_id = worker_id
        self.metrics = metrics
        self.producer = new_producer(kafka)  # dead letters: acks=all, idempotent
        self.live = LiveSender(live_producer(kafka, "embedstream-worker-replies", 120.0,  # replies, requests handed on
                                             **{"message.max.bytes": MAX_REQUEST_BYTES}))
        # JSON escaping or base64 can grow a value by a third; keep the letter under the request limit
        self.max_raw_bytes = max(1024, (MAX_REQUEST_BYTES - _ENVELOPE_MARGIN_BYTES) * 3 // 4)
        self._undelivered: list[tuple[object, ErrorInfo, list, str]] = []
        self._lock = threading.Lock()

    def dead_letter(self, record, error: ErrorInfo, handle: list, lane: str) -> None:
        """Publish the record with its reason; its offset becomes committable when the broker acks."""
        raw, note = bounded_raw_value(record.value, self.max_raw_bytes)
        if note:
            error = ErrorInfo(code=error.code, message=error.message + note)
        letter = DeadLetter.from_record(record.topic, record.partition, record.offset, record.key, raw,
                                        error, worker=self.worker_id)
        def delivered(error, _message) -> None:
            if error is None:
                OffsetTracker.done(handle)
            else:  # the offset stays uncommitted: the record comes again after a restart
                log.error("dead letter not written", error=error.str()[:300], topic=record.topic,
                          partition=record.partition, offset=record.offset)

        try:
            self._produce(self.kafka.topic_dead_letters, record.key, encode(letter), delivered)
        except KafkaException as exc:
            delivered(exc.args[0], None)
        self.metrics.dead_letters.labels(lane=lane, code=error.code).inc()
        log.warning("dead-lettered", topic=record.topic, partition=record.partition, offset=record.offset,
                    code=error.code, reason=error.message[:500])

    def reply(self, record, request, reply, handle: list, lane: str) -> None:
        """Answer on the request's own reply topic (unkeyed: the correlation id is in the value); finished once acked.

        A reply the client or the broker refuses is dead-lettered (``reply_failed``) at the next
        ``settle``; the request's offset stays uncommitted until then."""
        def delivered(error, _message) -> None:
            if error is None:
                OffsetTracker.done(handle)
            else:
                self._refused(record, request, error.str(), handle, lane)

        try:
            self._produce(request.reply_to, None, encode(reply), delivered, live=True)
        except (KafkaException, ValueError, TypeError) as exc:  # value too large, bad topic name: the record's fault
            self._refused(record, request, f"{type(exc).__name__}: {exc}", handle, lane)

    def forward(self, record, topic: str, request, handle: list, lane: str) -> None:
        """Hand a request on to the workers that answer it (their topic, unkeyed as the client sent it); finished
        once acked. One the broker refuses is dead-lettered (``forward_failed``) at the next ``settle``."""
        def failed(reason: str) -> None:
            self._undeliverable(record, ErrorInfo(code="forward_failed", message=(
                f"handing the request on to {topic[:300]!r} failed: {reason[:300]}")), handle, lane)

        def delivered(error, _message) -> None:
            if error is None:
                OffsetTracker.done(handle)
            else:
                failed(error.str())

        try:
            self._produce(topic, None, encode(request), delivered, live=True)
        except KafkaException as exc:
            failed(exc.args[0].str())

    def _produce(self, topic: str, key: bytes | None, value: bytes, on_delivery, live: bool = False) -> None:
        """Queue a record; while librdkafka's local queue is full, serve delivery reports until it has room (the
        sending stage pauses, the lanes' loop does not)."""
        producer = self.live.producer if live else self.producer
        while True:
            try:
                if live:
                    self.live.send(topic, value, on_delivery)
                else:
                    producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
                producer.poll(0)  # serve reports of earlier sends (and librdkafka's log lines)
                return
            except BufferError:
                producer.poll(0.1)

    def _refused(self, record, request, reason_text: str, handle: list, lane: str) -> None:
        reason = ErrorInfo(code="reply_failed", message=f"the reply to {request.reply_to[:300]!r} could not be "
                                                        f"delivered: {reason_text[:300]}")
        self._undeliverable(record, reason, handle, lane)

    def _undeliverable(self, record, reason: ErrorInfo, handle: list, lane: str) -> None:
        with self._lock:  # reports run on whichever thread polls: dead-letter from the settling thread
            self._undelivered.append((record, reason, handle, lane))

    def settle(self, timeout_s: float = 0.0) -> None:
        """Serve the acknowledgements that arrived (their records' offsets become committable) and dead-letter
        the replies that could not be delivered; ``timeout_s`` > 0 (closing): wait that long for the rest.

        Records not acknowledged yet stay uncommitted: the lane commits what finished and polls on."""
        self._wait(timeout_s)
        with self._lock:
            undelivered, self._undelivered = self._undelivered, []
        for record, reason, handle, lane in undelivered:
            self.dead_letter(record, reason, handle, lane)
        if undelivered:
            self._wait(timeout_s)

    def _wait(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            self.live.producer.poll(0)
            self.producer.poll(0)
            return
        started = time.monotonic()
        left = self.live.producer.flush(timeout_s)
        left += self.producer.flush(max(0.0, timeout_s - (time.monotonic() - started)))
        if left:  # those records stay uncommitted until acknowledged
            log.error("dead letters or replies not acknowledged; committing only finished work", unacknowledged=left,
                      waited_s=round(time.monotonic() - started, 1))

    def close(self) -> None:
        self._wait(10.0)
