"""Every route of the gateway, once: path, method, dialect, request body, answer, documented statuses.

``app.create_app`` serves exactly these (one handler per operation name) and ``openapi.openapi_document``
documents exactly these, from the same pydantic models that validate the requests (``bodies``) and
describe the answers (``replies``): a route cannot be served undocumented or documented unserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from embedstream.gateway import bodies, replies
from embedstream.gateway.errors import Dialect

# What a request that reaches the Kafka lanes can be answered besides 200
LANE_ERRORS = (400, 413, 422, 424, 429, 503, 504)
# OpenAI answers an invalid request with 400, never 422 (errors.ApiError.status_for)
OPENAI_ERRORS = (400, 413, 424, 429, 503, 504)
# Answered in the gateway alone (the served model's tokenizer)
TOKENIZER_ERRORS = (400, 413, 422)

TEI, OPENAI, COHERE, EMBEDSTREAM = ("Text Embeddings Inference", "OpenAI", "Cohere", "embedstream")


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    name: str  # the handler's name, the metrics label and the operationId's stem
    dialect: Dialect  # whose error envelope the errors use
    tag: str
    summary: str
    body: Any = None  # the request body's type (validated with it), None for GET
    reply: Any = None  # the 200 body's type; None: no 200 (only errors)
    errors: tuple[int, ...] = ()
    media_type: str = "application/json"  # of the 200 body
    error_model: Any = None  # None: the dialect's envelope

    @property
    def operation_id(self) -> str:
        suffix = self.path.strip("/").replace("/", "_").replace(".", "_") or "root"
        return f"{self.method.lower()}_{suffix}"


_ERROR_MODELS = {"tei": replies.TeiError, "openai": replies.OpenAIError, "cohere": replies.CohereError}


def error_model(op: Operation) -> Any:
    return op.error_model if op.error_model is not None else _ERROR_MODELS[op.dialect]


_TEI_OR_COHERE = Union[replies.TeiError, replies.CohereError]
_HEALTH = dict(dialect="tei", tag=TEI, reply=replies.Health, errors=(503,))
_OPENAI = dict(dialect="openai", tag=OPENAI, body=bodies.OpenAIEmbeddings, reply=replies.OpenAIEmbeddingsReply,
               errors=OPENAI_ERRORS)
_ROOT = dict(dialect="tei", tag=TEI, body=bodies.TeiRoot, errors=LANE_ERRORS,
             reply=Union[replies.EmbedResponse, replies.RerankResponse])
_COHERE_RERANK = dict(dialect="cohere", tag=COHERE, body=bodies.CohereRerank, reply=replies.CohereRerankReply,
                      errors=LANE_ERRORS)

OPERATIONS: tuple[Operation, ...] = (
    Operation("POST", "/embed", "embed", "tei", TEI, "Embeddings of texts or token ids (pooled)",
              bodies.TeiEmbed, replies.EmbedResponse, LANE_ERRORS),
    Operation("POST", "/embed_all", "embed_all", "tei", TEI, "Every token's last hidden state (no pooling), from "
              "the packed forward pass", bodies.TeiEmbedAll, replies.EmbedAllResponse, LANE_ERRORS),
    Operation("POST", "/embed_sparse", "embed_sparse", "tei", TEI, "Sparse vectors (the embed workers' sparse "
              "encoder)", bodies.TeiEmbedSparse, replies.EmbedSparseResponse, LANE_ERRORS),
    Operation("POST", "/similarity", "similarity", "tei", TEI, "Cosine similarity of each sentence with the source "
              "sentence", bodies.TeiSimilarity, replies.SimilarityResponse, LANE_ERRORS),
    Operation("POST", "/rerank", "rerank", "tei", TEI, "Rerank texts (TEI's body) or documents (Cohere's and Jina's "
              "body: its answer and errors are Cohere's)", Union[bodies.TeiRerank, bodies.CohereRerank],
              Union[replies.RerankResponse, replies.CohereRerankReply], LANE_ERRORS, error_model=_TEI_OR_COHERE),
    Operation("POST", "/", "tei_root", summary="TEI's root route: an embed body (inputs) or a rerank body (query, texts)",
              **_ROOT),
    Operation("POST", "/invocations", "tei_root", summary="SageMaker's name for TEI's root route", **_ROOT),
    Operation("POST", "/predict", "predict", "tei", TEI, "Classification: no classifier is served here (424 with "
              "the reason)", errors=(424,)),
    Operation("POST", "/tokenize", "tokenize", "tei", TEI, "The served model's tokens of each input",
              bodies.TeiTokenize, replies.TokenizeResponse, TOKENIZER_ERRORS),
    Operation("POST", "/decode", "decode", "tei", TEI, "Token ids back to text", bodies.TeiDecode,
              replies.DecodeResponse, TOKENIZER_ERRORS),
    Operation("GET", "/health", "health", summary="Ready: the Kafka client works", **_HEALTH),
    Operation("GET", "/", "health", summary="Health (the Inference API's route)", **_HEALTH),
    Operation("GET", "/ping", "health", summary="Health (SageMaker's route)", **_HEALTH),
    Operation("GET", "/readyz", "health", "tei", EMBEDSTREAM, "Readiness probe (Kubernetes): as /health",
              reply=replies.Health, errors=(503,)),
    Operation("GET", "/healthz", "alive", "tei", EMBEDSTREAM, "Liveness probe (Kubernetes): the event loop answers; "
              "a broker outage is readiness, not a reason to restart", reply=replies.Alive),
    Operation("GET", "/info", "info", "tei", TEI, "The served model and the gateway's limits", reply=replies.Info),
    Operation("GET", "/metrics", "metrics", "tei", TEI, "Prometheus metrics", reply=str,
              media_type="text/plain"),
    Operation("GET", "/api-doc/openapi.json", "openapi", "tei", TEI, "This document (TEI's path)",
              reply=replies.OpenApiDocument),
    Operation("GET", "/openapi.json", "openapi", "tei", EMBEDSTREAM, "This document",
              reply=replies.OpenApiDocument),
    Operation("POST", "/v1/embeddings", "openai_embeddings", summary="OpenAI's embeddings", **_OPENAI),
    Operation("POST", "/embeddings", "openai_embeddings", summary="OpenAI's embeddings (TEI's alias)", **_OPENAI),
    Operation("POST", "/v2/embed", "cohere_embed", "cohere", COHERE, "Cohere's v2 embed, every embedding type",
              bodies.CohereEmbed, replies.CohereEmbedReply, LANE_ERRORS),
    Operation("POST", "/v1/rerank", "cohere_rerank", summary="Cohere's (and Jina's) rerank", **_COHERE_RERANK),
    Operation("POST", "/v2/rerank", "cohere_rerank", summary="Cohere's v2 rerank", **_COHERE_RERANK),
    Operation("POST", "/search", "search", "tei", EMBEDSTREAM, "Embed, vector search, rerank: hits with payloads",
              bodies.SearchBody, replies.Search, (400, 403, 404, 413, 422, 424, 429, 503, 504)),
)
