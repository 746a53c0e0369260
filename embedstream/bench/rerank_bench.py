"""`embedstream bench rerank`: the cross-encoder path against sentence-transformers, and the full search path.

One run, side by side:
1. rerank requests of ``candidates`` (default 50) passages of ~``tokens`` (default 256) tokens each
   through ``Engine.score`` (token-budget batcher, packed padding-free forward) and through
   sentence-transformers ``CrossEncoder.predict`` on the same pairs: pairs/s, per-request p50/p95,
   the ratio, and the largest score difference (they must agree);
2. the full search path in one process: a few hundred real chunks embedded with the engine into a
   store, then ``Searcher.search`` (embed the query -> Qdrant top_k -> rerank -> top_n), per-stage
   p50/p95.
Without ``--model`` a MiniLM-sized cross-encoder (MiniLM-L6 weights plus a one-label head; the
same cost as ms-marco-MiniLM-L-6-v2, whose weights cannot be downloaded here) is built once into
``~/.cache/embedstream/models/minilm-ce``.
"""

from __future__ import annotations

import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embedstream import logs
from embedstream.corpus import documents, stdlib_paragraphs
from embedstream.config import ModelConfig, Settings, default_registry
from embedstream.engine.engine import EmbedRequest, Engine, ScoreRequest
from embedstream.engine.model_spec import build_spec, resolve_path

DEFAULT_CE_DIR = Path.home() / ".cache" / "embedstream" / "models" / "minilm-ce"
TARGET_RATIO = 1.5


def build_minilm_cross_encoder(folder: Path = DEFAULT_CE_DIR, seed: int = 0) -> Path:
    """MiniLM-L6 (from the offline registry) with a fresh one-label classification head; built once."""
    folder = Path(folder).expanduser()
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    base = resolve_path(default_registry()["all-MiniLM-L6-v2"].path)
    torch.manual_seed(seed)
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=1).eval().save_pretrained(tmp)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def load_reranker(model: str | None, threads: int | None) -> Engine:
    """The engine for a registry name / folder, or the built MiniLM-sized cross-encoder."""
    settings = Settings()
    settings.engine.threads = threads
    if model is None:
        path = build_minilm_cross_encoder()
        return Engine(build_spec("minilm-ce", ModelConfig(path=str(path), kind="rerank")), settings.engine)
    if model in settings.models:
        return Engine.from_name(model, settings)
    return Engine(build_spec(Path(model).name, ModelConfig(path=model, kind="rerank")), settings.engine)


@dataclass
class Workload:
    queries: list[str]
    passages: list[list[str]]
    passage_tokens: list[int] = field(default_factory=list)

    @property
    def pairs(self) -> int:
        return sum(len(p) for p in self.passages)


def make_workload(engine: Engine, requests: int, candidates: int, tokens: int, spread: int, seed: int = 11) -> Workload:
    """Real prose: per request one question-like query and ``candidates`` passages of tokens +- spread."""
    tok = engine.tokenizer.tokenizer
    paras = stdlib_paragraphs()
    rng = random.Random(seed)
    room = engine.spec.max_tokens - 40  # leave space for the query and special tokens
    queries, passages, lengths = [], [], []
    for _ in range(requests):
        q = paras[rng.randrange(len(paras))].split()
        queries.append(" ".join(q[: rng.randint(6, 14)]).rstrip(".:,") + "?")
        group = []
        for _ in range(candidates):
            target = min(room, max(16, tokens + rng.randint(-spread, spread)))
            start = rng.randrange(len(paras))
            words: list[str] = []
            j = start
            while len(words) < target * 2:
                words.extend(paras[j % len(paras)].split())
                j += 1
            ids = tok.encode(" ".join(words), add_special_tokens=False)
            text = tok.decode(ids.ids[:target]) if len(ids.ids) > target else " ".join(words)
            group.append(text)
            lengths.append(min(target, len(ids.ids)))
        passages.append(group)
    return Workload(queries, passages, lengths)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass
class MethodStats:
    method: str
    pairs_per_s: float
    p50_ms: float
    p95_ms: float
    tokens_per_s: float = 0.0  # real tokens
    max_abs_diff: float | None = None
    computed_tokens: int = 0  # real + padding


def _st_computed_tokens(model, query: str, group: list[str], batch_size: int, max_tokens: int) -> tuple[int, int]:
    """(real, computed) tokens of CrossEncoder.predict: it sorts pairs by length, pads each batch to its longest."""
    tok = model.tokenizer
    lengths = [len(ids) for ids in tok([query] * len(group), group, truncation=True, max_length=max_tokens)["input_ids"]]
    lengths.sort(reverse=True)
    computed = sum(max(lengths[i : i + batch_size]) * len(lengths[i : i + batch_size])
                   for i in range(0, len(lengths), batch_size))
    return sum(lengths), computed


def compare(engine: Engine, work: Workload, baseline: bool = True, batch_size: int = 32) -> tuple[list[MethodStats], float | None]:
    """Engine.score vs CrossEncoder.predict, one call per request each, interleaved request by request
    (alternating which goes first) so a shared machine's noise falls on both alike."""
    model = None
    if baseline:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(str(engine.spec.path), device="cpu", max_length=engine.spec.max_tokens)
        model.predict([(work.queries[0], p) for p in work.passages[0][:8]], batch_size=batch_size,
                      show_progress_bar=False)  # warm-up
    engine.score([ScoreRequest(i, work.queries[0], p) for i, p in enumerate(work.passages[0][:8])])  # warm-up
    ours: list[float] = []
    theirs: list[float] = []
    ours_s = theirs_s = 0.0
    tokens = st_real = st_computed = 0
    diff = 0.0

    def run_ours(query: str, group: list[str]) -> np.ndarray:
        nonlocal ours_s, tokens
        t0 = time.perf_counter()
        results, timings = engine.score([ScoreRequest(i, query, p) for i, p in enumerate(group)])
        elapsed = time.perf_counter() - t0
        ours.append(elapsed * 1000)
        ours_s += elapsed
        tokens += timings.tokens
        return np.array([r.score for r in results], dtype=np.float64)

    def run_theirs(query: str, group: list[str]) -> np.ndarray:
        nonlocal theirs_s
        t0 = time.perf_counter()
        out = model.predict([(query, p) for p in group], batch_size=batch_size, show_progress_bar=False)
        elapsed = time.perf_counter() - t0
        theirs.append(elapsed * 1000)
        theirs_s += elapsed
        return np.asarray(out, dtype=np.float64)

    for n, (query, group) in enumerate(zip(work.queries, work.passages)):
        if model is None:
            run_ours(query, group)
            continue
        if n % 2 == 0:
            a = run_ours(query, group)
            b = run_theirs(query, group)
        else:
            b = run_theirs(query, group)
            a = run_ours(query, group)
        diff = max(diff, float(np.abs(a - b).max()))
        real, computed = _st_computed_tokens(model, query, group, batch_size, engine.spec.max_tokens)
        st_real += real
        st_computed += computed
    rows = [MethodStats("embedstream Engine.score (packed, no padding)", work.pairs / ours_s, _pct(ours, 50),
                        _pct(ours, 95), tokens / ours_s, diff if model is not None else None, tokens)]
    if model is not None:
        rows.append(MethodStats(f"sentence-transformers CrossEncoder.predict (batch {batch_size}, length-sorted)",
                                work.pairs / theirs_s, _pct(theirs, 50), _pct(theirs, 95), st_real / theirs_s, None,
                                st_computed))
    return rows, (1 - st_real / st_computed) if st_computed else None


@dataclass
class SearchStats:
    chunks: int
    queries: int
    top_k: int
    top_n: int
    store: str
    plan: str
    index_s: float
    stages: dict[str, tuple[float, float]]  # stage -> (p50, p95) ms
    mean_chunk_tokens: float = 0.0


def bench_search(reranker: Engine, embed_model: str, threads: int | None, chunks: int, queries: int, top_k: int,
                 top_n: int, store_kind: str = "memory", chunk_tokens: int = 200) -> SearchStats:
    """Index real chunks with the engine, then time Searcher.search in-process, stage by stage."""
    from embedstream.producers.chunker import Chunker
    from embedstream.schemas import ChunkEvent
    from embedstream.schemas.rerank import SearchRequest
    from embedstream.vectorstore.factory import open_store
    from embedstream.workers.search import Searcher
    from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

    settings = Settings()
    settings.engine.threads = threads
    embedder = Engine.from_name(embed_model, settings)
    chunker = Chunker.for_model(embedder.spec, chunk_tokens, 32)
    events: list[ChunkEvent] = []
    for doc in documents(max(1, chunks // 3) * 4, seed=21):
        for i, text in enumerate(chunker.chunk(doc["text"])):
            events.append(ChunkEvent(doc_id=doc["doc_id"], chunk_id=i, text=text, metadata=doc["metadata"]))
        if len(events) >= chunks:
            break
    events = events[:chunks]
    tmp = None
    if store_kind == "edge":
        tmp = tempfile.TemporaryDirectory(prefix="embedstream-rerank-bench-")
        store = open_store(None, None, tmp.name)
    else:
        store = open_store(":memory:", None, None)
    try:
        t0 = time.perf_counter()
        results, _ = embedder.embed([EmbedRequest(i, e.text, prompt="document") for i, e in enumerate(events)])
        sink = QdrantSink(store, embedder.spec, embedder.dimensions, "bench", SinkConfig())
        sink.upsert([EmbeddedChunk(e, r.full) for e, r in zip(events, results)])
        index_s = time.perf_counter() - t0
        searcher = Searcher(store, embedder, reranker, "bench")
        paras = stdlib_paragraphs()
        rng = random.Random(5)
        texts = [" ".join(paras[rng.randrange(len(paras))].split()[:10]) for _ in range(queries)]
        searcher.search(SearchRequest(request_id="warm", query=texts[0], reply_to="-", top_k=top_k, top_n=top_n))
        stages: dict[str, list[float]] = {"embed": [], "search": [], "rerank": [], "total": []}
        for n, text in enumerate(texts):
            reply = searcher.search(SearchRequest(request_id=str(n), query=text, reply_to="-", top_k=top_k, top_n=top_n))
            if reply.error is not None:
                raise RuntimeError(f"search failed: {reply.error.code}: {reply.error.message}")
            for stage in stages:
                stages[stage].append(reply.timings_ms.get(stage, 0.0))
        plan = searcher.plan("bench").describe()
    finally:
        store.close()
        if tmp is not None:
            tmp.cleanup()
    return SearchStats(len(events), queries, top_k, top_n, store_kind, plan, index_s,
                       {k: (_pct(v, 50), _pct(v, 95)) for k, v in stages.items()},
                       float(np.mean([r.tokens for r in results])))


@dataclass
class RerankBenchResult:
    model: str
    path: str
    threads: int | None
    requests: int
    candidates: int
    tokens: int
    spread: int
    mean_passage_tokens: float
    rows: list[MethodStats]
    search: SearchStats | None
    st_padding: float | None = None  # share of the baseline's computed tokens that were padding

    @property
    def ratio(self) -> float | None:
        return self.rows[0].pairs_per_s / self.rows[1].pairs_per_s if len(self.rows) > 1 else None


def run(model: str | None = None, threads: int | None = None, requests: int = 4, candidates: int = 50,
        tokens: int = 256, spread: int = 64, baseline: bool = True, search: bool = True,
        embed_model: str = "all-MiniLM-L6-v2", search_chunks: int = 250, search_queries: int = 8,
        top_k: int = 30, top_n: int = 10, store: str = "memory", chunk_tokens: int = 128) -> RerankBenchResult:
    import torch

    if threads:
        torch.set_num_threads(threads)
    engine = load_reranker(model, threads)
    work = make_workload(engine, requests, candidates, tokens, spread)
    rows, st_padding = compare(engine, work, baseline)
    stats = None
    if search:
        stats = bench_search(engine, embed_model, threads, search_chunks, search_queries, top_k, top_n, store, chunk_tokens)
    return RerankBenchResult(engine.spec.name, engine.runner.describe(), threads, requests, candidates, tokens, spread,
                             float(np.mean(work.passage_tokens)), rows, stats, st_padding)


def print_table(result: RerankBenchResult, console=None) -> None:
    from rich.table import Table

    console = console or logs.console()
    title = (f"rerank: {result.model} ({result.path}), {result.requests} requests x {result.candidates} candidates, "
             f"passages {result.tokens}±{result.spread} tokens (mean {result.mean_passage_tokens:.0f}), "
             f"threads {result.threads or 'all'}")
    table = Table(title=title)
    for col in ("method", "pairs/s", "real tokens/s", "computed tokens", "request p50 ms", "request p95 ms", "max |Δscore|"):
        table.add_column(col, justify="right" if col != "method" else "left")
    for row in result.rows:
        table.add_row(row.method, f"{row.pairs_per_s:.1f}", f"{row.tokens_per_s:.0f}", f"{row.computed_tokens}",
                      f"{row.p50_ms:.0f}", f"{row.p95_ms:.0f}",
                      f"{row.max_abs_diff:.1e}" if row.max_abs_diff is not None else "-")
    if result.ratio is not None:
        ok = "[green]met[/green]" if result.ratio >= TARGET_RATIO else "[red]missed[/red]"
        table.add_row("ratio (embedstream / sentence-transformers)", f"{result.ratio:.2f}x", "", "", "", "",
                      f"target ≥ {TARGET_RATIO}x: {ok}")
    console.print(table)
    if result.st_padding is not None:
        console.print(f"padding in the baseline's batches: {result.st_padding:.1%} of its computed tokens "
                      f"(the most that packing alone can save on this workload: {1 / (1 - result.st_padding):.2f}x)")
    s = result.search
    if s is None:
        return
    table = Table(title="search path, one process: embed -> Qdrant top_k -> rerank -> top_n")
    for col in ("stage", "p50 ms", "p95 ms"):
        table.add_column(col, justify="right" if col != "stage" else "left")
    for stage, (p50, p95) in s.stages.items():
        table.add_row(stage, f"{p50:.1f}", f"{p95:.1f}")
    console.print(table)
    console.print(f"{s.chunks} real chunks (mean {s.mean_chunk_tokens:.0f} tokens) indexed in {s.index_s:.1f} s into the "
                  f"{s.store} store ({s.plan}); {s.queries} queries, top_k {s.top_k}, top_n {s.top_n}")


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--candidates", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--spread", type=int, default=64)
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--no-search", action="store_true")
    parser.add_argument("--search-chunks", type=int, default=250)
    parser.add_argument("--search-queries", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=30)
    parser.add_argument("--top-n", type=int, default=10)
    parser.add_argument("--store", choices=("memory", "edge"), default="memory")
    parser.add_argument("--chunk-tokens", type=int, default=128)
    a = parser.parse_args(argv)
    print_table(run(a.model, a.threads, a.requests, a.candidates, a.tokens, a.spread, not a.no_baseline,
                    not a.no_search, search_chunks=a.search_chunks, search_queries=a.search_queries,
                    top_k=a.top_k, top_n=a.top_n, store=a.store, chunk_tokens=a.chunk_tokens))


if __name__ == "__main__":
    main()
