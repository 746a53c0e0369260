"""The engine facade: requests in, vectors (or scores) out, per-item errors, per-stage timings.

Data flows one way: check + tokenize (``prepare``) -> token-budget batches (batcher) -> packed
forward (runner) -> the model's output head (head.py: pool, Dense, normalise, Matryoshka size,
output form). Workers call the two halves separately so they can batch across Kafka lanes; the CLI
calls ``embed``/``score``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedstream.config import EngineSettings, Settings
from embedstream.engine.batcher import BatchLimits, pack
from embedstream.engine.errors import EngineError
from embedstream.engine.head import EmbeddingHead
from embedstream.engine.identity import EmbeddingIdentity, embedding_identity
from embedstream.engine.model_spec import ModelSpec, resolve_model
from embedstream.engine.packed import pack_sequences
from embedstream.engine.postprocess import Quantized
from embedstream.engine.runner import ForwardTimings, ModelRunner
from embedstream.engine.prepared import Prepared
from embedstream.engine.sparse import SparseEncoder
from embedstream.engine.sparse_choice import build_sparse_encoder
from embedstream.engine.tokenize import TextTokenizer, Tokenized, load_tokenizer, st_lowercase
from embedstream.engine.transfer import StagedBatch, staged_ahead
from embedstream.vectors import EncodedRow, SparseVector, encoded_rows, sparse_of, token_states_of


@dataclass
class EmbedRequest:
    id: Any
    text: Any
    dimensions: int | None = None
    dtype: str = "float32"
    normalize: bool | None = None  # None: as the model was trained
    truncate: bool | None = None  # None: the model config's default
    prompt: str | None = None  # "query" | "document" | None
    # Pre-tokenized input (a chunk event's ``token_ids``): the complete sequence the model's tokenizer
    # gives for the document prompt + text, special tokens included; used only for prompt "document"
    # when ``tokenizer`` equals the engine's ``document_fingerprint``, else the text is tokenized.
    token_ids: np.ndarray | None = None
    tokenizer: str | None = None  # the fingerprint the ids were made with
    # With a sparse encoder: compute this text's sparse vector too. None: for documents, not for queries
    # (a query's sparse vector is asked for: a search encodes its own, /embed_sparse asks).
    sparse: bool | None = None
    token_states: bool = False  # also every token's last hidden state (TEI's /embed_all), from the same pass
    truncate_left: bool = False  # a cut text loses its start, not its end (TEI's Left, Cohere's START)
    max_tokens: int | None = None  # a limit below the model's, special tokens included (Cohere's max_tokens)


@dataclass
class ScoreRequest:
    id: Any
    query: Any
    passage: Any
    max_passage_tokens: int | None = None  # cut the passage to at most this many tokens (Cohere's max_tokens_per_doc)


@dataclass
class EmbedResult:
    id: Any
    vector: Quantized | None = None
    full: np.ndarray | None = None  # the normalised full-size float32 vector (for sinks)
    tokens: int = 0
    truncated: bool = False
    error: EngineError | None = None
    sparse: SparseVector | None = None  # with a sparse encoder: the text's term weights
    token_states: np.ndarray | None = None  # when asked: float32 [tokens, hidden], the encoder's last layer

    def to_json(self) -> dict:
        def body() -> dict:
            scale = {} if self.vector.scale is None else {"scale": self.vector.scale}
            sparse = {} if self.sparse is None else {"sparse": self.sparse.to_json()}
            return {"embedding": self.vector.to_list(), "tokens": self.tokens, **scale, **sparse}

        return _item_json(self, body)


@dataclass
class ScoreResult:
    id: Any
    score: float | None = None
    tokens: int = 0
    truncated: bool = False
    error: EngineError | None = None

    def to_json(self) -> dict:
        return _item_json(self, lambda: {"score": self.score})


def _wants_sparse(request: EmbedRequest) -> bool:
    return request.sparse if request.sparse is not None else request.prompt != "query"


def _item_json(item: EmbedResult | ScoreResult, body: Callable[[], dict]) -> dict:
    """One result as a JSON line: its error, or its body (with ``truncated`` when the input was cut)."""
    if item.error is not None:
        return {"id": item.id, "error": item.error.to_dict()}
    out = {"id": item.id, **body()}
    if item.truncated:
        out["truncated"] = True
    return out


@dataclass
class StageTimings:
    tokenize_ms: float = 0.0
    forward_ms: float = 0.0
    pool_ms: float = 0.0
    batches: int = 0
    tokens: int = 0
    sparse_ms: float | None = None  # the sparse encoder's share (None: the engine has none)

    def as_dict(self) -> dict[str, float]:
        out = {"tokenize_ms": self.tokenize_ms, "forward_ms": self.forward_ms, "pool_ms": self.pool_ms}
        if self.sparse_ms is not None:
            out["sparse_ms"] = self.sparse_ms
        return out


class Engine:
    """One model, loaded once, served through the token-budget batcher."""

    def __init__(self, spec: ModelSpec, settings: EngineSettings | None = None, runner: ModelRunner | None = None,
                 shape: str = "bulk", sparse: SparseEncoder | None = None):
        """``shape`` (bulk, online, shared: tuning.shape_for_lanes) is what precision tuned picks a path for."""
        settings = settings or EngineSettings()
        self.spec = spec
        self.limits = BatchLimits.for_model(settings.max_batch_tokens, settings.max_batch_requests, spec.max_tokens)
        self.runner = runner or ModelRunner(
            spec, settings.device, settings.backend, settings.threads, settings.precision, settings.quality_floor, shape
        )
        self.tokenizer = TextTokenizer(load_tokenizer(spec.path), spec.max_tokens, st_lowercase(spec.path))
        model_vocab = getattr(getattr(self.runner, "config", None), "vocab_size", None)
        if isinstance(model_vocab, int) and 0 < model_vocab < self.tokenizer.vocab_size:
            self.tokenizer.vocab_size = model_vocab  # an id past the embedding table would fail the forward pass
        # What a producer's pre-tokenized chunks must carry to be used as they are (see EmbedRequest).
        self.document_fingerprint = (self.tokenizer.fingerprint(spec.document_prompt)
                                     if self.tokenizer.single_type_ids_zero else None)
        self.head = self.runner.head
        self.dimensions = self.head.dimensions if isinstance(self.head, EmbeddingHead) else self.runner.hidden_size
        self.max_text_bytes = settings.max_text_bytes
        self.sparse = sparse  # computed beside the dense vectors in ``forward`` (engine/sparse.py)

    @property
    def identity(self) -> EmbeddingIdentity:
        """What its chunk vectors depend on besides the text (engine/identity.py): the model and the sparse encoder."""
        return embedding_identity(self.spec, self.sparse)

    @classmethod
    def from_name(cls, name: str, settings: Settings | None = None, shape: str = "bulk") -> "Engine":
        """The model ``name`` with the deployment's sparse encoder (``settings.sparse``), if any."""
        settings = settings or Settings()
        engine = cls(resolve_model(name, settings.models), settings.engine, shape=shape)
        if engine.spec.kind == "embed":
            engine.sparse = build_sparse_encoder(settings, engine.tokenizer, engine.spec.max_tokens)
        return engine

    # -- embed ---------------------------------------------------------------------------------
    def _prompt(self, request: EmbedRequest) -> str | None:
        return {"query": self.spec.query_prompt, "document": self.spec.document_prompt}.get(request.prompt or "")

    def prepare(self, requests: list[EmbedRequest], timings: StageTimings | None = None) -> list[Prepared | EngineError]:
        """Validate and tokenise; a bad request becomes an EngineError in its slot.

        Pre-tokenized requests whose fingerprint is the engine's are checked (ids in the vocabulary,
        within the limit) and packed as they are; the rest are tokenized in one batch call."""
        start = time.perf_counter()
        out: list[Prepared | EngineError | None] = [None] * len(requests)
        todo: list[int] = []
        if self.spec.kind != "embed":
            raise EngineError("wrong_model_kind", f"model {self.spec.name!r} is a {self.spec.kind} model, not an embedder")
        for i, req in enumerate(requests):
            try:
                self.head.check(req.dimensions, req.dtype)
                if req.token_ids is not None and req.prompt == "document":
                    if req.tokenizer is not None and req.tokenizer == self.document_fingerprint:
                        out[i] = self._prepared(req, self._pretokenized(req), self.spec.document_prompt)
                        continue
                    if not (isinstance(req.text, str) and req.text.strip()):
                        raise EngineError("tokenizer_mismatch", (
                            f"the chunk's token ids were made with tokenizer {req.tokenizer}, not this model's "
                            f"({self.document_fingerprint}), and it has no text to tokenize instead"))
                TextTokenizer.check_text(req.text, max_bytes=self.max_text_bytes)
                todo.append(i)
            except EngineError as err:
                out[i] = err
        prompts = [self._prompt(requests[i]) for i in todo]
        texts = [f"{prompt}{requests[i].text}" if prompt else requests[i].text for i, prompt in zip(todo, prompts)]
        truncate = [self._may_truncate(requests[i]) for i in todo]
        shaped = {}  # only requests that ask for it: a plain batch is tokenized as it always was
        if any(requests[i].truncate_left or requests[i].max_tokens for i in todo):
            shaped = {"left": [requests[i].truncate_left for i in todo], "limits": [requests[i].max_tokens for i in todo]}
        for i, prompt, tok in zip(todo, prompts, self.tokenizer.encode_many(texts, truncate, **shaped) if todo else ()):
            out[i] = tok if isinstance(tok, EngineError) else self._prepared(requests[i], tok, prompt)
        if timings is not None:
            timings.tokenize_ms += (time.perf_counter() - start) * 1000
        return out  # type: ignore[return-value]

    def _may_truncate(self, request: EmbedRequest) -> bool:
        return request.truncate if request.truncate is not None else self.spec.truncate

    def _pretokenized(self, request: EmbedRequest) -> Tokenized:
        return self.tokenizer.check_ids(request.token_ids, self._may_truncate(request))

    def _prepared(self, request: EmbedRequest, tok: Tokenized, prompt: str | None) -> Prepared:
        if prompt and not self.spec.include_prompt:
            tok.prompt_tokens = self.tokenizer.prompt_tokens(prompt)
        norm = request.normalize if request.normalize is not None else self.spec.normalize
        return Prepared(request, tok, norm)

    def _staged(self, token_groups: Iterable[list[Tokenized]]) -> Iterator[StagedBatch]:
        """Each group packed and staged one ahead of the group being run (see ``forward``)."""
        return staged_ahead(self.runner.stage, (self.runner.pack(tokens) for tokens in token_groups))

    def forward(self, items: list[Prepared], timings: StageTimings,
                staged: StagedBatch | None = None) -> np.ndarray | list[EncodedRow]:
        """One packed forward pass over items that fit one batch; float32 [N, D] in item order. With a
        sparse encoder, the same items' sparse vectors are computed next and each row carries its own
        (a list of :class:`~embedstream.vectors.EncodedRow`: 1-d arrays with ``.sparse``); an item whose
        request asks for ``token_states`` gets its tokens' rows of the pass's last hidden states on its row.

        ``staged``: these items' batch, already packed and its device copy started (``embed`` stages batch i+1
        before running batch i, so on CUDA that copy runs under batch i's forward); else packed here, into
        pinned memory on CUDA (``runner.pack``) so its copy is asynchronous."""
        if staged is None:
            staged = self.runner.stage(self.runner.pack([p.tokens for p in items]))
        batch = staged.batch
        ft = ForwardTimings()
        keep = [k for k, i in enumerate(batch.order) if getattr(items[i].request, "token_states", False)]  # packed positions
        states: list[np.ndarray | None] | None = None
        if keep:
            pooled_t, kept = self.runner.embed_keeping_tokens(staged, ft, keep)
            pooled = pooled_t.numpy()
            states = [None] * len(items)
            for k, rows in zip(keep, kept):
                states[batch.order[k]] = rows
        else:
            pooled = self.runner.embed(staged, ft).numpy()
        vectors = np.empty_like(pooled)
        vectors[batch.order] = pooled
        timings.forward_ms += ft.forward_ms
        timings.batches += 1
        timings.tokens += batch.total_tokens
        start = time.perf_counter()
        self.head.normalize(vectors, [p.normalize for p in items])
        timings.pool_ms += ft.pool_ms + (time.perf_counter() - start) * 1000
        if self.sparse is None:
            return vectors if states is None else encoded_rows(vectors, token_states=states)
        start = time.perf_counter()
        sparse: list[SparseVector | None] = [None] * len(items)
        wanted = [i for i, p in enumerate(items) if _wants_sparse(p.request)]
        if wanted:
            chosen = [items[i] for i in wanted]
            for i, vector in zip(wanted, self.sparse.encode(chosen, [p.request.prompt == "query" for p in chosen],
                                                            [not self._prompt(p.request) for p in chosen])):
                sparse[i] = vector
        timings.sparse_ms = (timings.sparse_ms or 0.0) + (time.perf_counter() - start) * 1000
        return encoded_rows(vectors, sparse, states)

    def warm_up(self, max_tokens: int) -> int:
        """Run one forward per sequence length 1..max_tokens so their kernels exist before traffic.

        oneDNN builds a GEMM kernel per input shape on first use (about 0.2 ms per layer): a query
        whose token count had not been seen took 12.4 ms instead of 6.6 ms. Query-sized shapes are
        few, so an online worker builds them at start. Returns the number of lengths warmed."""
        lengths = range(1, min(max_tokens, self.spec.max_tokens) + 1)
        for n in lengths:
            batch = pack_sequences([Tokenized(ids=[0] * n, type_ids=[0] * n)])
            if self.spec.kind == "rerank":
                self.runner.score(batch, ForwardTimings())
            else:
                self.runner.embed(batch, ForwardTimings())
        return len(lengths)

    def finish(self, item: Prepared, vector: np.ndarray) -> EmbedResult:
        """Apply the request's dimensions and dtype to its full vector."""
        req: EmbedRequest = item.request
        return EmbedResult(
            req.id, self.head.output(vector, req.dimensions, req.dtype, item.normalize), vector, len(item.tokens),
            item.tokens.truncated, sparse=sparse_of(vector), token_states=token_states_of(vector),
        )

    def embed(self, requests: list[EmbedRequest], sort_by_length: bool = True) -> tuple[list[EmbedResult], StageTimings]:
        """Embed everything, bulk style: length-sorted token-budget batches, errors per item."""
        timings = StageTimings()
        prepared = self.prepare(requests, timings)
        results: list[EmbedResult | None] = [None] * len(requests)
        good = [i for i, p in enumerate(prepared) if isinstance(p, Prepared)]
        for i, p in enumerate(prepared):
            if isinstance(p, EngineError):
                results[i] = EmbedResult(requests[i].id, error=p)
        groups = [[good[g] for g in group] for group in pack([len(prepared[i].tokens) for i in good], self.limits,
                                                              sort_by_length)]
        for idx, staged in zip(groups, self._staged([prepared[i].tokens for i in idx] for idx in groups)):
            vectors = self.forward([prepared[i] for i in idx], timings, staged)
            for row, i in enumerate(idx):
                results[i] = self.finish(prepared[i], vectors[row])
        return results, timings  # type: ignore[return-value]

    # -- score ---------------------------------------------------------------------------------
    def score(self, requests: list[ScoreRequest], sort_by_length: bool = True) -> tuple[list[ScoreResult], StageTimings]:
        """Cross-encoder scores for (query, passage) pairs through the same batcher."""
        if self.spec.kind != "rerank":
            raise EngineError("wrong_model_kind", f"model {self.spec.name!r} is an embedder, not a reranker")
        timings = StageTimings()
        start = time.perf_counter()
        results: list[ScoreResult | None] = [None] * len(requests)
        todo: list[int] = []
        for i, req in enumerate(requests):
            try:
                TextTokenizer.check_text(req.query, "query", self.max_text_bytes)
                TextTokenizer.check_text(req.passage, "passage", self.max_text_bytes)
                todo.append(i)
            except EngineError as err:
                results[i] = ScoreResult(req.id, error=err)
        limits = [requests[i].max_passage_tokens for i in todo]
        encoded = self.tokenizer.encode_pairs([(requests[i].query, requests[i].passage) for i in todo],
                                              limits if any(limit is not None for limit in limits) else None)
        ready: list[tuple[int, Tokenized]] = []
        for i, tok in zip(todo, encoded):
            if isinstance(tok, EngineError):
                results[i] = ScoreResult(requests[i].id, error=tok)
            else:
                ready.append((i, tok))
        timings.tokenize_ms += (time.perf_counter() - start) * 1000
        groups = [[ready[g] for g in group] for group in pack([len(t) for _, t in ready], self.limits, sort_by_length)]
        for members, staged in zip(groups, self._staged([t for _, t in members] for members in groups)):
            batch = staged.batch
            ft = ForwardTimings()
            scores = self.runner.score(staged, ft).tolist()
            timings.forward_ms += ft.forward_ms
            timings.batches += 1
            timings.tokens += batch.total_tokens
            for packed_pos, member_pos in enumerate(batch.order):
                i, tok = members[member_pos]
                results[i] = ScoreResult(requests[i].id, float(scores[packed_pos]), len(tok), tok.truncated)
        return results, timings  # type: ignore[return-value]
