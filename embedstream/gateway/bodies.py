"""Request bodies: read within a byte limit, parse JSON, validate into the shape each API documents.

A body over the limit is read and discarded (never buffered) up to ``DRAIN_LIMIT`` so the client
gets its 413 instead of a reset connection; past that the connection is simply answered and closed.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar, Union

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictBool, StrictInt, StrictStr, ValidationError
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


def _examples(*bodies: dict) -> ConfigDict:
    """A body model's config with request examples (the document's; schemathesis sends them first)."""
    return ConfigDict(extra="ignore", json_schema_extra={"examples": list(bodies)})


TokenId = Annotated[StrictInt, Field(ge=0)]
TokenIds = list[TokenId]
TruncationDirection = Literal["Right", "Left", "right", "left"]
TeiInputType = Union[StrictStr, TokenIds]
TeiInput = Annotated[
    Union[TeiInputType, list[TeiInputType]],
    Field(description="A text or the served model's token ids, or a list of them (a batch). Token ids are read as "
                      "the text they decode to"),
]
PROMPT_NAME = Field(default=None, description="The model's prompt put before each text: query or document (the "
                    "sentence-transformers prompts); none by default")
TRUNCATE = Field(default=None, description="Cut an input over the model's token limit instead of refusing it; "
                 "none: the gateway's --auto-truncate (on by default, as TEI)")
TRUNCATION_DIRECTION = Field(default="Right", description="Which end a cut input loses: Right its end, Left its start")


class OpenAIEmbeddings(_Body):
    """OpenAI ``POST /v1/embeddings``: text(s) or token ids of the served model's tokenizer (as vLLM)."""

    model_config = _examples({"input": ["What is Deep Learning?"], "model": "all-MiniLM-L6-v2"})

    input: Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]] = Field(
        description="A text, a list of texts, one input as token ids or a list of them")
    model: StrictStr | None = Field(default=None, description="Any name: the served model answers (TEI's rule; the "
                                    "reply's model says which)")
    encoding_format: Literal["float", "base64"] = Field(default="float", description="base64: little-endian float32")
    dimensions: StrictInt | None = Field(default=None, description="A Matryoshka size the model was trained for")
    user: StrictStr | None = Field(default=None, description="Accepted and not used")


class TeiEmbed(_Body):
    """TEI ``POST /embed``."""

    model_config = _examples({"inputs": "What is Deep Learning?"},
                             {"inputs": [[101, 7592, 102], "hello"], "prompt_name": "query"})

    inputs: TeiInput
    normalize: StrictBool = Field(default=True, description="L2-normalise each vector")
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: TruncationDirection = TRUNCATION_DIRECTION
    prompt_name: StrictStr | None = PROMPT_NAME
    dimensions: StrictInt | None = Field(default=None, description="A Matryoshka size the model was trained for")


class TeiEmbedSparse(_Body):
    """TEI ``POST /embed_sparse``."""

    model_config = _examples({"inputs": ["What is Deep Learning?"]})

    inputs: TeiInput
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: TruncationDirection = TRUNCATION_DIRECTION
    prompt_name: StrictStr | None = PROMPT_NAME


class TeiEmbedAll(_Body):
    """TEI ``POST /embed_all``: every token's last hidden state, from the packed forward pass."""

    model_config = _examples({"inputs": "What is Deep Learning?"})

    inputs: TeiInput
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: TruncationDirection = TRUNCATION_DIRECTION
    prompt_name: StrictStr | None = PROMPT_NAME


class SimilarityInput(_Body):
    source_sentence: StrictStr = Field(description="The text every sentence is compared with")
    sentences: list[StrictStr] = Field(description="Texts compared with source_sentence")


class SimilarityParameters(_Body):
    truncate: StrictBool | None = TRUNCATE
    truncation_direction: TruncationDirection = TRUNCATION_DIRECTION
    prompt_name: StrictStr | None = PROMPT_NAME


class TeiSimilarity(_Body):
    """TEI ``POST /similarity``: the cosine similarity of each sentence's vector with the source sentence's."""

    model_config = _examples({"inputs": {"source_sentence": "What is Deep Learning?",
                                         "sentences": ["What is Machine Learning?"]}})

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class TeiTokenize(_Body):
    """TEI ``POST /tokenize``."""

    model_config = _examples({"inputs": "test"})

    inputs: Union[StrictStr, list[StrictStr]]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = PROMPT_NAME


class TeiDecode(_Body):
    """TEI ``POST /decode``."""

    model_config = _examples({"ids": [101, 7592, 102]})

    ids: Union[TokenIds, list[TokenIds]]
    skip_special_tokens: StrictBool = True


CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class CohereTextContent(_Body):
    type: Literal["text"]
    text: StrictStr


class CohereImageContent(_Body):
    type: Literal["image_url"]
    image_url: Any = None


class CohereInput(_Body):
    content: list[Annotated[Union[CohereTextContent, CohereImageContent], Field(discriminator="type")]]


class CohereEmbed(_Body):
    """Cohere ``POST /v2/embed`` (texts only: images are refused)."""

    model_config = _examples({"texts": ["hello", "goodbye"], "model": "embed-v4.0", "input_type": "search_document",
                              "embedding_types": ["float", "int8"]})

    texts: list[StrictStr] | None = None
    images: list[Any] | None = Field(default=None, description="Refused (422): the served model embeds text")
    inputs: list[CohereInput] | None = Field(default=None, description="Text content only: an input's text parts "
                                             "are joined by newlines")
    model: StrictStr | None = Field(default=None, description="Any name: the served model answers")
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = Field(
        default=None, description="search_query / search_document: the model's query / document prompt")
    embedding_types: list[CohereEmbeddingType] | None = None
    output_dimension: StrictInt | None = Field(default=None, description="A Matryoshka size the model was trained for")
    max_tokens: StrictInt | None = Field(default=None, ge=1, description="Tokens per input at most (special tokens "
                                         "included; the model's limit when above it), cut as truncate says")
    truncate: Literal["NONE", "START", "END"] | None = Field(default=None, description="END (the default) cuts an "
                                                             "over-long text's end, START its start; NONE refuses it")
    priority: StrictInt | None = Field(default=None, description="Accepted and not used")


class DocumentObject(_Body):
    text: StrictStr


class TeiRerank(_Body):
    """TEI ``POST /rerank``: every text scored, sorted by score."""

    model_config = _examples({"query": "What is Deep Learning?",
                              "texts": ["Deep Learning is ...", "Kafka keeps records"]})

    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool | None = Field(default=None, description="Accepted: an over-long text is cut to the "
                                        "reranker's limit whatever it says")
    truncation_direction: TruncationDirection = TRUNCATION_DIRECTION


class CohereRerank(_Body):
    """Cohere (v1, v2) and Jina ``POST /v1/rerank``, ``/v2/rerank``: documents as strings or ``{"text": ...}``."""

    model_config = _examples({"query": "What is Deep Learning?",
                              "documents": ["Deep Learning is ...", "Kafka keeps records"], "top_n": 1})

    query: StrictStr
    documents: list[Union[StrictStr, DocumentObject]]
    model: StrictStr | None = Field(default=None, description="Any name: the served reranker answers")
    top_n: StrictInt | None = Field(default=None, ge=1)
    return_documents: StrictBool = False
    max_tokens_per_doc: StrictInt | None = Field(default=None, ge=1, description="Cut each document to at most this "
                                                 "many tokens (within what the reranker's limit leaves beside the query)")
    priority: StrictInt | None = Field(default=None, description="Accepted and not used")


class SearchBody(_Body):
    """``POST /search``: embed -> vector search -> rerank, as the rerank worker's SearchRequest."""

    model_config = _examples({"query": "read a file", "top_k": 10, "top_n": 3})

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


class TeiRoot(RootModel[Union[TeiRerank, TeiEmbed]]):
    """TEI's ``POST /`` and ``/invocations``: a rerank body (``query`` and ``texts``) or an embed body (``inputs``)."""
