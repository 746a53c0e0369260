"""`embedstream bench quality --hybrid`: dense, sparse and fused retrieval on labelled sets of two corpora,
and what the sparse vectors cost the bulk path.

The sets (:mod:`embedstream.bench.hybrid_set`, :data:`~embedstream.bench.hybrid_set.CORPORA`): stdlib prose
chunks (known-item: a sentence held out of its chunk) and stdlib API reference records (known-item: the
entry's one-line summary), each with exact-term queries (an identifier or a word found in one text only).
Per corpus and sparse kind (BM25 over Qdrant's word analyser, SPLADE splade-tiny) one collection in a
temporary qdrant-edge store, written through the sink (dense + sparse in one point). Every query goes
through the searcher's own hybrid path (:meth:`Searcher.hybrid_candidates`: the dense plan's candidates,
the sparse ones, every candidate scored exactly in both lists, the query's sparse unit), and the same two
lists are fused by every
fusion compared (:data:`COMPARED`, :mod:`embedstream.ranking`): the numbers are the index's and the
production fusion's. Rows: dense; each sparse kind alone; each fusion of dense + BM25; the default fusion
of dense + SPLADE; hybrid + rerank (the default fusion's candidates ordered by a cross-encoder, when one is
given: none with trained weights ships offline). A last table checks the default against the better of
dense and sparse on each half of each query kind (tune on one half, check on the other). Cost: bulk
chunks/s of the engine alone on the same chunks, dense only and with each sparse encoder.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from embedstream import logs
from embedstream.bench import hybrid_set
from embedstream.ranking import DEFAULT_FUSION, DENSE_LOGIT_SCALE, FUSIONS, Fusion, fuse, score_key

KINDS = ("known_item", "exact_term")
CANDIDATES = 50  # per list (dense, sparse), as a search's default top_k; the reranker sees the fused top of these
TOLERANCE = 0.005  # the default must be within this of the better of dense and sparse, on every set

#: row name -> fusion, every one fused from the same two lists
COMPARED: dict[str, Fusion] = {
    "rrf (k 60)": FUSIONS["rrf"],
    "rrf (k 10)": Fusion("rrf", k=10),
    "weighted rrf (dense 2 : sparse 1)": FUSIONS["wrrf"],
    "dbsf": FUSIONS["dbsf"],
    "convex (alpha 0.5)": FUSIONS["convex"],
    "convex (alpha 0.7)": Fusion("convex", (Fraction(7, 10), Fraction(3, 10))),
    **{f"logit ({float(scale):g} x cosine + sparse / its unit)": Fusion("logit", (scale, Fraction(1)))
       for scale in (DENSE_LOGIT_SCALE / 2, DENSE_LOGIT_SCALE, DENSE_LOGIT_SCALE * 2)},
}
DEFAULT_ROW = next(name for name, fusion in COMPARED.items() if fusion == FUSIONS[DEFAULT_FUSION])


@dataclass
class MethodRow:
    method: str
    ranks: dict[str, list[int | None]] = field(default_factory=dict)  # query kind -> rank of the answer (1-based)
    note: str = ""

    def mrr(self, kind: str | None, k: int, half: int | None = None) -> float:
        ranks = self._ranks(kind, half)
        return float(np.mean([1.0 / r if r is not None and r <= k else 0.0 for r in ranks])) if ranks else float("nan")

    def recall(self, kind: str | None, k: int, half: int | None = None) -> float:
        ranks = self._ranks(kind, half)
        return float(np.mean([r is not None and r <= k for r in ranks])) if ranks else float("nan")

    def _ranks(self, kind: str | None, half: int | None = None) -> list[int | None]:
        return [r for key, ranks in self.ranks.items() if kind in (None, key)
                for n, r in enumerate(ranks) if half is None or n % 2 == half]


@dataclass
class CorpusResult:
    corpus: str
    chunks: int
    queries: dict[str, int]
    rows: list[MethodRow]
    seconds: float


@dataclass
class CostRow:
    encoder: str
    chunks_per_s: float


@dataclass
class HybridResult:
    model: str
    k: int
    corpora: list[CorpusResult]
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
    "bm25": ("bm25", "words"),
    "splade (splade-tiny)": ("splade", "words"),
}


def _rank(ids: list[str], answer: str) -> int | None:
    return ids.index(answer) + 1 if answer in ids else None


def run(model: str = "all-MiniLM-L6-v2", chunks: int = 3000, known_items: int = 200, exact: int = 200, k: int = 10,
        threads: int | None = 1, splade: str = "splade-tiny", reranker: str | None = None, cost_chunks: int = 1000,
        rounds: int = 2, corpora: tuple[str, ...] = tuple(hybrid_set.CORPORA)) -> HybridResult:
    from embedstream.engine.engine import Engine

    start = time.perf_counter()
    dense_engine = Engine.from_name(model, _settings(threads))
    score_engine = Engine.from_name(reranker, _settings(threads)) if reranker else None
    results = [_corpus(name, dense_engine, score_engine, model, chunks, known_items, exact, k, threads, splade)
               for name in corpora]
    first = hybrid_set.CORPORA[corpora[0]](chunks, known_items, exact)
    return HybridResult(model, k, results, _cost(model, first.chunks[:cost_chunks], threads, splade, rounds),
                        time.perf_counter() - start)


def _corpus(name: str, dense_engine, score_engine, model: str, chunks: int, known_items: int, exact: int, k: int,
            threads: int | None, splade: str) -> CorpusResult:
    from embedstream.bench.quality_bench import embed_cached
    from embedstream.engine.engine import EmbedRequest, Engine, ScoreRequest
    from embedstream.schemas import ChunkEvent
    from embedstream.schemas.rerank import SearchRequest
    from embedstream.vectors import encoded_rows
    from embedstream.vectorstore.edge_store import EdgeStore
    from embedstream.workers.search import Searcher
    from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

    start = time.perf_counter()
    labelled = hybrid_set.CORPORA[name](chunks, known_items, exact)
    dense = embed_cached(model, labelled.chunks, threads, progress=False)
    query_results, _ = dense_engine.embed([EmbedRequest(i, q.text, prompt="query", truncate=True)
                                           for i, q in enumerate(labelled.queries)])
    by_text = {q.text: r.full for q, r in zip(labelled.queries, query_results)}
    answers = [str(q.answer) for q in labelled.queries]
    rows: dict[str, MethodRow] = {}

    def record(row_name: str, ranked: list[list[str]], note: str = "") -> None:
        row = rows.setdefault(row_name, MethodRow(row_name, note=note))
        for query, ids, answer in zip(labelled.queries, ranked, answers):
            row.ranks.setdefault(query.kind, []).append(_rank(ids[:k], answer))

    with tempfile.TemporaryDirectory(prefix="embedstream-hybrid-") as folder:
        store = EdgeStore(folder)
        try:
            for variant, (kind, tokenizer) in VARIANTS.items():
                engine = Engine.from_name(model, _settings(threads, kind, tokenizer, splade))
                collection = f"hybrid-{kind}"
                sink = QdrantSink(store, engine.spec, engine.dimensions, collection, SinkConfig(sparse=kind))
                encoded = encoded_rows(dense, engine.sparse.encode_texts(labelled.chunks, query=False))
                for at in range(0, len(encoded), 512):
                    sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=str(i), chunk_id=0, text=labelled.chunks[i]), encoded[i])
                                 for i in range(at, min(at + 512, len(encoded)))])
                searcher = Searcher(store, lambda text: by_text[text], None, collection, sparse=engine.sparse)
                lists = []
                for query in labelled.queries:
                    request = SearchRequest(request_id="b", query=query.text, reply_to="-", rerank=False, mode="hybrid",
                                            top_k=CANDIDATES)
                    sparse_vector = engine.sparse.encode_texts([query.text], query=True)[0]
                    dense_list, sparse_list, found = searcher.hybrid_candidates(collection, by_text[query.text],
                                                                                sparse_vector, request)
                    doc = {pid: str(hit.payload["doc_id"]) for pid, hit in found.items()}
                    lists.append((dense_list, sparse_list, doc))
                if not rows:
                    record("dense", [[doc[p] for p, _ in d.pairs] for d, _, doc in lists])
                record(variant, [[doc[p] for p, _ in s.pairs] for _, s, doc in lists])
                fusions = COMPARED if kind == "bm25" else {DEFAULT_ROW: FUSIONS[DEFAULT_FUSION]}
                for row_name, fusion in fusions.items():
                    fused = [[doc[f.id] for f in fuse([d, s], fusion, CANDIDATES)] for d, s, doc in lists]
                    record(f"hybrid: dense + {variant}, {row_name}", fused,
                           "the default" if row_name == DEFAULT_ROW and kind == "bm25" else "")
                    if kind == "bm25" and row_name == DEFAULT_ROW:
                        default_fused = fused
            if score_engine is not None:
                text_of = dict(zip(map(str, range(len(labelled.chunks))), labelled.chunks))
                reranked = []
                for query, ids in zip(labelled.queries, default_fused):
                    scores, _ = score_engine.score([ScoreRequest(j, query.text, text_of[doc]) for j, doc in enumerate(ids)])
                    # the searcher's rule: rerank score at 6 places, then the fused order
                    order = sorted(range(len(ids)), key=lambda j: (-score_key(scores[j].score or float("-inf")), j))
                    reranked.append([ids[j] for j in order])
                record(f"hybrid + rerank ({score_engine.spec.name})", reranked,
                       f"the default fusion's top {CANDIDATES} ordered by the cross-encoder")
            else:
                rows["hybrid + rerank"] = MethodRow("hybrid + rerank", note=(
                    f"not measured: no trained cross-encoder ships offline; --reranker PATH orders the default "
                    f"fusion's top {CANDIDATES} by it"))
        finally:
            store.close()
    return CorpusResult(name, len(labelled.chunks), {kind: len(labelled.of_kind(kind)) for kind in KINDS},
                        list(rows.values()), time.perf_counter() - start)


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

    def fmt(value: float) -> str:
        return "-" if value != value else f"{value:.3f}"

    for corpus in result.corpora:
        table = Table(title=(f"{corpus.corpus}: {corpus.chunks} texts, {corpus.queries['known_item']} known-item + "
                             f"{corpus.queries['exact_term']} exact-term queries; {result.model} dense; "
                             f"{CANDIDATES} candidates per list; MRR@{k} / recall@{k}"))
        for col in ("method", "known-item MRR", f"R@{k}", "exact-term MRR", f"R@{k} ", "note"):
            table.add_column(col, justify="left" if col in ("method", "note") else "right")
        for row in corpus.rows:
            cells = []
            for kind in KINDS:
                cells += [fmt(row.mrr(kind, k)), fmt(row.recall(kind, k))]
            name = f"[bold]{row.method}[/bold]" if row.note == "the default" else row.method
            table.add_row(name, *cells, row.note)
        console.print(table)
        console.print(_check(corpus, k))
    cost = Table(title="bulk cost: engine alone on the same chunks (best of rounds, shared loaded host)")
    for col in ("encoder", "chunks/s", "vs dense only"):
        cost.add_column(col, justify="left" if col == "encoder" else "right")
    base = result.cost[0].chunks_per_s
    for row in result.cost:
        cost.add_row(row.encoder, f"{row.chunks_per_s:,.0f}", f"{(row.chunks_per_s / base - 1) * 100:+.1f}%")
    console.print(cost)
    console.print(f"{result.seconds:.0f} s in all")


def _check(corpus: CorpusResult, k: int) -> str:
    """The default fusion against the better of dense and BM25, per query kind and half: MRR and recall deltas."""
    rows = {row.method: row for row in corpus.rows}
    default = rows[f"hybrid: dense + bm25, {DEFAULT_ROW}"]
    singles = [rows["dense"], rows["bm25"]]
    lines = [f"default ({DEFAULT_ROW}) minus the better of dense and bm25, MRR@{k} / R@{k} (>= -{TOLERANCE} holds):"]
    for kind in KINDS:
        cells = []
        for half in (0, 1):
            d_mrr = default.mrr(kind, k, half) - max(r.mrr(kind, k, half) for r in singles)
            d_rec = default.recall(kind, k, half) - max(r.recall(kind, k, half) for r in singles)
            ok = "holds" if min(d_mrr, d_rec) >= -TOLERANCE else "MISSES"
            cells.append(f"half {half}: {d_mrr:+.3f} / {d_rec:+.3f} {ok}")
        gain = default.recall(kind, k) - rows["dense"].recall(kind, k)
        lines.append(f"  {kind}: " + "; ".join(cells) + f"; R@{k} vs dense {gain:+.3f}")
    return "\n".join(lines)
