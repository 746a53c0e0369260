"""`embedstream bench fusion`: the default fusion's two choices, the sparse score's unit and the dense scale,
chosen on one corpus and reported on another that was never used for choosing.

The default fusion (``logit``, :mod:`embedstream.ranking`) is ``scale x cosine + sparse / unit``. A BM25 score
is a sum over the query's terms, so it grows with the query's length and a cosine does not: with ``unit`` 1
the same scale weighs a 20-term query's BM25 several times as heavily as a 2-term query's. Units compared
(:data:`UNITS`):

* ``raw``: 1 (the fusion before issue #42);
* ``list max``: the sparse list's best score (the query's best point gets 1);
* ``term max``: the query's maximum attainable score in the collection, the sum over its terms of the best
  score any point gets from that term alone;
* ``idf sum``: the query's sum of IDF weights, ``sum q_t x idf_t`` (a BM25 score is ``sum q_t x idf_t x w_t``
  with a term-frequency weight ``w_t < k + 1``): what the searcher computes for BM25
  (:meth:`Searcher.sparse_unit`, the store's IDF read off one-term searches).

All four are computed here from the indexed vectors (Qdrant's IDF formula), checked against the store: its
BM25 scores, and the searcher's own unit.

Per corpus one collection in a temporary qdrant-edge store (all-MiniLM-L6-v2 dense, BM25 over Qdrant's word
analyser, written through the sink); every query goes through the searcher's own hybrid path
(:meth:`Searcher.hybrid_candidates`: the dense plan's candidates and the sparse ones, 50 each with the points
tied at their cuts, every candidate scored exactly in both lists), and the same two lists are fused with
every unit and scale. Queries (:mod:`embedstream.bench.hybrid_set`): known-item, exact-term and long
(a 25-word passage or longer, 10-25 terms).

Choosing, on the tuning corpus only: the objective is MRR@10 averaged over the three query kinds, smoothed
over the scale grid (the mean of a scale and its neighbours: the top of the curve is flat, and its highest
single point is noise); for each unit the scale with the best smoothed objective, then the unit with the best
smoothed objective at its scale. How well one scale serves every query length is
shown by the **length regret**: the queries bucketed by their number of BM25 terms (:data:`BUCKETS`), the
MRR@10 each bucket would reach at its own best scale minus what it reaches at the unit's one scale,
weighted by the bucket's share of the queries (0: the scale means the same at every length). Each report
corpus then gets every row at the scales chosen on the tuning corpus, beside dense, BM25, RRF, DBSF and the
fusion before issue #42 (``30 x cosine + BM25``, a point missing from the sparse list credited with the
list's last score).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from embedstream import logs
from embedstream.bench import hybrid_set
from embedstream.ranking import DENSE_LOGIT_SCALE, FUSIONS, Candidates, Fusion, fuse

KINDS = ("known_item", "exact_term", "long")
CANDIDATES = 50  # per list, as a search's default top_k
K = 10  # MRR@K, recall@K
UNITS = ("raw", "list max", "term max", "idf sum")
SCALES = {
    "raw": (5, 10, 15, 20, 25, 30, 40, 50, 60, 80),
    "normalised": (0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.25, 2.5, 2.75, 3, 3.5, 4, 5, 6, 8),
}
BUCKETS = ((1, 1), (2, 4), (5, 9), (10, 14), (15, 10**6))  # number of BM25 terms of the query
BEFORE = "before #42: 30 x cosine + BM25, the cut's score"


def scales_of(unit: str) -> tuple[float, ...]:
    return SCALES["raw" if unit == "raw" else "normalised"]


def bucket_name(bounds: tuple[int, int]) -> str:
    low, high = bounds
    return f"{low}" if low == high else (f"{low}+" if high >= 10**6 else f"{low}-{high}")


@dataclass
class QueryLists:
    """One query's two candidate lists (as the searcher fuses them) and what each unit is for it."""

    kind: str
    answer: str  # the doc_id of the one right text
    terms: int  # distinct BM25 terms
    dense: Candidates
    sparse: Candidates
    units: dict[str, float]
    before: tuple[Candidates, Candidates]  # the lists as the fusion before #42 scored them
    doc: dict[str, str]  # point id -> doc_id

    def bucket(self) -> int:
        return next(n for n, (low, high) in enumerate(BUCKETS) if low <= self.terms <= high)


@dataclass
class CorpusLists:
    corpus: str
    texts: int
    queries: list[QueryLists]
    idf_check: float  # the largest relative gap between the store's BM25 scores and sum(idf x weight) computed here
    unit_check: float  # the largest relative gap between the searcher's unit and the idf sum computed here
    search_check: int  # queries whose top-K from the searcher's own hybrid search is not the one fused here (0)
    seconds: float

    def count(self, kind: str) -> int:
        return sum(q.kind == kind for q in self.queries)


@dataclass
class Ranks:
    """The rank (1-based, None: not in the top K) of each query's answer under one method."""

    ranks: list[int | None]
    queries: list[QueryLists]

    def mrr(self, kind: str | None = None, bucket: int | None = None) -> float:
        picked = self._pick(kind, bucket)
        return float(np.mean([1.0 / r if r else 0.0 for r in picked])) if picked else float("nan")

    def recall(self, kind: str | None = None) -> float:
        picked = self._pick(kind, None)
        return float(np.mean([r is not None for r in picked])) if picked else float("nan")

    def objective(self) -> float:
        """The choice's criterion: MRR@K averaged over the query kinds (each kind weighs the same)."""
        return float(np.mean([self.mrr(kind) for kind in KINDS]))

    def _pick(self, kind: str | None, bucket: int | None) -> list[int | None]:
        return [r for r, q in zip(self.ranks, self.queries)
                if (kind is None or q.kind == kind) and (bucket is None or q.bucket() == bucket)]


def logit(scale: float) -> Fusion:
    return Fusion("logit", (Fraction(scale).limit_denominator(1000), Fraction(1)))


def ranks_of(corpus: CorpusLists, method) -> Ranks:
    """``method(query) -> ordered point ids``; the answer's rank in the first K."""
    out = []
    for q in corpus.queries:
        ids = [q.doc[pid] for pid in method(q)[:K]]
        out.append(ids.index(q.answer) + 1 if q.answer in ids else None)
    return Ranks(out, corpus.queries)


def fused(unit: str, scale: float):
    fusion = logit(scale)
    return lambda q: [f.id for f in fuse([q.dense, replace(q.sparse, unit=q.units[unit])], fusion, K)]


def before(q: QueryLists) -> list[str]:
    return [f.id for f in fuse(list(q.before), logit(30), K)]


def single(which: str):
    return lambda q: [pid for pid, _ in (q.dense if which == "dense" else q.sparse).pairs]


def named(name: str):
    fusion = FUSIONS[name]
    return lambda q: [f.id for f in fuse([Candidates(q.dense.pairs), Candidates(q.sparse.pairs)], fusion, K)]


# -- collecting the candidate lists ------------------------------------------------------------------------------
def _settings(threads: int | None, kind: str = "none"):
    from embedstream.config import Settings

    settings = Settings()
    settings.engine.threads = threads
    settings.sparse.kind = kind
    return settings


def collect(corpus: str, model: str, chunks: int, queries: int, threads: int | None,
            seed: int = 11) -> CorpusLists:
    """Index ``corpus``'s labelled set and collect every query's candidate lists through the searcher."""
    from embedstream.bench.quality_bench import embed_cached
    from embedstream.engine.engine import Engine
    from embedstream.schemas import ChunkEvent
    from embedstream.schemas.rerank import SearchRequest
    from embedstream.vectors import encoded_rows
    from embedstream.vectorstore.edge_store import EdgeStore
    from embedstream.workers.search import Searcher
    from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

    start = time.perf_counter()
    labelled = hybrid_set.CORPORA[corpus](chunks, queries, queries, seed=seed, long=queries)
    dense = embed_cached(model, labelled.chunks, threads, progress=False)
    query_vectors = embed_cached(model, [q.text for q in labelled.queries], threads, progress=False, prompt="query")
    engine = Engine.from_name(model, _settings(threads, "bm25"))
    bm25 = engine.sparse
    documents = bm25.encode_texts(labelled.chunks, query=False)
    idf = _idf(documents)
    best_weight: dict[int, float] = {}  # term -> its largest stored weight: the term max
    for vector in documents:
        for t, w in zip(vector.indices.tolist(), vector.values.tolist()):
            best_weight[t] = max(best_weight.get(t, 0.0), w)
    out: list[QueryLists] = []
    worst = worst_unit = 0.0
    differ = 0
    with tempfile.TemporaryDirectory(prefix="embedstream-fusion-") as folder:
        store = EdgeStore(folder)
        try:
            sink = QdrantSink(store, engine.spec, engine.dimensions, "fusion", SinkConfig(sparse="bm25"))
            rows = encoded_rows(dense, documents)
            for at in range(0, len(rows), 512):
                sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=str(i), chunk_id=0, text=labelled.chunks[i]), rows[i])
                             for i in range(at, min(at + 512, len(rows)))])
            vectors = {q.text: v for q, v in zip(labelled.queries, query_vectors)}
            searcher = Searcher(store, lambda text: vectors[text], None, "fusion", sparse=bm25)
            for query in labelled.queries:
                sparse = bm25.encode_texts([query.text], query=True)[0]
                request = SearchRequest(request_id="b", query=query.text, reply_to="-", rerank=False, mode="hybrid",
                                        top_k=CANDIDATES)
                dense_list, sparse_list, found = searcher.hybrid_candidates("fusion", vectors[query.text], sparse, request)
                doc = {pid: str(hit.payload["doc_id"]) for pid, hit in found.items()}
                weights = dict(zip(sparse.indices.tolist(), sparse.values.tolist()))
                idf_sum = sum(idf.get(t, 0.0) * w for t, w in weights.items())
                term_max = sum(idf.get(t, 0.0) * w * best_weight.get(t, 0.0) for t, w in weights.items())
                if idf_sum > 0:
                    worst_unit = max(worst_unit, abs(sparse_list.unit - idf_sum) / idf_sum)
                for pid, score in sparse_list.pairs[:3]:  # the store's BM25 = sum(idf x weight) computed here
                    stored = documents[int(doc[pid])]
                    mine = sum(idf[t] * weights[t] * float(v) for t, v in zip(stored.indices.tolist(), stored.values)
                               if t in weights)
                    worst = max(worst, abs(mine - score) / max(score, 1e-9))
                top = sparse_list.pairs[0][1] if sparse_list.pairs else 0.0
                units = {"raw": 1.0, "list max": top if top > 0 else 1.0, "term max": term_max if term_max > 0 else 1.0,
                         "idf sum": idf_sum if idf_sum > 0 else 1.0}
                lists = QueryLists(query.kind, str(query.answer), len(weights), replace(dense_list),
                                   replace(sparse_list, unit=1.0), units, _before(dense_list, sparse_list), doc)
                reply = searcher.search(request.model_copy(update={"top_n": K}))
                differ += [h.id for h in reply.hits] != fused("idf sum", float(DENSE_LOGIT_SCALE))(lists)
                out.append(lists)
        finally:
            store.close()
    return CorpusLists(corpus, len(labelled.chunks), out, worst, worst_unit, differ, time.perf_counter() - start)


def _idf(documents) -> dict[int, float]:
    """Qdrant's IDF over these sparse vectors: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    df = Counter(t for vector in documents for t in vector.indices.tolist())
    n = len(documents)
    return {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}


def _before(dense: Candidates, sparse: Candidates) -> tuple[Candidates, Candidates]:
    """The two lists as the fusion before #42 scored them: each cut at exactly CANDIDATES, a sparse-only point's
    exact cosine, a dense-only one credited with the sparse list's last score (0 where the list ran short)."""
    dense_pairs, sparse_pairs = list(dense.pairs[:CANDIDATES]), list(sparse.pairs[:CANDIDATES])
    floor = sparse_pairs[-1][1] if len(sparse_pairs) == CANDIDATES else 0.0
    in_dense = {pid for pid, _ in dense_pairs}
    extra = {pid: dense.extra[pid] if pid in dense.extra else dict(dense.pairs)[pid]
             for pid, _ in sparse_pairs if pid not in in_dense}
    return Candidates(dense_pairs, extra), Candidates(sparse_pairs, absent=floor)


# -- choosing and reporting --------------------------------------------------------------------------------------
@dataclass
class UnitChoice:
    unit: str
    scale: float
    objective: float  # the smoothed objective at the scale (what was maximised)
    by_scale: dict[float, Ranks]
    regret: float  # MRR@K lost by one scale against a scale per length bucket
    bucket_best: list[tuple[float, float, int]]  # per bucket: its own best scale, MRR@K there, queries


@dataclass
class Report:
    """One report corpus: every row at the scales chosen on the tuning corpus, and the same sweep there (a check)."""

    corpus: CorpusLists
    rows: dict[str, Ranks]
    checks: dict[str, UnitChoice]


@dataclass
class FusionSweepResult:
    model: str
    tune: CorpusLists
    choices: dict[str, UnitChoice]
    chosen: str
    reports: list[Report] = field(default_factory=list)
    seconds: float = 0.0


def smoothed(by_scale: dict[float, Ranks]) -> dict[float, float]:
    """Each scale's objective averaged with its neighbours' on the grid."""
    scales = sorted(by_scale)
    values = [by_scale[s].objective() for s in scales]
    return {s: float(np.mean(values[max(0, n - 1): n + 2])) for n, s in enumerate(scales)}


def sweep(corpus: CorpusLists, unit: str, fixed: float | None = None) -> UnitChoice:
    """Every scale of ``unit`` on ``corpus``; the best one by the smoothed objective (or ``fixed``), and the length
    regret at it."""
    by_scale = {scale: ranks_of(corpus, fused(unit, scale)) for scale in scales_of(unit)}
    smooth = smoothed(by_scale)
    best = fixed if fixed is not None else max(smooth, key=lambda s: (smooth[s], -s))
    total = len(corpus.queries)
    regret, bucket_best = 0.0, []
    for n in range(len(BUCKETS)):
        size = sum(q.bucket() == n for q in corpus.queries)
        if not size:
            bucket_best.append((float("nan"), float("nan"), 0))
            continue
        own = max(by_scale, key=lambda s: (by_scale[s].mrr(bucket=n), -s))
        bucket_best.append((own, by_scale[own].mrr(bucket=n), size))
        regret += size / total * (by_scale[own].mrr(bucket=n) - by_scale[best].mrr(bucket=n))
    return UnitChoice(unit, best, smooth[best], by_scale, regret, bucket_best)


def run(model: str = "all-MiniLM-L6-v2", tune: str = "api", reports: tuple[str, ...] = ("prose", "numpy"),
        chunks: int = 3000, queries: int = 200, threads: int | None = 1) -> FusionSweepResult:
    if tune in reports:
        raise ValueError("a report corpus must be another than the tuning one")
    start = time.perf_counter()
    tuned = collect(tune, model, chunks, queries, threads)
    choices = {unit: sweep(tuned, unit) for unit in UNITS}
    chosen = max(UNITS, key=lambda u: (choices[u].objective, -UNITS.index(u)))
    out = []
    for name in reports:
        held = collect(name, model, chunks, queries, threads)
        rows = {
            "dense": ranks_of(held, single("dense")),
            "BM25": ranks_of(held, single("sparse")),
            "RRF k 60": ranks_of(held, named("rrf")),
            "DBSF": ranks_of(held, named("dbsf")),
            BEFORE: ranks_of(held, before),
        }
        for unit in UNITS:
            rows[_row(unit, choices[unit].scale)] = ranks_of(held, fused(unit, choices[unit].scale))
        out.append(Report(held, rows, {unit: sweep(held, unit, fixed=choices[unit].scale) for unit in UNITS}))
    return FusionSweepResult(model, tuned, choices, chosen, out, time.perf_counter() - start)


def _row(unit: str, scale: float) -> str:
    return f"{_fmt_scale(scale)} x cosine + BM25" + ("" if unit == "raw" else f" / {unit}")


def _fmt_scale(scale: float) -> str:
    return f"{scale:g}"


def print_table(result: FusionSweepResult, console=None) -> None:
    from rich.table import Table

    console = console or logs.console()

    def fmt(value: float) -> str:
        return "-" if value != value else f"{value:.3f}"

    def corpus_line(corpus: CorpusLists) -> str:
        return (f"{corpus.corpus}: {corpus.texts} texts, " + ", ".join(f"{corpus.count(k)} {k}" for k in KINDS)
                + f" queries (checks, store vs here: BM25 within {corpus.idf_check:.1e}, the searcher's unit within "
                f"{corpus.unit_check:.1e}, its top-{K} other than the default row's: {corpus.search_check})")

    tune = result.tune
    table = Table(title=f"tuning corpus, {corpus_line(tune)}: mean MRR@{K} over the query kinds, per dense scale")
    table.add_column("unit")
    table.add_column("MRR@10 per scale")
    table.add_column("chosen (smoothed)")
    table.add_column("length regret", justify="right")
    for unit, choice in result.choices.items():
        cells = " ".join(f"{_fmt_scale(s)}:{r.objective():.4f}" for s, r in choice.by_scale.items())
        name = f"[bold]{unit}[/bold]" if unit == result.chosen else unit
        table.add_row(name, cells, f"{_fmt_scale(choice.scale)} ({choice.objective:.4f})", f"{choice.regret:.4f}")
    console.print(table)
    console.print(_bucket_table(f"tuning corpus ({tune.corpus}): each length's own best scale, MRR@{K} there", tune,
                                result.choices))
    chosen_row = _row(result.chosen, result.choices[result.chosen].scale)
    for report in result.reports:
        rows = Table(title=(f"report corpus (never used for choosing), {corpus_line(report.corpus)}; {result.model}; "
                            f"{CANDIDATES} candidates per list; MRR@{K} / recall@{K}; scales chosen on {tune.corpus}"))
        rows.add_column("method")
        for kind in KINDS:
            rows.add_column(kind, justify="right")
        rows.add_column("mean MRR", justify="right")
        for name, ranks in report.rows.items():
            label = f"[bold]{name} (default)[/bold]" if name == chosen_row else name
            rows.add_row(label, *[f"{fmt(ranks.mrr(k))} / {fmt(ranks.recall(k))}" for k in KINDS],
                         fmt(ranks.objective()))
        console.print(rows)
        console.print(_bucket_table(f"report corpus ({report.corpus.corpus}), a check: each length's own best scale, "
                                    f"MRR@{K} there, against the scale chosen on {tune.corpus}", report.corpus,
                                    report.checks))
    console.print(f"chosen on {tune.corpus}: unit {result.chosen!r}, dense scale "
                  f"{_fmt_scale(result.choices[result.chosen].scale)}; {result.seconds:.0f} s in all")


def _bucket_table(title: str, corpus: CorpusLists, choices: dict[str, UnitChoice]):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("unit")
    sizes = Counter(q.bucket() for q in corpus.queries)
    for n, bounds in enumerate(BUCKETS):
        table.add_column(f"{bucket_name(bounds)} terms ({sizes.get(n, 0)})", justify="right")
    table.add_column("scale used", justify="right")
    table.add_column("regret", justify="right")
    for unit, choice in choices.items():
        cells = [("-" if not size else f"{_fmt_scale(scale)} ({mrr:.3f} vs {choice.by_scale[choice.scale].mrr(bucket=n):.3f})")
                 for n, (scale, mrr, size) in enumerate(choice.bucket_best)]
        table.add_row(unit, *cells, _fmt_scale(choice.scale), f"{choice.regret:.4f}")
    return table
