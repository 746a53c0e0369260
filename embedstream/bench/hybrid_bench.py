"""`embedstream bench quality --hybrid`: dense, sparse and fused retrieval on a labelled set, and what
the sparse vectors cost the bulk path.

The set (:mod:`embedstream.bench.hybrid_set`): stdlib prose chunks with known-item queries (a
sentence held out of its chunk) and exact-term queries (an identifier found in one chunk only).
Every sparse variant gets its own collection in a temporary qdrant-edge store, written through the
sink (dense + sparse in one point) and searched through the store's own Query API, fusion included:
the numbers are the index's, not a numpy imitation of it. Rows: dense; BM25 over Qdrant's word
analyser and over the model's WordPiece tokens; SPLADE (splade-tiny); hybrid (dense + each sparse
kind, RRF, and BM25 with DBSF); hybrid + rerank when a cross-encoder is given (none with trained
weights ships offline). Cost: bulk chunks/s of the engine alone on the same chunks, dense only and
with each sparse encoder (the best of ``rounds`` rounds taken in turns).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

from embedstream import logs
from embedstream.bench import hybrid_set

KINDS = ("known_item", "exact_term")
CANDIDATES = 50  # per prefetch (dense, sparse) and fused; the reranker sees the fused top of these


@dataclass
class MethodRow:
    method: str
    ranks: dict[str, list[int | None]] = field(default_factory=dict)  # query kind -> rank of the answer (1-based)
    search_ms: float = 0.0
    note: str = ""

    def mrr(self, kind: str | None, k: int) -> float:
        ranks = self._ranks(kind)
        return float(np.mean([1.0 / r if r is not None and r <= k else 0.0 for r in ranks])) if ranks else float("nan")

    def recall(self, kind: str | None, k: int) -> float:
        ranks = self._ranks(kind)
        return float(np.mean([r is not None and r <= k for r in ranks])) if ranks else float("nan")

    def _ranks(self, kind: str | None) -> list[int | None]:
        return [r for key, ranks in self.ranks.items() if kind in (None, key) for r in ranks]


@dataclass
class CostRow:
    encoder: str
    chunks_per_s: float


@dataclass
class HybridResult:
    model: str
    chunks: int
    queries: dict[str, int]
    k: int
    rows: list[MethodRow]
    cost: list[CostRow]
    seconds: float


def _settings(threads: int | None, kind: str = "none", bm25_tokenizer: str = "words", splade: str = "splade-tiny"):
    from embedstream.config import Settings

    settings = Settings()
    settings.engine.threads = threads
    settings.sparse.kind = kind
    settings.sparse.bm25_tokenizer = bm25_tokenizer
    settings.sparse.model = splade
    return settings


VARIANTS = {  # row name -> (sparse kind, bm25 tokenizer)
    "bm25 (words)": ("bm25", "words"),
    "bm25 (model tokens)": ("bm25", "model"),
    "splade": ("splade", "words"),
}


def _rank(hits, answer: int) -> int | None:
    for position, hit in enumerate(hits, 1):
        if hit.payload.get("doc_id") == str(answer):
            return position
    return None


def run(model: str = "all-MiniLM-L6-v2", chunks: int = 3000, known_items: int = 200, exact: int = 200, k: int = 10,
        threads: int | None = 1, splade: str = "splade-tiny", reranker: str | None = None, cost_chunks: int = 1000,
        rounds: int = 2) -> HybridResult:
    from embedstream.engine.engine import EmbedRequest, Engine, ScoreRequest
    from embedstream.schemas import ChunkEvent
    from embedstream.vectors import FULL, sparse_name, with_sparse
    from embedstream.vectorstore.base import Prefetch
    from embedstream.vectorstore.edge_store import EdgeStore
    from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

    start = time.perf_counter()
    labelled = hybrid_set.build(chunks, known_items, exact)
    dense_engine = Engine.from_name(model, _settings(threads))
    doc_results, _ = dense_engine.embed([EmbedRequest(i, t, prompt="document", truncate=True)
                                         for i, t in enumerate(labelled.chunks)])
    dense = np.stack([r.full for r in doc_results])
    query_results, _ = dense_engine.embed([EmbedRequest(i, q.text, prompt="query", truncate=True)
                                           for i, q in enumerate(labelled.queries)])
    qdense = [r.full for r in query_results]
    rows: dict[str, MethodRow] = {}

    def record(name: str, search, note: str = "") -> None:
        row = rows.setdefault(name, MethodRow(name, note=note))
        t0 = time.perf_counter()
        for i, query in enumerate(labelled.queries):
            row.ranks.setdefault(query.kind, []).append(_rank(search(i), query.answer))
        row.search_ms = (time.perf_counter() - t0) * 1000 / len(labelled.queries)

    score_engine = Engine.from_name(reranker, _settings(threads)) if reranker else None
    with tempfile.TemporaryDirectory(prefix="embedstream-hybrid-") as folder:
        store = EdgeStore(folder)
        try:
            for name, (kind, tokenizer) in VARIANTS.items():
                engine = Engine.from_name(model, _settings(threads, kind, tokenizer, splade))
                sparse_docs = engine.sparse.encode_texts(labelled.chunks, query=False)
                sparse_queries = engine.sparse.encode_texts([q.text for q in labelled.queries], query=True)
                collection = f"hybrid-{kind}-{tokenizer}"
                sink = QdrantSink(store, engine.spec, engine.dimensions, collection, SinkConfig(sparse=kind))
                rows_of = with_sparse(dense, sparse_docs)
                for at in range(0, len(rows_of), 512):
                    sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=str(i), chunk_id=0, text=labelled.chunks[i]), rows_of[i])
                                 for i in range(at, min(at + 512, len(rows_of)))])
                vector = sparse_name(kind)
                if not rows:
                    record("dense", lambda i: store.search(collection, FULL, qdense[i], k))

                def fused(i: int, fusion: str = "rrf", limit: int = k):
                    return store.fused_search(collection, [Prefetch(FULL, qdense[i], CANDIDATES),
                                                           Prefetch(vector, sparse_queries[i], CANDIDATES)], limit, fusion)

                record(name, lambda i: store.search(collection, vector, sparse_queries[i], k))
                record(f"hybrid: dense + {name}, rrf", fused)
                if kind == "bm25" and tokenizer == "words":
                    record(f"hybrid: dense + {name}, dbsf", lambda i: fused(i, "dbsf"))
                    if score_engine is not None:
                        def reranked(i: int):
                            hits = fused(i, limit=CANDIDATES)
                            scores, _ = score_engine.score([ScoreRequest(j, labelled.queries[i].text, h.payload["text"])
                                                            for j, h in enumerate(hits)])
                            order = sorted(range(len(hits)), key=lambda j: -(scores[j].score or float("-inf")))
                            return [hits[j] for j in order[:k]]

                        record(f"hybrid + rerank ({score_engine.spec.name})", reranked)
            if score_engine is None:
                rows["hybrid + rerank"] = MethodRow("hybrid + rerank", note=(
                    "not measured: no trained cross-encoder ships offline (--reranker PATH)"))
        finally:
            store.close()
    return HybridResult(model, len(labelled.chunks), {kind: len(labelled.of_kind(kind)) for kind in KINDS}, k,
                        list(rows.values()), _cost(model, labelled.chunks[:cost_chunks], threads, splade, rounds),
                        time.perf_counter() - start)


def _cost(model: str, texts: list[str], threads: int | None, splade: str, rounds: int) -> list[CostRow]:
    """Bulk chunks/s of the engine alone (dense + each sparse encoder), best of ``rounds`` taken in turns."""
    from embedstream.engine.engine import EmbedRequest, Engine

    engines = {"dense only": Engine.from_name(model, _settings(threads))}
    for name, (kind, tokenizer) in VARIANTS.items():
        engines[f"dense + {name}"] = Engine.from_name(model, _settings(threads, kind, tokenizer, splade))
    requests = [EmbedRequest(i, t, prompt="document", truncate=True) for i, t in enumerate(texts)]
    best = {name: float("inf") for name in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            t0 = time.perf_counter()
            engine.embed(requests)
            best[name] = min(best[name], time.perf_counter() - t0)
    return [CostRow(name, len(texts) / seconds) for name, seconds in best.items()]


def print_table(result: HybridResult, console=None) -> None:
    from rich.table import Table

    console = console or logs.console()
    k = result.k
    table = Table(title=(f"retrieval on {result.chunks} stdlib chunks: {result.queries['known_item']} known-item + "
                         f"{result.queries['exact_term']} exact-term queries; {result.model} dense; "
                         f"MRR@{k} / recall@{k}"))
    for col in ("method", "known-item MRR", f"R@{k}", "exact-term MRR", f"R@{k} ", "combined MRR", f"R@{k}  ",
                "ms/query", "note"):
        table.add_column(col, justify="left" if col in ("method", "note") else "right")

    def fmt(value: float) -> str:
        return "-" if value != value else f"{value:.3f}"

    for row in result.rows:
        cells = []
        for kind in ("known_item", "exact_term", None):
            cells += [fmt(row.mrr(kind, k)), fmt(row.recall(kind, k))]
        table.add_row(row.method, *cells, f"{row.search_ms:.1f}" if row.ranks else "-", row.note)
    console.print(table)
    cost = Table(title="bulk cost: engine alone on the same chunks (best of rounds, shared loaded host)")
    for col in ("encoder", "chunks/s", "vs dense only"):
        cost.add_column(col, justify="left" if col == "encoder" else "right")
    base = result.cost[0].chunks_per_s
    for row in result.cost:
        cost.add_row(row.encoder, f"{row.chunks_per_s:,.0f}", f"{(row.chunks_per_s / base - 1) * 100:+.1f}%")
    console.print(cost)
    console.print(f"{result.seconds:.0f} s in all")
