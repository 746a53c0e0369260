"""Wire models exchanged over Kafka, one pydantic model per message kind.

Every message carries ``schema_version`` (a ``Literal``), so a record written by a newer producer
fails validation loudly instead of being half-understood. Field names are the JSON keys; other
languages can produce against the JSON Schemas written by :mod:`embedstream.schemas.export`.
"""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

SCHEMA_VERSION: Literal[1] = 1
SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = (1,)

Lane = Literal["online", "bulk"]
Dtype = Literal["float32", "float16", "int8", "binary"]
PromptKind = Literal["query", "document"]

NonEmptyStr = Annotated[str, Field(min_length=1)]
SHA256_HEX_PATTERN = r"^[0-9a-f]{64}$"


def content_hash(text: str) -> str:
    """sha256 hex digest of the UTF-8 text: lets the sink skip re-embedding unchanged chunks."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def now_ms() -> int:
    """Wall-clock epoch milliseconds, the unit of every timestamp on the wire."""
    return time.time_ns() // 1_000_000


class WireModel(BaseModel):
    """Base of every Kafka message: versioned, unknown keys ignored (additive evolution)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_version: Literal[1] = Field(default=SCHEMA_VERSION, description="Wire format version of this message")


class ErrorInfo(BaseModel):
    """A machine-readable code plus a message a person can act on."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(description="Stable identifier, e.g. 'too_long', 'invalid_event'")
    message: str


class ChunkEvent(WireModel):
    """One chunk of a document to embed and upsert; keyed by doc_id so a document's events stay ordered."""

    kind: Literal["chunk"] = "chunk"
    doc_id: NonEmptyStr
    chunk_id: int = Field(ge=0, description="Index of the chunk within its document")
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict, description="Stored as point payload")
    collection: str | None = Field(default=None, description="Target collection; None = the sink's default")
    model: str | None = Field(default=None, description="Embedding model name; None = the worker's default")
    content_hash: str = Field(
        default_factory=lambda data: content_hash(data.get("text", "")),
        pattern=SHA256_HEX_PATTERN,
        description="sha256 hex of text; computed when absent, trusted when given",
    )
    lane: Lane | None = None
    created_at_ms: int | None = Field(default=None, description="Epoch ms when the producer made the event")

    @field_validator("content_hash", mode="before")
    @classmethod
    def _lowercase_hash(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class DocumentDelete(WireModel):
    """Remove chunks of a document; shares the chunk topics so it is ordered after earlier upserts."""

    kind: Literal["delete"] = "delete"
    doc_id: NonEmptyStr
    chunk_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None, description="Chunks to remove; None (and no from_chunk) = every chunk of the document"
    )
    from_chunk: int | None = Field(
        default=None, ge=0,
        description="Remove every chunk with chunk_id >= from_chunk: what is left over when a document shrinks",
    )
    collection: str | None = None


ChunkTopicEvent = Annotated[Union[ChunkEvent, DocumentDelete], Field(discriminator="kind")]
"""What a chunk topic carries: upserts and deletes, told apart by ``kind``."""

CHUNK_TOPIC_ADAPTER: TypeAdapter[ChunkEvent | DocumentDelete] = TypeAdapter(ChunkTopicEvent)


class QueryRequest(WireModel):
    """Embed one query text now (online path) and reply on ``reply_to`` under the same request_id."""

    request_id: NonEmptyStr
    text: str
    model: str | None = None
    dimensions: int | None = Field(default=None, ge=1, description="Matryoshka truncation; None = full size")
    dtype: Dtype = "float32"
    prompt: PromptKind | None = Field(default="query", description="Which model prompt to prepend, if any")
    reply_to: NonEmptyStr = Field(description="Topic the reply is produced to")
    deadline_ms: int | None = Field(default=None, description="Epoch ms after which workers may drop the request")
    sent_at_ms: int | None = None


class QueryReply(WireModel):
    """The embedding of a QueryRequest, or the error that prevented it."""

    request_id: NonEmptyStr
    embedding: list[float] | list[int] | None = Field(
        default=None, description="Floats for float32/float16, ints for int8/binary (packed bits)"
    )
    dims: int | None = None
    dtype: Dtype = "float32"
    scale: float | None = Field(default=None, description="int8 only: value = int * scale")
    tokens: int | None = None
    truncated: bool = False
    model: str | None = None
    timings_ms: dict[str, float] = Field(default_factory=dict)
    error: ErrorInfo | None = None


class DeadLetter(WireModel):
    """A record a worker could not process, kept verbatim with the reason, for inspection or replay."""

    source_topic: str
    partition: int
    offset: int
    key: str | None = None
    raw_value: str = Field(description="The record value: UTF-8 text, or base64 when raw_encoding says so")
    raw_encoding: Literal["utf-8", "base64"] = "utf-8"
    error: ErrorInfo
    worker: str | None = None
    failed_at_ms: int

    @classmethod
    def from_record(
        cls,
        source_topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        error: ErrorInfo,
        worker: str | None = None,
        failed_at_ms: int | None = None,
    ) -> DeadLetter:
        """Wrap a raw Kafka record, keeping its bytes exactly (base64 when they are not UTF-8)."""
        raw = bytes(value or b"")
        try:
            raw_value, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            raw_value, encoding = base64.b64encode(raw).decode("ascii"), "base64"
        return cls(
            source_topic=source_topic,
            partition=partition,
            offset=offset,
            key=None if key is None else bytes(key).decode("utf-8", "backslashreplace"),
            raw_value=raw_value,
            raw_encoding=encoding,
            error=error,
            worker=worker,
            failed_at_ms=now_ms() if failed_at_ms is None else failed_at_ms,
        )

    def raw_bytes(self) -> bytes:
        """The original record value, for replay."""
        if self.raw_encoding == "base64":
            return base64.b64decode(self.raw_value)
        return self.raw_value.encode("utf-8")


class DocumentRecord(WireModel):
    """The latest full text of a document, on the compacted documents topic (key = doc_id).

    It is the replayable source of truth: a re-index reads these records and chunks them again
    (with another model or chunk size); a null value (tombstone) under the key means "deleted".
    """

    kind: Literal["document"] = "document"
    doc_id: NonEmptyStr
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at_ms: int | None = None


WIRE_MODELS: tuple[type[WireModel], ...] = (ChunkEvent, DocumentDelete, DocumentRecord, QueryRequest, QueryReply, DeadLetter)
