"""Wire models of the rerank and search topics: rerank candidates, or retrieve -> rerank by query.

Both requests are answered on ``reply_to`` under the same ``request_id`` (request-reply through
:class:`embedstream.producers.query_client.QueryClient.request`). A request that decodes but cannot be served
(no candidates, too many, empty query, unknown model or collection) gets a reply whose ``error`` is
set; a record that does not decode goes to the dead-letter topic.
"""

from __future__ import annotations

from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field

from embedstream.schemas.events import ErrorInfo, NonEmptyStr, WireModel

FilterScalar = Union[str, int, float, bool]


class Candidate(BaseModel):
    """One passage to score against the query; ``metadata`` is not scored, only carried."""

    model_config = ConfigDict(extra="ignore")

    id: NonEmptyStr
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class RerankRequest(WireModel):
    """Score every candidate against ``query`` with a cross-encoder and reply with the best ``top_n``."""

    request_id: NonEmptyStr
    query: str
    candidates: list[Candidate] = Field(default_factory=list)
    top_n: int = Field(default=10, ge=1, description="How many ranked results the reply carries")
    model: str | None = Field(default=None, description="Cross-encoder name; None = the worker's model")
    reply_to: NonEmptyStr = Field(description="Topic the reply is produced to")
    deadline_ms: int | None = Field(default=None, description="Epoch ms after which workers may drop the request")
    cut: bool = Field(default=False, description="Keep the first max_candidates instead of refusing a longer list")
    sent_at_ms: int | None = None


class RankedResult(BaseModel):
    """A candidate's place in the ranking."""

    model_config = ConfigDict(extra="ignore")

    id: str
    score: float
    rank: int = Field(ge=1, description="1 = most relevant")
    truncated: bool = Field(default=False, description="The passage was cut to fit the model's limit")


class RerankReply(WireModel):
    """The ranked candidates of a RerankRequest, or the error that prevented them."""

    request_id: NonEmptyStr
    results: list[RankedResult] = Field(default_factory=list)
    timings_ms: dict[str, float] = Field(
        default_factory=dict, description="queue_wait, tokenize, rerank (forward), total"
    )
    error: ErrorInfo | None = None
    model: str | None = None


class SearchRequest(WireModel):
    """Embed ``query``, retrieve ``top_k`` chunks (payload filters ANDed), optionally rerank to ``top_n``."""

    request_id: NonEmptyStr
    query: str
    collection: str | None = Field(default=None, description="Collection or alias; None = the worker's default")
    top_k: int = Field(default=50, ge=1, le=1000, description="Chunks retrieved by vector search")
    filters: dict[str, Union[FilterScalar, list[Union[str, int]]]] = Field(
        default_factory=dict, description="payload field == value; a list means any of"
    )
    rerank: bool = Field(default=True, description="Rerank the retrieved chunks with the cross-encoder")
    top_n: int = Field(default=10, ge=1, description="Hits in the reply (after reranking)")
    reply_to: NonEmptyStr
    deadline_ms: int | None = None
    sent_at_ms: int | None = None


class SearchHit(BaseModel):
    """One retrieved chunk with its vector score and (when reranked) its cross-encoder score."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(description="Point id")
    doc_id: str | None = None
    chunk_id: int | None = None
    text: str = ""
    payload: dict[str, Any] = Field(default_factory=dict, description="Stored payload without text and internals")
    vector_score: float
    rerank_score: float | None = None
    rank: int = Field(ge=1)
    truncated: bool = Field(default=False, description="The text was cut to fit the reranker's limit")


class SearchReply(WireModel):
    """Hits of a SearchRequest, best first, or the error that prevented them."""

    request_id: NonEmptyStr
    hits: list[SearchHit] = Field(default_factory=list)
    timings_ms: dict[str, float] = Field(
        default_factory=dict, description="queue_wait, embed, search, rerank, total"
    )
    error: ErrorInfo | None = None
    collection: str | None = None
    model: str | None = Field(default=None, description="The reranker, when the hits were reranked")


RERANK_WIRE_MODELS: tuple[type[WireModel], ...] = (RerankRequest, RerankReply, SearchRequest, SearchReply)
