"""HTTP errors of the gateway: one exception type, status codes chosen once, three envelope dialects.

Status rules (the issue's, close to TEI's): 400 malformed JSON, 404 unknown model or collection,
413 past a count / byte / token limit, 422 a request that parses but cannot be served as asked,
424 the model or worker failed, 429 overload (with ``Retry-After``), 503 no Kafka client, 504 the
deadline passed. Worker error replies carry a stable ``code``; ``from_worker`` maps it.
"""

from __future__ import annotations

from typing import Literal

from embedstream.errors import CodedError
from embedstream.schemas.events import ErrorInfo

Dialect = Literal["openai", "tei", "cohere"]

_STATUS_BY_CODE: dict[str, int] = {
    "too_long": 413, "text_too_large": 413, "record_too_large": 413, "too_many_candidates": 413,
    "too_many_inputs": 413, "body_too_large": 413,
    "unknown_model": 404, "unknown_collection": 404, "collection_not_allowed": 403,
    "deadline_exceeded": 504, "embed_timeout": 504,
    "not_a_string": 422, "empty_text": 422, "empty_query": 422, "no_candidates": 422, "bad_dimensions": 422,
    "bad_dtype": 422, "invalid_event": 422, "unknown_schema_version": 422, "malformed_json": 422,
}

# TEI's error_type vocabulary, by status
_TEI_TYPE = {400: "validation", 403: "validation", 404: "validation", 413: "validation", 422: "validation", 424: "backend",
             429: "overloaded", 503: "unhealthy", 504: "backend"}
# OpenAI's error "type", by status
_OPENAI_TYPE = {429: "rate_limit_error", 424: "api_error", 503: "api_error", 504: "timeout"}


class ApiError(CodedError):
    """A refusal with its HTTP status, a stable code, the offending field (``param``) and an optional retry hint."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 retry_after_s: int | None = None):
        super().__init__(code, message)
        self.status, self.param, self.retry_after_s = status, param, retry_after_s

    @classmethod
    def from_worker(cls, error: ErrorInfo) -> ApiError:
        """A worker's error reply: its code decides the status; unknown codes are model failures (424)."""
        return cls(_STATUS_BY_CODE.get(error.code, 424), error.code, error.message)

    def body(self, dialect: Dialect) -> dict:
        """The error envelope each client family parses."""
        if dialect == "openai":
            kind = _OPENAI_TYPE.get(self.status, "invalid_request_error")
            return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        if dialect == "cohere":
            return {"message": self.message, "code": self.code}
        return {"error": self.message, "error_type": _TEI_TYPE.get(self.status, "validation"), "code": self.code}

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)} if self.retry_after_s is not None else {}
