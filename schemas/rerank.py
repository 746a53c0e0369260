"""Wire models of the rerank and search topics: rerank candidates, or retrieve -> rerank by query.

Both requests are answered on ``reply_to`` under the same ``request_id`` (request-reply through
:class:`embedstream.producers.query_client.QueryClient.request`). A request that decodes but cannot be served
(no candidates, too many, empty query, unknown model or collection) gets a reply whose ``error`` is
set; a record that does not decode goes to the dead-letter topic.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from embedstream.ranking import DEFAULT_FUSION, FusionName
from embedstream.schemas.bounds import (
    MAX_CANDIDATES,
    MAX_FILTER_VALUES,
    MAX_FILTERS,
    MAX_NAME_CHARS,
    MAX_SAFE_INTEGER,
    MAX_TOP_K,
    MAX_TOP_N,
    CollectionName,
    EpochMs,
    FilterValue,
    Metadata,
    Name,
    TopicName,
    WireInt,
    bounded_int,
)
from embedstream.schemas.events import ErrorInfo, NonEmptyStr, WireModel

FilterScalar = Union[FilterValue, WireInt, float, bool]
FilterKey = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
FilterList = Annotated[list[Union[FilterValue, WireInt]], Field(max_length=MAX_FILTER_VALUES)]
TopN = bounded_int(1, MAX_TOP_N, "How many ranked results the reply carries")


class Candidate(BaseModel):
    """One passage to score against the query; ``metadata`` is not scored, only carried."""

    model_config = ConfigDict(extra="ignore")

    id: Name
    text: str
    metadata: Metadata = Field(default_factory=dict)


class RerankRequest(WireModel):
    """Score every candidate against ``query`` with a cross-encoder and reply with the best ``top_n``."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"request_id": "r1", "query": "read a file", "reply_to": "embedstream.replies",
         "candidates": [{"id": "a", "text": "open() returns a file object"}, {"id": "b", "text": "sockets"}]},
        {"request_id": "r2", "query": "q", "reply_to": "embedstream.replies-gw", "top_n": 1, "cut": True,
         "candidates": [{"id": "a", "text": "p", "metadata": {"doc_id": "d"}}], "deadline_ms": 1700000000500},
    ]})

    request_id: Name
    query: str
    candidates: list[Candidate] = Field(default_factory=list, max_length=MAX_CANDIDATES)
    top_n: TopN = 10
    model: Name | None = Field(default=None, description="Cross-encoder name; None = the worker's model")
    reply_to: TopicName = Field(description="Topic the reply is produced to")
    deadline_ms: EpochMs | None = Field(default=None, description="Epoch ms after which workers may drop the request")
    cut: bool = Field(default=False, description="Keep the first max_candidates instead of refusing a longer list")
    max_tokens_per_doc: bounded_int(1, MAX_SAFE_INTEGER) | None = Field(
        default=None, description="Cut each candidate to at most this many tokens (within the model's limit); None = "
        "as much as the model's limit leaves beside the query")
    sent_at_ms: EpochMs | None = None


class RankedResult(BaseModel):
    """A candidate's place in the ranking."""

    model_config = ConfigDict(extra="ignore")

    id: str
    score: float
    rank: WireInt = Field(ge=1, description="1 = most relevant")
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

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"request_id": "s1", "query": "how do I read a file?", "reply_to": "embedstream.replies"},
        {"request_id": "s2", "query": "q", "collection": "docs_v2", "top_k": 100, "top_n": 5, "rerank": False,
         "filters": {"lang": "en", "year": [2023, 2024]}, "reply_to": "embedstream.replies.gw1",
         "deadline_ms": 1700000000500, "sent_at_ms": 1700000000000},
        {"request_id": "s3", "query": "ERR_CONN_RESET in urllib", "mode": "hybrid", "fusion": "logit",
         "dense_limit": 100, "sparse_limit": 100, "top_k": 50, "top_n": 10, "reply_to": "embedstream.replies"},
    ]})

    request_id: Name
    query: str
    collection: CollectionName | None = Field(default=None, description="Collection or alias; None = the worker's default")
    top_k: bounded_int(1, MAX_TOP_K, "Chunks retrieved by vector search") = 50
    filters: dict[FilterKey, Union[FilterScalar, FilterList]] = Field(
        default_factory=dict, max_length=MAX_FILTERS, description="payload field == value; a list means any of"
    )
    rerank: bool = Field(default=True, description="Rerank the retrieved chunks with the cross-encoder")
    top_n: bounded_int(1, MAX_TOP_N, "Hits in the reply (after reranking)") = 10
    mode: Literal["dense", "hybrid"] = Field(
        default="dense", description="dense: the dense vector alone; hybrid: dense and sparse searches fused by "
        "the searcher (the collection needs its sparse vector), top_k of the fused list go on to the reranker")
    fusion: FusionName = Field(
        default=DEFAULT_FUSION, description="hybrid: how the dense and sparse lists are fused (embedstream.ranking): "
        "logit (cosine x 2.5 + the sparse score over the query's sum of IDF weights, every candidate scored in both "
        "lists: the default, chosen by bench fusion), rrf (reciprocal rank, k 60), wrrf (RRF, dense weighted 2), "
        "dbsf (distribution-based score fusion), convex (scores over their list's best, alpha 0.5)")
    dense_limit: bounded_int(1, MAX_TOP_K, "hybrid: candidates of the dense search (default top_k)") | None = None
    sparse_limit: bounded_int(1, MAX_TOP_K, "hybrid: candidates of the sparse search (default top_k)") | None = None
    reply_to: TopicName
    deadline_ms: EpochMs | None = None
    sent_at_ms: EpochMs | None = None


class SearchHit(BaseModel):
    """One retrieved chunk with its vector score and (when reranked) its cross-encoder score."""

    model_config = ConfigDict(extra="ignore")

    id: str = Field(description="Point id")
    doc_id: str | None = None
    chunk_id: WireInt | None = None
    text: str = ""
    payload: dict[str, Any] = Field(default_factory=dict, description="Stored payload without text and internals")
    vector_score: float = Field(description="The vector search's score; in hybrid mode the fused score")
    rerank_score: float | None = None
    rank: WireInt = Field(ge=1)
    truncated: bool = Field(default=False, description="The text was cut to fit the reranker's limit")


class SearchReply(WireModel):
    """Hits of a SearchRequest, best first, or the error that prevented them."""

    request_id: NonEmptyStr
    hits: list[SearchHit] = Field(default_factory=list)
    timings_ms: dict[str, float] = Field(
        default_factory=dict, description="queue_wait, embed, sparse (hybrid), search, rerank, total"
    )
    error: ErrorInfo | None = None
    collection: str | None = None
    model: str | None = Field(default=None, description="The reranker, when the hits were reranked")


RERANK_WIRE_MODELS: tuple[type[WireModel], ...] = (RerankRequest, RerankReply, SearchRequest, SearchReply)
