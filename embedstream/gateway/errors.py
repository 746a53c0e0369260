"""HTTP errors of the gateway: one exception type, status codes chosen once, three envelope dialects.

Status rules (TEI 1.9's where it has one): 400 malformed JSON or an empty input (TEI's ``Empty``),
403 a collection not allowed, 404 an unknown collection, 413 past a count or byte limit, 422 a request
that parses but cannot be served as asked (an over-long input when truncation is off), 424 the model or
worker failed (a worker serving another model than the gateway's), 429 overload (with ``Retry-After``),
503 no Kafka client, 504 the deadline passed. OpenAI answers every invalid request with 400, never
422: its dialect turns 422 into 400. Worker error replies carry a stable ``code``; ``from_worker`` maps it.
"""

from __future__ import annotations

from typing import Literal

from embedstream.errors import CodedError
from embedstream.schemas.events import ErrorInfo

Dialect = Literal["openai", "tei", "cohere"]

EMPTY_CODES = frozenset({"empty_input", "empty_text", "empty_query", "no_candidates"})

_STATUS_BY_CODE: dict[str, int] = {
    "too_long": 422, "text_too_large": 413, "record_too_large": 413, "too_many_candidates": 413,
    "too_many_inputs": 413, "body_too_large": 413, "reply_too_large": 413,
    "unknown_collection": 404, "collection_not_allowed": 403,
    "deadline_exceeded": 504, "embed_timeout": 504,
    **{code: 400 for code in EMPTY_CODES},
    "not_a_string": 422, "bad_dimensions": 422,
    "bad_dtype": 422, "invalid_event": 422, "unknown_schema_version": 422, "malformed_json": 422,
}

# TEI's ErrorType enum, serialised as written (Unhealthy | Backend | Overloaded | Validation | Tokenizer | Empty)
TEI_ERROR_TYPES = ("Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty")
_TEI_TYPE = {424: "Backend", 429: "Overloaded", 500: "Backend", 503: "Unhealthy", 504: "Backend"}
_TEI_TYPE_BY_CODE = {**{code: "Empty" for code in EMPTY_CODES}, "invalid_token_id": "Tokenizer"}
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

    def status_for(self, dialect: Dialect) -> int:
        """The HTTP status in ``dialect``: OpenAI answers an invalid request with 400, never 422."""
        return 400 if dialect == "openai" and self.status == 422 else self.status

    def tei_type(self) -> str:
        return _TEI_TYPE_BY_CODE.get(self.code) or _TEI_TYPE.get(self.status, "Validation")

    def body(self, dialect: Dialect) -> dict:
        """The error envelope each client family parses."""
        if dialect == "openai":
            kind = _OPENAI_TYPE.get(self.status_for(dialect), "invalid_request_error")
            return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
        if dialect == "cohere":
            return {"message": self.message, "code": self.code}
        return {"error": self.message, "error_type": self.tei_type(), "code": self.code}

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)} if self.retry_after_s is not None else {}
