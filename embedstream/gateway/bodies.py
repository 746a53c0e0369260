"""Request bodies: read within a byte limit, parse JSON, validate into the shape each API documents.

A body over the limit is read and discarded (never buffered) up to ``DRAIN_LIMIT`` so the client
gets its 413 instead of a reset connection; past that the connection is simply answered and closed.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError
from starlette.requests import Request

from embedstream.gateway.errors import ApiError
from embedstream.ranking import DEFAULT_FUSION, FusionName

M = TypeVar("M", bound=BaseModel)

DRAIN_LIMIT = 256 * 1024 * 1024


async def read_json(request: Request, max_bytes: int) -> Any:
    """The parsed body; 413 past ``max_bytes``, 400 when it is not JSON."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > DRAIN_LIMIT:
        raise ApiError(413, "body_too_large", f"request body is {declared} bytes, over the limit of {max_bytes} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size <= max_bytes:
            chunks.append(chunk)
        elif chunks:
            chunks.clear()  # over the limit: keep reading (bounded) so the client sees the 413
        if size > DRAIN_LIMIT:
            break
    if size > max_bytes:
        raise ApiError(413, "body_too_large", f"request body is {size} bytes, over the limit of {max_bytes} bytes")
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise ApiError(400, "malformed_json", f"request body is not valid JSON: {exc}") from None


def validate(model: type[M], body: Any) -> M:
    """The body as ``model``, or 422 naming the first offending field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise invalid(exc) from None


def invalid(exc: ValidationError) -> ApiError:
    """A pydantic validation failure as a 422 naming the first offending field."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return ApiError(422, "invalid_request", f"{where}: {first['msg']}", param=where)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


TokenIds = list[StrictInt]


class OpenAIEmbeddings(_Body):
    """OpenAI ``POST /v1/embeddings``: text(s) or token ids of the served model's tokenizer (as vLLM)."""

    input: Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None


class TeiEmbed(_Body):
    """TEI ``POST /embed``."""

    inputs: Union[StrictStr, list[StrictStr]]
    normalize: StrictBool = True
    truncate: StrictBool | None = None
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: StrictStr | None = None
    dimensions: StrictInt | None = None


class TeiEmbedSparse(_Body):
    """TEI ``POST /embed_sparse``."""

    inputs: Union[StrictStr, list[StrictStr]]
    truncate: StrictBool | None = None
    truncation_direction: Literal["Right", "Left", "right", "left"] = "Right"
    prompt_name: StrictStr | None = None


class TeiTokenize(_Body):
    """TEI ``POST /tokenize``."""

    inputs: Union[StrictStr, list[StrictStr]]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None


class TeiDecode(_Body):
    """TEI ``POST /decode``."""

    ids: Union[TokenIds, list[TokenIds]]
    skip_special_tokens: StrictBool = True


CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereEmbed(_Body):
    """Cohere ``POST /v2/embed`` (texts only)."""

    texts: list[StrictStr] | None = None
    images: list[Any] | None = None
    model: StrictStr | None = None
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = None
    embedding_types: list[CohereEmbeddingType] | None = None
    output_dimension: StrictInt | None = None
    truncate: Literal["NONE", "START", "END"] | None = None


class DocumentObject(_Body):
    text: StrictStr


class TeiRerank(_Body):
    """TEI ``POST /rerank``: every text scored, sorted by score."""

    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = None


class CohereRerank(_Body):
    """Cohere (v1, v2) and Jina ``POST /v1/rerank``, ``/v2/rerank``: documents as strings or ``{"text": ...}``."""

    query: StrictStr
    documents: list[Union[StrictStr, DocumentObject]]
    model: StrictStr | None = None
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False


class SearchBody(_Body):
    """``POST /search``: embed -> vector search -> rerank, as the rerank worker's SearchRequest."""

    query: StrictStr
    collection: StrictStr | None = None
    top_k: StrictInt = 50
    top_n: StrictInt = 10
    filters: dict[str, Any] = Field(default_factory=dict)
    rerank: StrictBool = True
    mode: Literal["dense", "hybrid"] = "dense"  # hybrid: dense and sparse searches fused by the store
    fusion: FusionName = DEFAULT_FUSION
    dense_limit: StrictInt | None = None
    sparse_limit: StrictInt | None = None
