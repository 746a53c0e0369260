"""Wire formats of embedstream's Kafka topics: versioned pydantic models and their JSON codec."""

from embedstream.schemas.codec import DecodeError, decode, encode
from embedstream.schemas.events import (
    CHUNK_TOPIC_ADAPTER,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    WIRE_MODELS,
    ChunkEvent,
    ChunkTopicEvent,
    DeadLetter,
    DocumentDelete,
    DocumentRecord,
    Dtype,
    ErrorInfo,
    Lane,
    QueryReply,
    QueryRequest,
    content_hash,
    now_ms,
)
from embedstream.schemas.export import export_json_schemas

__all__ = [
    "CHUNK_TOPIC_ADAPTER",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "WIRE_MODELS",
    "ChunkEvent",
    "ChunkTopicEvent",
    "DeadLetter",
    "DecodeError",
    "DocumentDelete",
    "DocumentRecord",
    "Dtype",
    "ErrorInfo",
    "Lane",
    "QueryReply",
    "QueryRequest",
    "content_hash",
    "decode",
    "encode",
    "export_json_schemas",
    "now_ms",
]

from embedstream.schemas.rerank import (  # noqa: E402 - appended: rerank and search wire models
    RERANK_WIRE_MODELS,
    Candidate,
    RankedResult,
    RerankReply,
    RerankRequest,
    SearchHit,
    SearchReply,
    SearchRequest,
)

__all__ += [
    "RERANK_WIRE_MODELS",
    "Candidate",
    "RankedResult",
    "RerankReply",
    "RerankRequest",
    "SearchHit",
    "SearchReply",
    "SearchRequest",
]
