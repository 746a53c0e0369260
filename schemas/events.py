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

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)

from embedstream.schemas.bounds import (
    MAX_CHUNK_IDS,
    MAX_DIMENSIONS,
    MAX_SAFE_INTEGER,
    ChunkId,
    CollectionName,
    DocId,
    EpochMs,
    Metadata,
    Name,
    TopicName,
    WireInt,
    bounded_int,
    integral,
)
from embedstream.schemas.token_ids import (
    BASE64_PATTERN,
    MAX_TOKEN_IDS_CHARS,
    TokenDtype,
    count_token_ids,
    decode_token_ids,
)

SCHEMA_VERSION: Literal[1] = 1
SUPPORTED_SCHEMA_VERSIONS: tuple[int, ...] = (1,)

Lane = Literal["online", "bulk"]
Dtype = Literal["float32", "float16", "int8", "binary"]
PromptKind = Literal["query", "document"]

NonEmptyStr = Annotated[str, Field(min_length=1)]
SHA256_HEX_PATTERN = r"^[0-9a-f]{64}$"
TOKENIZER_FINGERPRINT_PATTERN = r"^[0-9a-f]{32}$"


def content_hash(text: str) -> str:
    """sha256 hex digest of the UTF-8 text: lets the sink skip re-embedding unchanged chunks."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def now_ms() -> int:
    """Wall-clock epoch milliseconds, the unit of every timestamp on the wire."""
    return time.time_ns() // 1_000_000


class WireModel(BaseModel):
    """Base of every Kafka message: versioned, unknown keys ignored (additive evolution)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_version: Annotated[Literal[1], BeforeValidator(integral)] = Field(
        default=SCHEMA_VERSION, description="Wire format version of this message"
    )


class ErrorInfo(BaseModel):
    """A machine-readable code plus a message a person can act on."""

    model_config = ConfigDict(extra="ignore")

    code: str = Field(description="Stable identifier, e.g. 'too_long', 'invalid_event'")
    message: str


class ChunkEvent(WireModel):
    """One chunk of a document to embed and upsert; keyed by doc_id so a document's events stay ordered.

    Pre-tokenized chunks also carry ``token_ids`` (see :mod:`embedstream.schemas.token_ids`) and the
    ``tokenizer`` fingerprint they were made with (:func:`embedstream.engine.tokenize.tokenizer_fingerprint`):
    the complete input sequence the model's tokenizer gives for the model's document prompt followed by
    the text, special tokens included. A worker whose model has the same fingerprint embeds the ids
    without tokenizing; any other worker tokenizes ``text``.
    """

    model_config = ConfigDict(json_schema_extra=lambda schema: _chunk_schema(schema))

    kind: Literal["chunk"] = Field(default="chunk", description="Optional on the chunk topics: an event without kind is a chunk")
    doc_id: DocId
    chunk_id: ChunkId
    text: str
    metadata: Metadata = Field(default_factory=dict)
    collection: CollectionName | None = Field(default=None, description="Target collection; None = the sink's default")
    model: Name | None = Field(default=None, description="Embedding model name; None = the worker's default")
    content_hash: str = Field(
        default_factory=lambda data: content_hash(data.get("text", "")),
        pattern=SHA256_HEX_PATTERN,
        description="sha256 hex of text, a hint only: workers compute their own from the text",
    )
    lane: Lane | None = None
    created_at_ms: EpochMs | None = Field(default=None, description="Epoch ms when the producer made the event")
    token_ids: str | None = Field(
        default=None, max_length=MAX_TOKEN_IDS_CHARS, pattern=BASE64_PATTERN,
        json_schema_extra={"contentEncoding": "base64"},
        description="The model input for the document prompt + text, special tokens included: base64 of "
                    "little-endian token_dtype integers; needs tokenizer. Checked by the decoder: 1 to 32768 ids, a whole number of them",
    )
    token_dtype: TokenDtype = Field(default="int32", description="Width of each id in token_ids: uint16 or int32")
    tokenizer: str | None = Field(
        default=None, pattern=TOKENIZER_FINGERPRINT_PATTERN,
        description="Fingerprint of the tokenization that made token_ids (32 hex digits)",
    )

    @field_validator("content_hash", mode="before")
    @classmethod
    def _lowercase_hash(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check_token_ids(self) -> "ChunkEvent":
        if self.token_ids is not None:
            if self.tokenizer is None:
                raise ValueError("token_ids needs the tokenizer fingerprint they were made with")
            count_token_ids(self.token_ids, self.token_dtype)  # shape and count; no decoding at intake
        return self

    def token_id_array(self) -> np.ndarray | None:
        """The ids (a read-only little-endian array, ~1 µs to decode for 200 ids), or None for a text-only chunk."""
        return None if self.token_ids is None else decode_token_ids(self.token_ids, self.token_dtype)


def _chunk_schema(schema: dict[str, Any]) -> None:
    schema["dependentRequired"] = {"token_ids": ["tokenizer"]}
    schema["examples"] = [
        {"doc_id": "guide/intro.md", "chunk_id": 0, "text": "Kafka keeps records in order per partition."},
        {"schema_version": 1, "kind": "chunk", "doc_id": "go-1", "chunk_id": 3, "text": "Grüße ✓",
         "metadata": {"lang": "de", "tags": ["a", "b"]}, "collection": "docs", "lane": "bulk",
         "created_at_ms": 1700000000000},
        {"doc_id": "go-1", "chunk_id": 4, "text": "hello world", "token_ids": "ZQCoHSgIZgA=",
         "token_dtype": "uint16", "tokenizer": "0123456789abcdef0123456789abcdef"},
    ]


class DocumentDelete(WireModel):
    """Remove chunks of a document; shares the chunk topics so it is ordered after earlier upserts.

    ``kind`` is required on the wire (an event without it is read as a chunk); Python code may omit it.
    """

    model_config = ConfigDict(json_schema_extra=lambda schema: _wire_schema(schema, required=("kind",), examples=[
        {"kind": "delete", "doc_id": "guide/intro.md"},
        {"schema_version": 1, "kind": "delete", "doc_id": "go-1", "from_chunk": 4, "collection": "docs_v2"},
        {"kind": "delete", "doc_id": "go-1", "chunk_ids": [0, 2]},
    ]))

    kind: Literal["delete"] = "delete"
    doc_id: DocId
    chunk_ids: list[ChunkId] | None = Field(
        default=None, max_length=MAX_CHUNK_IDS,
        description="Chunks to remove; None (and no from_chunk) = every chunk of the document",
    )
    from_chunk: ChunkId | None = Field(
        default=None,
        description="Remove every chunk with chunk_id >= from_chunk: what is left over when a document shrinks",
    )
    collection: CollectionName | None = None

    @model_validator(mode="before")
    @classmethod
    def _kind_required_on_the_wire(cls, data: Any, info: ValidationInfo) -> Any:
        if info.mode == "json" and isinstance(data, dict) and "kind" not in data:
            raise ValueError("kind is required on the wire: 'delete' (an event without kind is a chunk)")
        return data


def _wire_schema(schema: dict[str, Any], required: tuple[str, ...], examples: list[dict[str, Any]]) -> None:
    """Mark fields that have a Python default as required in JSON, and add examples (in place)."""
    schema["required"] = [*required, *(r for r in schema.get("required", []) if r not in required)]
    schema["examples"] = examples


def _chunk_topic_kind(value: Any) -> str | None:
    """The union's tag: ``kind``, where a JSON object without one is a chunk (as the schema says)."""
    kind = value.get("kind", "chunk") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in ("chunk", "delete") else None


ChunkTopicEvent = Annotated[
    Union[Annotated[ChunkEvent, Tag("chunk")], Annotated[DocumentDelete, Tag("delete")]],
    Discriminator(
        _chunk_topic_kind,
        custom_error_type="invalid_kind",
        custom_error_message="must be 'chunk' (the default when absent) or 'delete'",
    ),
]
"""What a chunk topic carries: upserts and deletes, told apart by ``kind`` (absent = chunk)."""

CHUNK_TOPIC_ADAPTER: TypeAdapter[ChunkEvent | DocumentDelete] = TypeAdapter(ChunkTopicEvent)


class QueryRequest(WireModel):
    """Embed one query text now (online path) and reply on ``reply_to`` under the same request_id."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"request_id": "3f2a", "text": "how do I read a file?", "reply_to": "embedstream.replies"},
        {"schema_version": 1, "request_id": "r-2", "text": "kafka", "model": "all-MiniLM-L6-v2", "dimensions": 256,
         "dtype": "int8", "prompt": None, "reply_to": "embedstream.replies.gw1", "deadline_ms": 1700000000500,
         "sent_at_ms": 1700000000000},
    ]})

    request_id: Name
    text: str
    model: Name | None = None
    dimensions: bounded_int(1, MAX_DIMENSIONS) | None = Field(default=None, description="Matryoshka truncation; None = full size")
    dtype: Dtype = "float32"
    prompt: PromptKind | None = Field(default="query", description="Which model prompt to prepend, if any")
    normalize: bool | None = Field(default=None, description="L2-normalise the vector; None = as the model was trained")
    truncate: bool | None = Field(
        default=None, description="Cut a text over the model's token limit instead of refusing it; None = the model's setting"
    )
    truncation_direction: Literal["right", "left"] = Field(
        default="right", description="Which end a cut text loses: right = its end, left = its start")
    max_tokens: bounded_int(1, MAX_SAFE_INTEGER) | None = Field(
        default=None, description="A token limit below the model's (special tokens included); None = the model's")
    sparse: bool = Field(default=False, description="Also reply with the text's sparse vector (the worker's sparse "
                         "encoder, EMBEDSTREAM_SPARSE__KIND); refused by a worker without one")
    token_embeddings: bool = Field(default=False, description="Also reply with every token's last hidden state "
                                   "(TEI's /embed_all): the packed forward pass's rows of this text")
    reply_to: TopicName = Field(description="Topic the reply is produced to")
    deadline_ms: EpochMs | None = Field(default=None, description="Epoch ms after which workers may drop the request")
    sent_at_ms: EpochMs | None = None


class SparseTerms(BaseModel):
    """A sparse vector on the wire: term ids (ascending) and their weights, aligned."""

    model_config = ConfigDict(extra="ignore")

    indices: list[WireInt]
    values: list[float]

    @classmethod
    def of(cls, vector) -> "SparseTerms | None":
        """From anything with ``indices`` and ``values`` arrays (embedstream.vectors.SparseVector); None stays None."""
        return None if vector is None else cls(indices=vector.indices.tolist(), values=vector.values.tolist())


class QueryReply(WireModel):
    """The embedding of a QueryRequest, or the error that prevented it."""

    request_id: NonEmptyStr
    embedding: list[float] | list[WireInt] | None = Field(
        default=None, description="Floats for float32/float16, ints for int8/binary (packed bits)"
    )
    dims: WireInt | None = None
    dtype: Dtype = "float32"
    scale: float | None = Field(default=None, description="int8 only: value = int * scale")
    tokens: WireInt | None = None
    truncated: bool = False
    model: str | None = None
    timings_ms: dict[str, float] = Field(default_factory=dict)
    error: ErrorInfo | None = None
    sparse: SparseTerms | None = Field(default=None, description="The text's sparse vector, when the request asked")
    token_embeddings: str | None = Field(
        default=None, pattern=BASE64_PATTERN, json_schema_extra={"contentEncoding": "base64"},
        description="When the request asked: every token's last hidden state, base64 of little-endian float32, "
                    "row-major [tokens, token_dims] (special and prompt tokens included)")
    token_dims: WireInt | None = Field(default=None, description="Width of each token_embeddings row")

    @staticmethod
    def encode_token_states(states: np.ndarray) -> str:
        """[tokens, hidden] floats as ``token_embeddings`` carries them (exact float32)."""
        return base64.b64encode(np.ascontiguousarray(states, dtype="<f4").tobytes()).decode("ascii")

    def token_state_array(self) -> np.ndarray | None:
        """``token_embeddings`` as float32 [tokens, token_dims]; None when absent."""
        if self.token_embeddings is None or not self.token_dims:
            return None
        flat = np.frombuffer(base64.b64decode(self.token_embeddings), dtype="<f4")
        if flat.size % self.token_dims:
            raise ValueError(f"token_embeddings holds {flat.size} floats, not a whole number of {self.token_dims}-wide rows")
        return flat.reshape(-1, self.token_dims).astype(np.float32)


class DeadLetter(WireModel):
    """A record a worker could not process, kept verbatim with the reason, for inspection or replay."""

    source_topic: str
    partition: WireInt
    offset: WireInt
    key: str | None = None
    raw_value: str = Field(description="The record value: UTF-8 text, or base64 when raw_encoding says so")
    raw_encoding: Literal["utf-8", "base64"] = "utf-8"
    error: ErrorInfo
    worker: str | None = None
    failed_at_ms: WireInt

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

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"doc_id": "guide/intro.md", "text": "Kafka keeps records in order per partition.\n\nConsumers ...",
         "metadata": {"path": "docs/guide/intro.md"}, "created_at_ms": 1700000000000},
    ]})

    kind: Literal["document"] = "document"
    doc_id: DocId
    text: str
    metadata: Metadata = Field(default_factory=dict)
    created_at_ms: EpochMs | None = None
    fields: dict[str, str | None] | None = Field(
        default=None,
        description="The source row's text fields by name, as ``text`` joins them (the CDC bridge): what fills "
                    "in a field a later change event leaves out (an unchanged TOASTed value)",
    )


WIRE_MODELS: tuple[type[WireModel], ...] = (ChunkEvent, DocumentDelete, DocumentRecord, QueryRequest, QueryReply, DeadLetter)
