"""The dev broker's one error type."""

from __future__ import annotations

from embedstream.errors import CodedError


class DevKafkaError(CodedError, RuntimeError):
    """The dev broker could not be provisioned, started or stopped; the message says why.

    A :class:`CodedError` (code ``dev_kafka``) so the CLI ends it as one line; still a
    ``RuntimeError`` for callers that caught it as one before.
    """

    code = "dev_kafka"

    def __init__(self, message: str, code: str = "dev_kafka"):
        super().__init__(code, message)
