"""`embedstream bench exact --url URL`: a Qdrant server's top-10 against exact search, above its indexing threshold.

A server keeps a collection's points in segments and builds an HNSW graph for a segment once its vectors pass
``indexing_threshold_kb`` (10,000 KB by default: some 6,500 points of 384 float32 dimensions each); a search
of an indexed segment walks the graph (approximate), the embedded store without :meth:`EdgeStore.optimize`
and qdrant-client's local mode scan every point (exact). This bench writes real chunks (the stdlib's and
numpy's docstring prose and the stdlib's API records, all-MiniLM-L6-v2 vectors and BM25, through the sink)
into a server collection and into an embedded store, waits until the server has indexed its segments, and
asks the same queries (the labelled queries of `bench fusion`'s prose and numpy sets) through the searcher
three ways: on the server as configured (HNSW), on the server with ``exact`` (``EMBEDSTREAM_QDRANT__EXACT_SEARCH``)
and on the embedded store. Per mode (dense, hybrid with the default fusion): the mean overlap of the top 10
with the exact one, the share of queries whose top 10 is the same list, the worst overlap, and the search
time (median and p95 over the queries, the searcher's own ``search`` stage).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass

import numpy as np

from embedstream import logs

COLLECTION = "embedstream-exact-bench"
TOP = 10


@dataclass
class PathRow:
    """One way of searching, compared with the exact search on the server."""

    name: str
    mode: str
    overlap: float  # mean |top10 & exact top10| / 10
    identical: float  # share of queries with the same ordered top 10
    worst: float
    p50_ms: float
    p95_ms: float


@dataclass
class ExactResult:
    url: str
    version: str
    points: int
    segments: int
    indexed: int
    config: str  # the collection's HNSW and optimizer settings, as the server reports them
    queries: int
    rows: list[PathRow]
    seconds: float


def corpus_texts(limit: int) -> list[str]:
    """Up to ``limit`` distinct real texts: stdlib prose chunks, numpy prose chunks, stdlib API records."""
    from embedstream.corpus import package_paragraphs, sentence_chunks, stdlib_api_entries, stdlib_paragraphs

    texts: dict[str, None] = {}
    for paragraphs in (stdlib_paragraphs(), package_paragraphs("numpy")):
        for paragraph in paragraphs:
            for chunk in sentence_chunks(paragraph, 60):
                texts.setdefault(chunk)
    for entry in stdlib_api_entries():
        if entry.body:
            texts.setdefault(f"{entry.name}({entry.signature}): {' '.join(entry.body.split()[:80])}")
    return list(texts)[:limit]


def query_texts(queries: int) -> list[str]:
    """The labelled queries of `bench fusion`'s report sets (their vectors are cached by that bench)."""
    from embedstream.bench import hybrid_set

    out: list[str] = []
    for name in ("prose", "numpy"):
        out += [q.text for q in hybrid_set.CORPORA[name](3000, 200, 200, long=200).queries]
    return out[:queries] if queries < len(out) else out


def _fill(store, engine, collection: str, texts: list[str], dense: np.ndarray, sparse) -> None:
    from embedstream.schemas import ChunkEvent
    from embedstream.vectors import encoded_rows
    from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

    sink = QdrantSink(store, engine.spec, engine.dimensions, collection, SinkConfig(sparse="bm25"))
    rows = encoded_rows(dense, sparse)
    for at in range(0, len(rows), 256):
        sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=str(i), chunk_id=0, text=texts[i]), rows[i])
                     for i in range(at, min(at + 256, len(rows)))])


def _indexed(client, collection: str, points: int, wait_s: float) -> tuple[int, int, str]:
    """Wait until the server's optimizers are done and every point is counted; (segments, indexed vectors, the
    collection's HNSW and optimizer settings)."""
    deadline = time.monotonic() + wait_s
    while True:
        info = client.get_collection(collection)
        done = str(info.status).lower().endswith("green") and (info.points_count or 0) >= points
        if done and (info.indexed_vectors_count or 0) > 0 or time.monotonic() > deadline:
            hnsw, optimizers = info.config.hnsw_config, info.config.optimizer_config
            config = (f"HNSW m {hnsw.m}, ef_construct {hnsw.ef_construct}, full_scan_threshold "
                      f"{hnsw.full_scan_threshold} KB; indexing_threshold {optimizers.indexing_threshold} KB")
            return int(info.segments_count or 0), int(info.indexed_vectors_count or 0), config
        time.sleep(2)


def run(url: str, chunks: int = 20_000, queries: int = 1000, model: str = "all-MiniLM-L6-v2",
        threads: int | None = 1, wait_s: float = 900.0) -> ExactResult:
    from embedstream.bench.quality_bench import embed_cached
    from embedstream.config import Settings
    from embedstream.engine.engine import Engine
    from embedstream.schemas.rerank import SearchRequest
    from embedstream.vectorstore.edge_store import EdgeStore
    from embedstream.vectorstore.qdrant_client_store import QdrantClientStore
    from embedstream.workers.search import Searcher

    start = time.perf_counter()
    settings = Settings()
    settings.engine.threads = threads
    settings.sparse.kind = "bm25"
    engine = Engine.from_name(model, settings)
    texts = corpus_texts(chunks)
    dense = embed_cached(model, texts, threads)
    sparse = engine.sparse.encode_texts(texts, query=False)
    asked = query_texts(queries)
    vectors = dict(zip(asked, embed_cached(model, asked, threads, prompt="query")))
    server = QdrantClientStore.connect(url, timeout=300)
    version = str(server.client.info().version)
    server.drop(COLLECTION)
    _fill(server, engine, COLLECTION, texts, dense, sparse)
    segments, indexed, config = _indexed(server.client, COLLECTION, len(texts), wait_s)
    rows: list[PathRow] = []
    with tempfile.TemporaryDirectory(prefix="embedstream-exact-") as folder:
        edge = EdgeStore(folder)
        try:
            _fill(edge, engine, COLLECTION, texts, dense, sparse)
            paths = {
                "server, HNSW (as configured)": Searcher(server, lambda t: vectors[t], None, COLLECTION, sparse=engine.sparse),
                "server, exact": Searcher(server, lambda t: vectors[t], None, COLLECTION, sparse=engine.sparse, exact=True),
                "embedded (qdrant-edge, exact scan)": Searcher(edge, lambda t: vectors[t], None, COLLECTION,
                                                               sparse=engine.sparse),
            }
            for mode in ("dense", "hybrid"):
                found: dict[str, list[list[str]]] = {}
                times: dict[str, list[float]] = {}
                for name, searcher in paths.items():
                    for text in asked:
                        reply = searcher.search(SearchRequest(request_id="x", query=text, reply_to="-", rerank=False,
                                                              mode=mode, top_k=50, top_n=TOP))
                        if reply.error is not None:
                            raise RuntimeError(f"{name}: {reply.error.code}: {reply.error.message}")
                        found.setdefault(name, []).append([h.id for h in reply.hits])
                        times.setdefault(name, []).append(reply.timings_ms["search"])
                exact = found["server, exact"]
                for name in paths:
                    overlaps = [len(set(a) & set(b)) / max(len(b), 1) for a, b in zip(found[name], exact)]
                    rows.append(PathRow(name, mode, float(np.mean(overlaps)),
                                        float(np.mean([a == b for a, b in zip(found[name], exact)])), min(overlaps),
                                        float(np.percentile(times[name], 50)), float(np.percentile(times[name], 95))))
        finally:
            edge.close()
    server.drop(COLLECTION)
    server.close()
    return ExactResult(url, version, len(texts), segments, indexed, config, len(asked), rows,
                       time.perf_counter() - start)


def print_table(result: ExactResult, console=None) -> None:
    from rich.table import Table

    console = console or logs.console()
    table = Table(title=(f"Qdrant {result.version} at {result.url}: {result.points:,} points in {result.segments} "
                         f"segments, {result.indexed:,} vectors indexed ({result.config}); {result.queries} queries; "
                         f"top {TOP} of top_k 50 against the server's exact search"))
    for col in ("mode", "searched", "mean overlap@10", "same top 10", "worst overlap", "search p50 ms", "p95 ms"):
        table.add_column(col, justify="left" if col in ("mode", "searched") else "right")
    for row in result.rows:
        table.add_row(row.mode, row.name, f"{row.overlap:.4f}", f"{row.identical:.3f}", f"{row.worst:.1f}",
                      f"{row.p50_ms:.1f}", f"{row.p95_ms:.1f}")
    console.print(table)
    console.print(f"{result.seconds:.0f} s in all")
