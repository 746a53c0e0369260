"""Response bodies as pydantic models: what each route answers, for the OpenAPI document.

The routes write their JSON directly (orjson, numpy arrays as they are: a 2,048-vector answer is not
built through pydantic); these models say what that JSON is, the live fuzz test checks every answer
against them (tests/kafka/test_gateway_contract.py), and the request models are in ``bodies``.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from embedstream.schemas.rerank import SearchHit

TeiErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class _Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class TeiError(_Reply):
    """TEI's ErrorResponse, plus embedstream's stable ``code``."""

    error: str
    error_type: TeiErrorType = Field(description="TEI's ErrorType, as TEI serialises it")
    code: str = Field(description="embedstream's stable error code (e.g. too_long, empty_input, overloaded)")


class OpenAIErrorBody(_Reply):
    message: str
    type: str
    param: str | None
    code: str


class OpenAIError(_Reply):
    """OpenAI's error envelope."""

    error: OpenAIErrorBody


class CohereError(_Reply):
    """Cohere's error body, plus embedstream's stable ``code``."""

    message: str
    code: str


class Health(_Reply):
    status: Literal["ok"]


class Alive(_Reply):
    alive: Literal[True]


class EmbeddingModelType(_Reply):
    pooling: str


class ModelType(_Reply):
    embedding: EmbeddingModelType


class SparseModel(_Reply):
    kind: str
    model_id: str


class RerankerInfo(_Reply):
    model_id: str
    max_input_length: int
    activation: str


class Info(_Reply):
    """TEI's Info (every key TEI sends), plus what embedstream adds."""

    model_id: str
    model_sha: str | None = Field(description="Always null: the weights are a local folder")
    model_dtype: str
    served_model_name: str
    model_type: ModelType
    max_concurrent_requests: int = Field(ge=0)
    max_input_length: int = Field(ge=0)
    max_batch_tokens: int = Field(ge=0)
    max_batch_requests: int | None = Field(ge=0)
    max_client_batch_size: int = Field(ge=0)
    auto_truncate: bool
    tokenization_workers: int = Field(ge=0)
    version: str
    sha: str | None
    docker_label: str | None
    dimensions: int
    matryoshka_dimensions: list[int]
    normalize: bool
    max_body_bytes: int
    max_text_bytes: int
    topics: dict[str, str]
    sparse_model: SparseModel | None = None
    reranker: RerankerInfo | None = None


EmbedResponse = list[list[float]]
EmbedAllResponse = list[list[list[float]]]
SimilarityResponse = list[float]
DecodeResponse = list[str]


class SparseValue(_Reply):
    index: int = Field(ge=0)
    value: float


EmbedSparseResponse = list[list[SparseValue]]


class SimpleToken(_Reply):
    id: int = Field(ge=0)
    text: str
    special: bool
    start: int | None
    stop: int | None


TokenizeResponse = list[list[SimpleToken]]


class Rank(_Reply):
    index: int = Field(ge=0)
    score: float
    text: str = Field(default="", description="Only when return_text was asked")


RerankResponse = list[Rank]


class OpenAIEmbedding(_Reply):
    object: Literal["embedding"]
    index: int = Field(ge=0)
    embedding: Union[list[float], str] = Field(description="Floats, or base64 of little-endian float32")


class OpenAIUsage(_Reply):
    prompt_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)


class OpenAIEmbeddingsReply(_Reply):
    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str = Field(description="The served model (whatever the request named)")
    usage: OpenAIUsage


class CohereEmbeddings(_Reply):
    float_: list[list[float]] | None = Field(default=None, alias="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereApiVersion(_Reply):
    version: str


class CohereBilled(_Reply):
    input_tokens: int | None = None
    search_units: int | None = None


class CohereMeta(_Reply):
    api_version: CohereApiVersion
    billed_units: CohereBilled


class CohereEmbedReply(_Reply):
    id: str
    response_type: Literal["embeddings_by_type"]
    embeddings: CohereEmbeddings
    texts: list[str]
    meta: CohereMeta


class CohereDocument(_Reply):
    text: str


class CohereRank(_Reply):
    index: int = Field(ge=0)
    relevance_score: float
    document: CohereDocument | None = Field(default=None, description="Only when return_documents was asked")


class CohereRerankReply(_Reply):
    id: str
    model: str
    results: list[CohereRank]
    meta: CohereMeta


class Search(_Reply):
    hits: list[SearchHit]
    collection: str | None
    model: str | None
    timings_ms: dict[str, float]


OpenApiDocument = dict[str, Any]
