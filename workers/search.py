"""Retrieve -> rerank: embed the query, search Qdrant (two-stage when it pays), rerank with a cross-encoder.

Placement: the query embedder is either an in-process :class:`Engine` (one process does everything)
or a callable that asks the embed workers over Kafka (:func:`kafka_embedder`, the stages apart).

Search plan per collection, read from its named vectors:
* ``full`` only, float32/float16: one search on ``full``.
* ``mrl_<d>`` present: ``top_k * rescore_factor`` candidates on the smallest Matryoshka vector, then
  exactly those rescored by the store on ``full`` (a search restricted to their ids).
* Qdrant scalar/binary quantization: the store asks Qdrant to rescore with the original vectors.
* ``uint8`` storage (int8 shifted by 128, per-point ``_scale``): the store compares shifted
  integers, which blurs the ranking, so ``top_k * rescore_factor`` candidates are fetched and
  rescored here on the dequantised full vectors against the float query (exact up to int8 error).

Every cut (a limit, the Matryoshka or uint8 candidates) keeps every point tied with its last one: the
store is asked for a few more, and twice as many again while the last one still ties
(:func:`embedstream.ranking.with_ties`). ``exact`` (``EMBEDSTREAM_QDRANT__EXACT_SEARCH``) asks the store
for an exact scan instead of its HNSW graph.

Hybrid mode (``SearchRequest.mode="hybrid"``): the query's sparse vector (the deployment's sparse
encoder, the same kind the sink writes) is searched beside the dense one, each with its own limit.
The dense candidates come from the plan above, exactly as a dense search's; the two lists are fused here
(:func:`embedstream.ranking.fuse`, the request's ``fusion``), not by the store, so ties fall the same way in
every process and on every store. For the score fusions every candidate is scored exactly in both lists
(a sparse-only point's cosine, a dense-only point's sparse score, by the store for exactly those points),
and the sparse scores are taken over the query's unit (:meth:`Searcher.sparse_unit`), so a point's fused
score depends neither on where a list was cut nor on the query's length. The fused ``top_k`` go on to the
reranker like dense hits. The collection must hold the sparse vector.

Order: every list (dense hits, rescored candidates, fused hits, reranked hits) follows the one rule of
:mod:`embedstream.ranking`: the score compared at 6 decimal places, then (fused) the better single-list
rank, then the point id; reranked hits by rerank score at 6 places, then their retrieval order.

Every stage is timed (embed, sparse, search, rerank, total) and comes back in the reply.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from embedstream.engine.engine import EmbedRequest, Engine, ScoreRequest, ScoreResult
from embedstream.engine.errors import EngineError
from embedstream.engine.sparse import SparseEncoder
from embedstream.producers.search_routing import query_topic
from embedstream.errors import CodedError
from embedstream.ranking import (
    DENSE_LOGIT_SCALE,
    SCORE_FUSIONS,
    Candidates,
    complete_at,
    fuse,
    fusion_named,
    ordered,
    score_key,
    with_ties,
)
from embedstream.vectorstore.base import CollectionNotFound, Hit, VectorSpec, VectorStore
from embedstream.schemas.events import now_ms
from embedstream.schemas.rerank import SearchHit, SearchReply, SearchRequest
from embedstream.vectors import (
    FULL,
    l2_normalize,
    matryoshka_cut,
    parse_mrl_name,
    parse_sparse_name,
    SparseVector,
    query_form,
    uint8_decode,
)

Embedder = Callable[[str], np.ndarray]

_HIDDEN_PAYLOAD = ("text", "doc_id", "chunk_id")
_SPEC_TTL_S = 10.0


class SearchError(CodedError):
    """A search that cannot be served; ``code`` goes into the error reply (``to_error_info``)."""


def engine_embedder(engine: Engine) -> Embedder:
    """Query vectors from an in-process embed engine (the model's query prompt applied)."""
    if engine.spec.kind != "embed":
        raise ValueError(f"model {engine.spec.name!r} is a {engine.spec.kind} model, not an embedder")

    def embed(text: str) -> np.ndarray:
        (result,), _ = engine.embed([EmbedRequest(0, text, prompt="query")], sort_by_length=False)
        if result.error is not None:
            raise SearchError(result.error.code, result.error.message)
        vector = result.full if result.full is not None else result.vector.values
        return np.asarray(vector, dtype=np.float32)

    embed.model = engine.spec.name  # type: ignore[attr-defined]
    return embed


def kafka_embedder(client, model: str | None = None, timeout_s: float = 5.0) -> Embedder:
    """Query vectors from the embed workers through request-reply (``QueryClient``).

    The embed request inherits the search's deadline (``deadline_ms``): the embed worker sheds it
    with ``deadline_exceeded`` rather than computing a vector the search can no longer use. A search of
    ``collection`` asks on that collection's queries topic (``search_routing.query_topic``), which only the
    deployment writing it reads: its model embeds the query, once."""

    def embed(text: str, deadline_ms: int | None = None, sparse: bool = False, collection: str | None = None):
        """The query's dense vector; with ``sparse`` (hybrid) also its sparse vector, from the same worker pass."""
        timeout = timeout_s
        if deadline_ms is not None:
            remaining_s = (deadline_ms - now_ms()) / 1000
            if remaining_s <= 0:
                raise SearchError("deadline_exceeded", "the search's deadline passed before its query was embedded")
            timeout = min(timeout_s, remaining_s)
        try:
            topic = query_topic(client.settings, collection) if collection else None
            reply = client.embed(text, model=model, timeout_s=timeout, prompt="query", sparse=sparse, topic=topic)
        except TimeoutError as exc:
            raise SearchError("embed_timeout", str(exc)) from None
        if reply.error is not None:
            raise SearchError(reply.error.code, reply.error.message)
        vector = np.asarray(reply.embedding, dtype=np.float32)
        if not sparse:
            return vector
        if reply.sparse is None:
            raise SearchError("sparse_unavailable", "the embed worker returned no sparse vector for the query")
        return vector, SparseVector.of(reply.sparse.indices, reply.sparse.values)

    embed.model = model  # type: ignore[attr-defined]
    embed.takes_deadline = True  # type: ignore[attr-defined] - and the collection searched
    embed.gives_sparse = True  # type: ignore[attr-defined] - hybrid queries' sparse vectors from the embed workers
    return embed


@dataclass
class SearchPlan:
    """How one collection is searched (derived from its vector specs)."""

    full: VectorSpec
    prefetch_name: str | None  # smallest mrl_<d>, if any
    prefetch_size: int | None
    uint8: bool
    quantized: bool
    sparse_name: str | None = None  # the collection's sparse_<kind> vector, if it has one

    @classmethod
    def of(cls, collection: str, specs: dict[str, VectorSpec]) -> "SearchPlan":
        if FULL not in specs:
            raise SearchError(
                "unsupported_collection",
                f"collection {collection!r} has no {FULL!r} vector (vectors: {sorted(specs)}); it was not written by the sink",
            )
        mrl = sorted((s.size, n) for n, s in specs.items()
                     if parse_mrl_name(n) is not None and s.size < specs[FULL].size)
        full = specs[FULL]
        sparse = next((n for n in sorted(specs) if parse_sparse_name(n) is not None), None)
        return cls(full, mrl[0][1] if mrl else None, mrl[0][0] if mrl else None, full.datatype == "uint8",
                   full.quantization is not None, sparse)

    def describe(self) -> str:
        parts = [f"full {self.full.size}-d {self.full.datatype}"]
        if self.prefetch_name:
            parts.append(f"prefetch {self.prefetch_name}")
        if self.quantized:
            parts.append(f"{self.full.quantization} quantization (rescored by Qdrant)")
        if self.uint8:
            parts.append("uint8 (rescored on dequantised full vectors)")
        if self.sparse_name:
            parts.append(f"{self.sparse_name} (hybrid)")
        return ", ".join(parts)


@dataclass
class Retrieved:
    """The first half of a search: hits (best first, already top_k) and stage times."""

    collection: str
    hits: list[Hit]
    scores: list[float]  # vector scores, aligned with hits (rescored where the plan says so)
    timings_ms: dict[str, float] = field(default_factory=dict)


#: uint8 candidates per result before rescoring on the dequantised vectors: `bench quality` finds
#: recall@10 0.92 at x4 and >= 0.98 from x12 on (the +128 shift blurs the store's cosine).
UINT8_OVERSAMPLING = 12
#: candidates fetched beyond a limit, so the ranking rule (not the store) decides a tie at the cut
TIE_MARGIN = 4


class Searcher:
    """Query -> vector -> Qdrant -> (optionally) cross-encoder, with per-stage timings."""

    def __init__(self, store: VectorStore, embedder: Engine | Embedder, reranker: Engine | None = None,
                 default_collection: str = "docs", rescore_factor: int = 4, sparse: SparseEncoder | None = None,
                 dense_scale: float = float(DENSE_LOGIT_SCALE), exact: bool = False):
        self.store = store
        self.exact = exact  # ask the store for exact search, not its HNSW graph (EMBEDSTREAM_QDRANT__EXACT_SEARCH)
        self.dense_scale = dense_scale  # the logit fusion's weight of the dense cosine (EMBEDSTREAM_SPARSE__DENSE_SCALE)
        # hybrid queries' sparse vectors: the given encoder, else an in-process embed engine's own
        self.sparse = sparse if sparse is not None else getattr(embedder, "sparse", None)
        self.embedder: Embedder = engine_embedder(embedder) if isinstance(embedder, Engine) else embedder
        self.embed_model = getattr(self.embedder, "model", None)
        if reranker is not None and reranker.spec.kind != "rerank":
            raise ValueError(f"model {reranker.spec.name!r} is not a reranker")
        self.reranker = reranker
        self.default_collection = default_collection
        self.rescore_factor = max(1, int(rescore_factor))
        self._plans: dict[str, tuple[float, SearchPlan]] = {}

    # -- checks ----------------------------------------------------------------------------
    def plan(self, collection: str) -> SearchPlan:
        """The collection's search plan (cached briefly: specs cost a round trip on a server)."""
        cached = self._plans.get(collection)
        if cached is not None and time.monotonic() - cached[0] < _SPEC_TTL_S:
            return cached[1]
        try:
            specs = self.store.get_vector_specs(collection)
        except (CollectionNotFound, KeyError):
            raise SearchError("unknown_collection", f"no collection or alias named {collection!r}") from None
        plan = SearchPlan.of(collection, specs)
        self._plans[collection] = (time.monotonic(), plan)
        return plan

    def check(self, request: SearchRequest, can_rerank: bool | None = None) -> str:
        """Refuse what cannot be served before any work; returns the collection name."""
        if not request.query.strip():
            raise SearchError("empty_query", "query is empty")
        can_rerank = self.reranker is not None if can_rerank is None else can_rerank
        if request.rerank and not can_rerank:
            raise SearchError("rerank_unavailable", "no reranker is configured here; send rerank=false")
        collection = request.collection or self.default_collection
        plan = self.plan(collection)
        if request.mode == "hybrid":
            self._check_hybrid(collection, plan)
        return collection

    def _check_hybrid(self, collection: str, plan: SearchPlan) -> None:
        remote = getattr(self.embedder, "gives_sparse", False)  # the embed workers' encoder: they check
        if self.sparse is None and not remote:
            raise SearchError("hybrid_unavailable", "no sparse encoder is configured here (EMBEDSTREAM_SPARSE__KIND); "
                                                    "send mode=dense")
        if plan.sparse_name is None:
            raise SearchError("no_sparse_vector", (
                f"collection {collection!r} has no sparse vector (it was written without EMBEDSTREAM_SPARSE__KIND); "
                f"re-index it with a sparse encoder, or send mode=dense"))
        if self.sparse is not None and parse_sparse_name(plan.sparse_name) != self.sparse.kind:
            raise SearchError("sparse_mismatch", (
                f"collection {collection!r} holds {plan.sparse_name}, this searcher encodes {self.sparse.kind} queries"))

    # -- stages ----------------------------------------------------------------------------
    def retrieve(self, request: SearchRequest) -> Retrieved:
        """Embed the query and search the store; hits are the top_k by vector score."""
        collection = request.collection or self.default_collection
        plan = self.plan(collection)
        start = time.perf_counter()
        hybrid = request.mode == "hybrid"
        if hybrid:
            self._check_hybrid(collection, plan)
        remote_sparse = hybrid and self.sparse is None  # the embed workers send it with the dense vector
        sparse = None
        try:
            if remote_sparse:
                vector, sparse = self.embedder(request.query, deadline_ms=request.deadline_ms, sparse=True,  # type: ignore[call-arg]
                                               collection=collection)
            else:
                vector = (self.embedder(request.query, deadline_ms=request.deadline_ms, collection=collection)  # type: ignore[call-arg]
                          if getattr(self.embedder, "takes_deadline", False) else self.embedder(request.query))
            query = np.asarray(vector, dtype=np.float32)
        except EngineError as err:
            raise SearchError(err.code, err.message) from None
        embedded = time.perf_counter()
        if query.ndim != 1 or query.shape[0] != plan.full.size:
            raise SearchError(
                "dimension_mismatch",
                f"the query embedder returns {query.shape[-1]}-d vectors, collection {collection!r} holds "
                f"{plan.full.size}-d ones (another model wrote it)",
            )
        query = l2_normalize(query)
        timings = {"embed": (embedded - start) * 1000}
        if hybrid:
            if sparse is None:
                try:
                    sparse = self.sparse.encode_texts([request.query], query=True)[0]  # type: ignore[union-attr]
                except EngineError as err:
                    raise SearchError(err.code, err.message) from None
            encoded = time.perf_counter()
            timings["sparse"] = (encoded - embedded) * 1000
            hits, scores = self._hybrid(collection, plan, query, sparse, request)
            timings["search"] = (time.perf_counter() - encoded) * 1000
            return Retrieved(collection, hits, scores, timings)
        hits, scores = self._search(collection, plan, query, request.top_k, dict(request.filters) or None)
        timings["search"] = (time.perf_counter() - embedded) * 1000
        return Retrieved(collection, hits[:request.top_k], scores[:request.top_k], timings)

    def _hybrid(self, collection: str, plan: SearchPlan, query: np.ndarray, sparse: SparseVector,
                request: SearchRequest) -> tuple[list[Hit], list[float]]:
        """The request's fusion of the dense and sparse candidates."""
        fusion = fusion_named(request.fusion, self.dense_scale)
        dense, sparse_list, found = self.hybrid_candidates(collection, query, sparse, request,
                                                           exact=fusion.method in SCORE_FUSIONS)
        fused = fuse([dense, sparse_list], fusion, request.top_k)
        hits = [Hit(f.id, f.score, found[f.id].payload, "fusion") for f in fused]
        return hits, [f.score for f in fused]

    def hybrid_candidates(self, collection: str, query: np.ndarray, sparse: SparseVector, request: SearchRequest,
                          exact: bool = True) -> tuple[Candidates, Candidates, dict[str, Hit]]:
        """The two lists a hybrid search fuses (``bench fusion`` and ``bench quality --hybrid`` fuse them with every
        fusion): the dense candidates (the plan's search, rescored) and the sparse ones, in the rule's order, each
        with every point tied at its cut, and every candidate's hit. With ``exact`` (the score fusions), every
        candidate is scored in both lists: a sparse-only point's cosine and a dense-only point's sparse score
        (0 where it holds none of the query's terms), computed by the store for exactly those points (a point
        deleted in between leaves the lists), and the sparse list's unit (:meth:`sparse_unit`)."""
        plan = self.plan(collection)
        filters = dict(request.filters) or None
        dense_limit, sparse_limit = request.dense_limit or request.top_k, request.sparse_limit or request.top_k
        dense_hits, dense_scores = self._search(collection, plan, query, dense_limit, filters)
        sparse_hits = self._ordered_search(collection, plan.sparse_name, sparse, sparse_limit, filters)  # type: ignore[arg-type]
        dense_pairs = [(h.id, s) for h, s in zip(dense_hits, dense_scores)]
        sparse_pairs = [(h.id, h.score) for h in sparse_hits]
        if not exact:
            return Candidates(dense_pairs), Candidates(sparse_pairs), {h.id: h for h in (*sparse_hits, *dense_hits)}
        in_dense, in_sparse = {h.id for h in dense_hits}, {h.id for h in sparse_hits}
        sparse_only = [h.id for h in sparse_hits if h.id not in in_dense]
        dense_only = [h.id for h in dense_hits if h.id not in in_sparse]
        cosines = self._dense_scores(collection, plan, sparse_only, query)
        gone = set(sparse_only) - set(cosines)
        return (Candidates(dense_pairs, cosines),
                Candidates([pair for pair in sparse_pairs if pair[0] not in gone],
                           self._sparse_scores(collection, plan, dense_only, sparse), absent=0.0,
                           unit=self.sparse_unit(collection, plan, sparse)),
                {h.id: h for h in (*sparse_hits, *dense_hits)})

    def sparse_unit(self, collection: str, plan: SearchPlan, sparse: SparseVector) -> float:
        """What the query's sparse scores are divided by before the ``logit`` fusion weighs them, so that the dense
        scale means the same for a 1-term and a 20-term query (``bench fusion``, docs/fusion.md):

        * BM25: the query's sum of IDF weights, ``sum q_t x idf_t`` over its terms that some point holds (a point's
          BM25 score is ``sum q_t x idf_t x w_t`` with a term-frequency weight ``w_t < k + 1``);
        * SPLADE (no IDF): the query's maximum attainable score, the best score any point gets from each term
          alone, summed.

        One batch of one-term searches (limit 1); the IDF is the store's own, read off the best hit of each term
        (its score over its stored weight). 1 where no point holds any of the terms (every sparse score is 0)."""
        if not len(sparse.indices):
            return 1.0
        idf = parse_sparse_name(plan.sparse_name) == "bm25"  # type: ignore[arg-type]
        probes = [SparseVector.of([term], [value]) for term, value in zip(sparse.indices, sparse.values)]
        best = self.store.search_batch(collection, plan.sparse_name, probes, 1, exact=True,  # type: ignore[arg-type]
                                       with_vector=idf)
        total = 0.0
        for probe, hits in zip(probes, best):
            if not hits:
                continue
            if not idf:
                total += hits[0].score
                continue
            stored = hits[0].vector
            at = np.searchsorted(stored.indices, probe.indices[0]) if stored is not None else 0
            if stored is None or at >= len(stored.indices) or stored.indices[at] != probe.indices[0] \
                    or stored.values[at] <= 0:
                continue  # deleted or rewritten between the two reads: the term counts for nothing
            total += hits[0].score / float(stored.values[at])  # q_t x idf_t
        return total if total > 0 else 1.0

    def _sparse_scores(self, collection: str, plan: SearchPlan, ids: list[str], sparse: SparseVector) -> dict[str, float]:
        """These points' sparse scores, computed by the store (its IDF, as in the sparse search); a point that holds
        none of the query's terms is not returned: its score is 0."""
        if not ids or not len(sparse.indices):
            return {}
        hits = self.store.search(collection, plan.sparse_name, sparse, len(ids), ids=ids, exact=True)  # type: ignore[arg-type]
        return {h.id: h.score for h in hits}

    def _ordered_search(self, collection: str, vector_name: str, vector: Any, limit: int,
                        filters: dict | None) -> list[Hit]:
        """The store's ``limit`` best in the rule's order, with every point tied at the cut: more than ``limit``
        are asked for (:data:`TIE_MARGIN`, then twice as many while the last one returned still ties), so the rule
        (the point id), not the store's order, decides among tied points."""
        asked = limit + TIE_MARGIN
        while True:
            hits = ordered(self.store.search(collection, vector_name, vector, asked, filter=filters, exact=self.exact))
            if complete_at(hits, limit, asked):
                return with_ties(hits, limit)
            asked *= 2

    def _search(self, collection: str, plan: SearchPlan, query: np.ndarray, top_k: int,
                filters: dict | None) -> tuple[list[Hit], list[float]]:
        """The dense candidates (``top_k`` and every point tied with the last) and their exact cosines: Matryoshka
        and uint8 candidates (a wider cut, with its ties) rescored on the full vector."""
        wide = top_k * (max(self.rescore_factor, UINT8_OVERSAMPLING) if plan.uint8 else self.rescore_factor)
        if plan.prefetch_name:
            small = query_form(matryoshka_cut(query, plan.prefetch_size), plan.full.datatype)  # same datatype as full
            candidates = self._ordered_search(collection, plan.prefetch_name, small, wide, filters)
        elif plan.uint8:
            candidates = self._ordered_search(collection, FULL, query_form(query, plan.full.datatype), wide, filters)
        else:
            hits = self._ordered_search(collection, FULL, query, top_k, filters)
            return hits, [h.score for h in hits]
        exact = self._dense_scores(collection, plan, [h.id for h in candidates], query)
        # a vector not retrievable (deleted since) is left out
        rescored = [(Hit(h.id, exact[h.id], h.payload, FULL), exact[h.id]) for h in candidates if h.id in exact]
        top = with_ties(ordered(rescored, score=lambda pair: pair[1], ident=lambda pair: pair[0].id), top_k,
                        score=lambda pair: pair[1])
        return [hit for hit, _ in top], [score for _, score in top]

    def _dense_scores(self, collection: str, plan: SearchPlan, ids: list[str], query: np.ndarray) -> dict[str, float]:
        """These points' exact cosines with the float query: the store's on the full vector (the same arithmetic as
        its search), or here on the dequantised vectors of a uint8 collection, one round trip."""
        if not ids:
            return {}
        if plan.uint8:
            return {pid: float(l2_normalize(uint8_decode(vector)) @ query)
                    for pid, vector in self.store.get_vectors(collection, ids, FULL).items()}
        return {h.id: h.score for h in self.store.search(collection, FULL, query, len(ids), ids=ids, exact=True)}

    @staticmethod
    def score_requests(request: SearchRequest, retrieved: Retrieved, key: Any = None) -> list[ScoreRequest]:
        """(query, chunk text) pairs to rerank; ids are (key, hit index). Hits without text are skipped."""
        return [ScoreRequest((key, i), request.query, hit.payload.get("text"))
                for i, hit in enumerate(retrieved.hits) if isinstance(hit.payload.get("text"), str)]

    @staticmethod
    def assemble(request: SearchRequest, retrieved: Retrieved, scores: dict[int, ScoreResult] | None,
                 timings_ms: dict[str, float], reranker: str | None = None) -> SearchReply:
        """Order hits (rerank score, then vector score), keep top_n, attach timings."""
        rows = []
        for i, (hit, vscore) in enumerate(zip(retrieved.hits, retrieved.scores)):
            result = scores.get(i) if scores is not None else None
            rscore = result.score if result is not None and result.error is None else None
            rows.append((hit, vscore, rscore, bool(result and result.truncated), i))
        if scores is not None:  # reranked first (rerank score at 6 places, then retrieval order); unscored follow
            rows.sort(key=lambda r: (r[2] is None, -score_key(r[2]) if r[2] is not None else 0, r[4]))
        hits = []
        for rank, (hit, vscore, rscore, truncated, _) in enumerate(rows[: request.top_n], 1):
            payload = {k: v for k, v in hit.payload.items() if k not in _HIDDEN_PAYLOAD and not k.startswith("_")}
            chunk_id = hit.payload.get("chunk_id")
            hits.append(SearchHit(
                id=hit.id, doc_id=None if hit.payload.get("doc_id") is None else str(hit.payload["doc_id"]),
                chunk_id=chunk_id if isinstance(chunk_id, int) else None, text=str(hit.payload.get("text") or ""),
                payload=payload, vector_score=float(vscore), rerank_score=rscore, rank=rank, truncated=truncated,
            ))
        return SearchReply(request_id=request.request_id, hits=hits, timings_ms=timings_ms,
                           collection=retrieved.collection, model=reranker if scores is not None else None)

    # -- whole path (in-process) -------------------------------------------------------------
    def search(self, request: SearchRequest) -> SearchReply:
        """Embed, search, rerank, in this process; an unservable request gives an error reply."""
        start = time.perf_counter()
        try:
            self.check(request)
            retrieved = self.retrieve(request)
        except SearchError as err:
            total = (time.perf_counter() - start) * 1000
            return SearchReply(request_id=request.request_id, error=err.to_error_info(),
                               timings_ms={"queue_wait": 0.0, "total": total})
        timings = {"queue_wait": 0.0, **retrieved.timings_ms, "rerank": 0.0}
        scores = None
        if request.rerank and self.reranker is not None:
            rerank_start = time.perf_counter()
            pairs = self.score_requests(request, retrieved)
            results, _ = self.reranker.score(pairs) if pairs else ([], None)
            scores = {r.id[1]: r for r in results}
            timings["rerank"] = (time.perf_counter() - rerank_start) * 1000
        timings["total"] = (time.perf_counter() - start) * 1000
        return self.assemble(request, retrieved, scores, timings,
                             self.reranker.spec.name if self.reranker is not None else None)
