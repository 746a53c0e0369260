"""What a failed write means for its records: transient (back off), permanent (dead-letter), unknown (bounded)."""

from __future__ import annotations

import hashlib

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from embedstream.producers.publisher import PublishError
from embedstream.vectorstore.base import CollectionConfigMismatch
from embedstream.workers.transport.lane import PERMANENT, TRANSIENT, UNKNOWN, failure_kind
from embedstream.workers.transport.outbox import DEAD_LETTER_PREFIX_BYTES, bounded_raw_value


def _http(status: int) -> UnexpectedResponse:
    return UnexpectedResponse(status_code=status, reason_phrase="x", content=b"{}", headers={})


def _wrapped(cause: BaseException) -> PublishError:
    try:
        raise PublishError("flush failed") from cause
    except PublishError as exc:
        return exc


@pytest.mark.parametrize("exc, kind", [
    (ConnectionError("qdrant unavailable"), TRANSIENT),
    (TimeoutError("timed out"), TRANSIENT),
    (ResponseHandlingException(OSError("connection reset")), TRANSIENT),
    (_http(503), TRANSIENT),
    (_http(429), TRANSIENT),
    (KafkaTimeoutError("no metadata"), TRANSIENT),
    (KafkaConnectionError("broker away"), TRANSIENT),
    (_wrapped(KafkaTimeoutError("flush timed out")), TRANSIENT),
    (_http(400), PERMANENT),
    (_http(404), PERMANENT),
    (CollectionConfigMismatch("collection 'x' has full size 3, wanted 384"), PERMANENT),
    (ValueError("vector 'full': expected 3 dims"), PERMANENT),
    (MessageSizeTooLargeError("too large"), PERMANENT),
    (_wrapped(MessageSizeTooLargeError("too large")), PERMANENT),
    (RuntimeError("something odd"), UNKNOWN),
    (_wrapped(RuntimeError("odd")), UNKNOWN),
])
def test_failure_kinds(exc, kind):
    assert failure_kind(exc) == kind


def test_a_raw_value_that_fits_is_kept_whole():
    assert bounded_raw_value(b"abc", 10) == (b"abc", "")
    assert bounded_raw_value(None, 10) == (b"", "")


def test_a_raw_value_too_large_keeps_a_prefix_its_size_and_digest():
    raw = bytes(range(256)) * 1000  # 256,000 bytes
    kept, note = bounded_raw_value(raw, 100_000)
    assert kept == raw[:DEAD_LETTER_PREFIX_BYTES]
    assert "256,000 bytes" in note and hashlib.sha256(raw).hexdigest() in note
    kept, _ = bounded_raw_value(raw, 1_000)  # a limit below the usual prefix wins
    assert kept == raw[:1_000]
