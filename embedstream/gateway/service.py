"""The gateway's core, independent of any API dialect: checks, events out, replies in.

One embed input becomes one ``QueryRequest`` (the online embed lane batches them with everyone
else's); a rerank becomes one ``RerankRequest`` and a search one ``SearchRequest``. Checks that need
no model (counts, bytes, model names, Matryoshka sizes) are answered here, without a round trip.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import numpy as np
from pydantic import ValidationError

from embedstream import logs
from embedstream.config import Settings
from embedstream.engine import postprocess
from embedstream.engine.errors import EngineError
from embedstream.engine.model_spec import ModelSpec, output_dimensions
from embedstream.gateway.bodies import invalid
from embedstream.gateway.config import GatewayOptions
from embedstream.gateway.errors import ApiError
from embedstream.gateway.lanes import KafkaLanes
from embedstream.schemas.events import PromptKind, QueryReply, QueryRequest, now_ms
from embedstream.producers.search_routing import route, search_topic
from embedstream.workers.trust import TrustPolicy, collection_refusal
from embedstream.schemas.rerank import Candidate, RerankReply, RerankRequest, SearchReply, SearchRequest

log = logs.get("embedstream.gateway")

TIMEOUT_HEADERS = ("x-request-timeout", "request-timeout", "x-stainless-read-timeout")
"""Client timeouts in seconds, in order of preference; the openai SDK sends the last one on every call."""


@dataclass
class EmbedAsk:
    """What a client asked for, in the gateway's terms (``None``: as the model was configured)."""

    texts: list[str]
    dimensions: int | None = None
    prompt: PromptKind | None = None
    truncate: bool | None = None
    normalize: bool | None = None
    sparse: bool = False  # also the texts' sparse vectors (TEI /embed_sparse)
    token_embeddings: bool = False  # also every token's last hidden state (TEI /embed_all)
    truncation_direction: str = "right"  # right: a cut text loses its end; left: its start
    max_tokens: int | None = None  # a token limit below the model's (Cohere's max_tokens)


@dataclass
class Embedded:
    vectors: np.ndarray  # float32 [n, dims], in input order
    tokens: list[int]
    timings_ms: dict[str, float] = field(default_factory=dict)  # per stage, the slowest input's
    sparse: list = field(default_factory=list)  # SparseTerms per input, when asked
    token_states: list[np.ndarray] = field(default_factory=list)  # float32 [tokens, hidden] per input, when asked


def slowest(timings: list[dict[str, float]]) -> dict[str, float]:
    """Per-stage maximum over the replies of one HTTP request: the stage times its client waited."""
    out: dict[str, float] = {}
    for t in timings:
        for key, value in t.items():
            out[key] = max(out.get(key, 0.0), float(value))
    return out


class Gateway:
    """Turns checked requests into lane events and replies into vectors, scores and hits (no HTTP here)."""

    def __init__(self, settings: Settings, options: GatewayOptions, spec: ModelSpec, rerank_spec: ModelSpec | None = None,
                 lanes: KafkaLanes | None = None, rerank_problem: str = "no reranker is configured"):
        self.settings, self.options, self.lanes = settings, options, lanes
        self.spec, self.rerank_spec, self.rerank_problem = spec, rerank_spec, rerank_problem
        self.dimensions = output_dimensions(spec)
        self.trust = TrustPolicy.from_settings(settings)  # which collections a search may name
        self._tokenizer = None
        self._foreign_names: set[str] = set()

    # -- checks ---------------------------------------------------------------------------------
    def check_model(self, name: str | None, kind: str = "embed") -> str:
        """The served model's name. A request naming another is served all the same, as TEI does (clients
        send their own default names: LangChain's OpenAIEmbeddings, the cohere SDK); the answer names the
        model that served it, and the first request with each other name is logged."""
        spec = self.spec if kind == "embed" else self.rerank_spec
        if spec is None:
            raise ApiError(424, "rerank_unavailable", self.rerank_problem)
        if name is not None and name != spec.name and name not in self._foreign_names and len(self._foreign_names) < 64:
            self._foreign_names.add(name)
            log.warning("request names another model; the served one answers", asked=name[:200], served=spec.name)
        return spec.name

    def deadline(self, headers) -> float:
        """The client's timeout (or the default), capped, as a monotonic instant.

        A tenth of it (at most 250 ms) is kept back so the 504 reaches the client before its own
        timeout fires and it sees a bare disconnect instead."""
        timeout = self.options.default_timeout_s
        for name in TIMEOUT_HEADERS:
            value = headers.get(name)
            if value:
                try:
                    timeout = float(value)
                except ValueError:
                    raise ApiError(422, "invalid_request", f"header {name} must be seconds, got {value!r}") from None
                break
        if not timeout > 0:
            raise ApiError(422, "invalid_request", "the request timeout must be positive")
        timeout = min(timeout, self.options.max_timeout_s)
        return time.monotonic() + timeout - min(0.25, timeout / 10)

    def _check_texts(self, texts: list[str], what: str) -> None:
        if not texts:
            raise ApiError(400, "empty_input", f"`{what}` cannot be empty", param=what)
        if len(texts) > self.options.max_inputs:
            raise ApiError(413, "too_many_inputs", f"{what} has {len(texts)} items, over the limit of "
                           f"{self.options.max_inputs} per request", param=what)
        limit = self.settings.engine.max_text_bytes
        for i, text in enumerate(texts):
            if len(text) * 4 > limit and len(text.encode("utf-8", "surrogatepass")) > limit:
                raise ApiError(413, "text_too_large", f"{what}[{i}] is over the limit of {limit} bytes", param=what)
            if not text.strip():
                raise ApiError(400, "empty_text", f"{what}[{i}] is empty" + (" (only white space)" if text else ""),
                               param=what)

    def _check_options(self, ask: EmbedAsk) -> None:
        try:
            postprocess.check_dimensions(ask.dimensions, self.spec.matryoshka_dims, self.dimensions, self.spec.name)
        except EngineError as err:
            raise ApiError(422, err.code, err.message, param="dimensions") from None

    def decode_token_ids(self, ids: list[list[int]], what: str = "input") -> list[str]:
        """Token ids of the served model's own tokenizer back to text (vLLM's meaning of token-id input;
        TEI decodes them too): the text is then embedded as any other, with the model's special tokens."""
        if len(ids) > self.options.max_inputs:  # before decoding any of them
            raise ApiError(413, "too_many_inputs", f"{what} has {len(ids)} items, over the limit of "
                           f"{self.options.max_inputs} per request", param=what)
        vocab = self.tokenizer().get_vocab_size()
        for i, row in enumerate(ids):
            if not row:
                raise ApiError(400, "empty_input", f"{what}[{i}] has no token ids", param=what)
            if min(row) < 0 or max(row) >= vocab:
                raise ApiError(422, "invalid_token_id", f"{what}[{i}] has a token id outside 0..{vocab - 1} of "
                               f"{self.spec.name!r}'s tokenizer (LangChain: set check_embedding_ctx_length=False "
                               "to send text)", param=what)
        return self._tokenizer.decode_batch(ids, skip_special_tokens=True)

    def texts_of(self, inputs, what: str) -> list[str]:
        """TEI's ``inputs`` (a text, token ids, or a list of either) as texts, ids decoded."""
        if isinstance(inputs, str):
            return [inputs]
        if inputs and all(isinstance(x, int) for x in inputs):
            return self.decode_token_ids([inputs], what)  # one input given as token ids
        rows = [i for i, x in enumerate(inputs) if isinstance(x, list)]
        if not rows:
            return list(inputs)
        texts = list(inputs)
        for i, text in zip(rows, self.decode_token_ids([inputs[i] for i in rows], what)):
            texts[i] = text
        return texts

    def tokenizer(self):
        """The served model's fast tokenizer (loaded on first use: the gateway holds no weights)."""
        if self._tokenizer is None:
            from embedstream.engine.tokenize import load_tokenizer

            self._tokenizer = load_tokenizer(self.spec.path)
        return self._tokenizer

    # -- lanes ----------------------------------------------------------------------------------
    def _connected(self) -> KafkaLanes:
        if self.lanes is None or not self.lanes.healthy():
            raise ApiError(503, "kafka_unavailable", "the gateway has no working Kafka client (starting, or its "
                           "reply reader stopped)")
        return self.lanes

    async def embed(self, ask: EmbedAsk, deadline: float, what: str = "input") -> Embedded:
        self._check_texts(ask.texts, what)
        self._check_options(ask)
        lanes = self._connected()
        sent = now_ms()
        expires = sent + int(max(0.0, deadline - time.monotonic()) * 1000)
        truncate = self.options.auto_truncate if ask.truncate is None else ask.truncate
        requests = [QueryRequest(request_id=uuid.uuid4().hex, text=text, model=self.spec.name, dimensions=ask.dimensions,
                                 prompt=ask.prompt, normalize=ask.normalize, truncate=truncate, sparse=ask.sparse,
                                 token_embeddings=ask.token_embeddings, truncation_direction=ask.truncation_direction,
                                 max_tokens=ask.max_tokens, reply_to=lanes.reply_topic, deadline_ms=expires,
                                 sent_at_ms=sent)
                    for text in ask.texts]
        replies = await lanes.call("embed", self.settings.kafka.topic_queries, requests, QueryReply, deadline)
        for i, reply in enumerate(replies):
            if reply.error is not None:
                err = ApiError.from_worker(reply.error)
                raise ApiError(err.status, err.code, f"{what}[{i}]: {err.message}", param=what)
        vectors = np.asarray([r.embedding for r in replies], dtype=np.float32)
        return Embedded(vectors, [r.tokens or 0 for r in replies], slowest([r.timings_ms for r in replies]),
                        [r.sparse for r in replies] if ask.sparse else [],
                        [r.token_state_array() for r in replies] if ask.token_embeddings else [])

    async def rerank(self, query: str, documents: list[str], top_n: int | None, deadline: float,
                     what: str = "texts", max_tokens_per_doc: int | None = None) -> RerankReply:
        self.check_model(None, "rerank")
        if not documents:
            raise ApiError(400, "no_candidates", f"`{what}` cannot be empty", param=what)
        if len(documents) > self.options.max_documents:
            raise ApiError(413, "too_many_candidates", f"{len(documents)} {what}, over the limit of "
                           f"{self.options.max_documents} per request", param=what)
        lanes = self._connected()
        sent = now_ms()
        request = RerankRequest(
            request_id=uuid.uuid4().hex, query=query, model=self.rerank_spec.name,
            candidates=[Candidate(id=str(i), text=text) for i, text in enumerate(documents)],
            top_n=min(top_n or len(documents), len(documents)), max_tokens_per_doc=max_tokens_per_doc,
            reply_to=lanes.reply_topic,
            deadline_ms=sent + int(max(0.0, deadline - time.monotonic()) * 1000), sent_at_ms=sent)
        (reply,) = await lanes.call("rerank", self.settings.kafka.topic_rerank, [request], RerankReply, deadline)
        if reply.error is not None:
            raise ApiError.from_worker(reply.error)
        return reply

    async def search(self, fields: dict, deadline: float) -> SearchReply:
        """``fields`` of a SearchRequest (query, top_k, top_n, filters, rerank, collection); 422 when they do not fit."""
        lanes = self._connected()
        sent = now_ms()
        try:
            request = SearchRequest(request_id=uuid.uuid4().hex, reply_to=lanes.reply_topic, sent_at_ms=sent,
                                    deadline_ms=sent + int(max(0.0, deadline - time.monotonic()) * 1000), **fields)
        except ValidationError as exc:
            raise invalid(exc) from None
        refusal = collection_refusal(request.collection, self.trust)
        if refusal is not None:  # refused here at once: published, it would wait on a topic no deployment reads
            raise ApiError(403, "collection_not_allowed", refusal, param="collection")
        topic, request = route(self.settings.kafka, self.settings.qdrant.collection, request)  # its collection's owner
        (reply,) = await lanes.call("search", topic, [request], SearchReply, deadline)
        if reply.error is not None:
            raise ApiError.from_worker(reply.error)
        return reply

    # -- facts ----------------------------------------------------------------------------------
    def info(self, version: str) -> dict:
        """TEI's /info keys, plus what embedstream adds (dimensions, Matryoshka sizes, lanes, limits)."""
        engine = self.settings.engine
        out = {
            "model_id": self.spec.name,
            "model_sha": None,
            "model_dtype": engine.precision,
            "served_model_name": self.spec.name,
            "model_type": {"embedding": {"pooling": self.spec.pooling}},
            "auto_truncate": self.options.auto_truncate,
            # TEI's router tokenizes; here each embed worker does, in its one intake stage
            "tokenization_workers": 1,
            "sha": None,
            "docker_label": None,
            "dimensions": self.dimensions,
            "matryoshka_dimensions": list(self.spec.matryoshka_dims),
            "normalize": self.spec.normalize,
            "max_input_length": self.spec.max_tokens,
            "max_batch_tokens": engine.max_batch_tokens,
            "max_batch_requests": engine.max_batch_requests,
            "max_client_batch_size": self.options.max_inputs,
            "max_concurrent_requests": self.options.max_inflight,
            "max_body_bytes": self.options.max_body_bytes,
            "max_text_bytes": engine.max_text_bytes,
            "topics": {"queries": self.settings.kafka.topic_queries, "rerank": self.settings.kafka.topic_rerank,
                       "search": search_topic(self.settings.kafka, self.settings.qdrant.collection),
                       "replies": self.lanes.reply_topic if self.lanes is not None else
                       self.options.reply_topic or self.settings.kafka.topic_replies},
            "version": version,
        }
        sparse = self.settings.sparse
        if sparse.kind != "none":  # the embed workers' sparse encoder (/embed_sparse, hybrid search)
            out["sparse_model"] = {"kind": sparse.kind, "model_id": sparse.model if sparse.kind == "splade"
                                   else f"bm25/{sparse.bm25_tokenizer}"}
        if self.rerank_spec is not None:
            out["reranker"] = {"model_id": self.rerank_spec.name, "max_input_length": self.rerank_spec.max_tokens,
                               "activation": self.rerank_spec.activation}
        return out
