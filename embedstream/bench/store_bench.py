"""Vector store benchmark: which backend should embedstream embed by default?

    python -m embedstream.bench.store_bench --points 100000 --dim 384

For each backend, in a fresh subprocess (so RSS is that backend's alone): write
throughput (batches of 256, wait=True), search latency p50/p95 (top 10, 200
queries) plain, with a payload filter and two-stage (prefetch on a 128-d MRL
vector, rescore on the full one), recall@10 against numpy brute force, RSS.
The edge store is measured as written (exact scan) and again after
``optimize()`` (HNSW built in-process), since that is a deployment choice.

qdrant-client local mode is capped (``--memory-points``, ``--path-points``): it
is a pure-Python brute-force store; its on-disk mode rewrites storage per batch.
:func:`run` returns the rows so a CLI can reuse it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

import numpy as np

BATCH = 256
QUERIES = 200
TOP_K = 10
SMALL_DIM = 128
PREFETCH_LIMIT = 100
N_SOURCES = 10  # filter selectivity: one source = 10% of points

BACKENDS = ("edge", "memory", "client-path")

TARGETS = {"points": 100_000, "search_p95_ms": 50.0, "write_pts_s": 5_000.0}


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _dataset(n: int, dim: int, small_dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray | None]:
    """Clustered unit vectors (~50 per cluster, cos ~0.5 within, ~0 across), like real embeddings.

    i.i.d. random vectors have no meaningful neighbours beyond the query's source
    (all others tie near cos 0), which makes every ANN index look broken.
    """
    rng = np.random.default_rng(seed)
    centers = _unit(rng.standard_normal((max(1, n // 50), dim)).astype(np.float32))
    full = np.empty((n, dim), dtype=np.float32)
    for i in range(0, n, 20_000):  # chunked to keep temporaries small
        m = min(n, i + 20_000) - i
        noise = _unit(rng.standard_normal((m, dim)).astype(np.float32))
        full[i : i + m] = _unit(centers[rng.integers(0, len(centers), m)] + noise)
    small = _unit(full[:, :small_dim].copy()) if small_dim else None
    return full, small


def _queries(full: np.ndarray, nq: int, seed: int = 1) -> np.ndarray:
    """Perturbed copies of stored vectors (cos ~0.9 to their source)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(full), nq)
    noise = _unit(rng.standard_normal((nq, full.shape[1])).astype(np.float32))
    return _unit(full[idx] + 0.5 * noise).astype(np.float32)


def _rss_mb() -> float:
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover - psutil is a dependency
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _pct(samples: list[float]) -> tuple[float, float]:
    arr = np.asarray(samples) * 1000.0
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 95))


def _open(kind: str, workdir: str) -> Any:
    from embedstream.vectorstore.edge_store import EdgeStore
    from embedstream.vectorstore.qdrant_client_store import QdrantClientStore

    if kind == "edge":
        return EdgeStore(os.path.join(workdir, "edge"))
    if kind == "memory":
        return QdrantClientStore.in_memory()
    if kind == "client-path":
        return QdrantClientStore.local_path(os.path.join(workdir, "client-path"))
    raise ValueError(f"unknown backend {kind!r}; choose from {BACKENDS}")


def _measure_search(store: Any, full: np.ndarray, small: np.ndarray | None, qs: np.ndarray, truth: list[list[int]], ids: list[str]) -> dict[str, Any]:
    from embedstream.vectorstore import Prefetch

    out: dict[str, Any] = {}
    lat, hits_all = [], []
    for q in qs:
        t0 = time.perf_counter()
        hits = store.search("bench", "full", q, TOP_K)
        lat.append(time.perf_counter() - t0)
        hits_all.append(hits)
    out["search_p50_ms"], out["search_p95_ms"] = _pct(lat)
    pos = {pid: i for i, pid in enumerate(ids)}
    recall = [len({pos[h.id] for h in hits} & set(t)) / TOP_K for hits, t in zip(hits_all, truth)]
    out["recall_at_10"] = float(np.mean(recall))

    lat = []
    for j, q in enumerate(qs):
        flt = {"source": f"src-{j % N_SOURCES}"}
        t0 = time.perf_counter()
        store.search("bench", "full", q, TOP_K, filter=flt)
        lat.append(time.perf_counter() - t0)
    out["filtered_p50_ms"], out["filtered_p95_ms"] = _pct(lat)

    if small is not None:
        lat = []
        qsmall = _unit(qs[:, : small.shape[1]].copy())
        for q, qsm in zip(qs, qsmall):
            t0 = time.perf_counter()
            store.search("bench", "full", q, TOP_K, prefetch=[Prefetch("mrl_small", qsm, PREFETCH_LIMIT)])
            lat.append(time.perf_counter() - t0)
        out["prefetch_p50_ms"], out["prefetch_p95_ms"] = _pct(lat)
    return out


def _run_backend(kind: str, n: int, dim: int, small_dim: int, queries: int, optimize: bool, workdir: str) -> list[dict[str, Any]]:
    """Runs in its own process: build data, write, search, report."""
    from embedstream.vectorstore import Point, VectorSpec

    full, small = _dataset(n, dim, small_dim)
    qs = _queries(full, queries)
    truth = [list(np.argpartition(-(full @ q), TOP_K)[:TOP_K]) for q in qs]
    ids = [str(uuid.UUID(int=(0xE5 << 120) | i)) for i in range(n)]
    text = "lorem ipsum dolor sit amet " * 10  # ~270 chars of chunk text, like a real payload

    rss0 = _rss_mb()
    store = _open(kind, workdir)
    specs = {"full": VectorSpec(dim)}
    if small is not None:
        specs["mrl_small"] = VectorSpec(small_dim)
    store.ensure_collection("bench", specs, payload_indexes=("doc_id", "source"))

    t0 = time.perf_counter()
    for i in range(0, n, BATCH):
        batch = []
        for j in range(i, min(n, i + BATCH)):
            vecs = {"full": full[j]}
            if small is not None:
                vecs["mrl_small"] = small[j]
            payload = {"doc_id": f"doc-{j // 8}", "chunk": j % 8, "source": f"src-{j % N_SOURCES}", "text": text}
            batch.append(Point(ids[j], vecs, payload))
        store.upsert("bench", batch, wait=True)
    write_s = time.perf_counter() - t0
    count = store.count("bench")
    if count != n:
        raise AssertionError(f"{kind}: count {count} != {n}")

    base = {"backend": kind, "points": n, "dim": dim, "write_pts_s": n / write_s}
    row = dict(base, **_measure_search(store, full, small, qs, truth, ids))
    row["rss_mb"] = _rss_mb() - rss0
    rows = [row]

    if optimize and kind == "edge":
        t0 = time.perf_counter()
        store.optimize("bench")
        opt_s = time.perf_counter() - t0
        row2 = dict(base, backend="edge+optimize", **_measure_search(store, full, small, qs, truth, ids))
        row2["optimize_s"] = opt_s
        row2["rss_mb"] = _rss_mb() - rss0
        rows.append(row2)

    store.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    for r in rows:
        r["peak_rss_mb"] = peak
    return rows


def run(
    points: int = 100_000,
    dim: int = 384,
    *,
    backends: tuple[str, ...] = BACKENDS,
    memory_points: int = 20_000,
    path_points: int = 2_000,
    small_dim: int = SMALL_DIM,
    queries: int = QUERIES,
    optimize: bool = True,
    workdir: str | None = None,
) -> list[dict[str, Any]]:
    """Benchmark each backend in a fresh process; returns one dict per measured configuration."""
    caps = {"edge": points, "memory": min(points, memory_points), "client-path": min(points, path_points)}
    small_dim = small_dim if 0 < small_dim < dim else 0
    rows: list[dict[str, Any]] = []
    root = tempfile.mkdtemp(prefix="store-bench-", dir=workdir)
    ctx = mp.get_context("spawn")
    try:
        for kind in backends:
            wd = os.path.join(root, kind)
            os.makedirs(wd, exist_ok=True)
            with cf.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as ex:
                fut = ex.submit(_run_backend, kind, caps[kind], dim, small_dim, queries, optimize, wd)
                rows.extend(fut.result())
            shutil.rmtree(wd, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    cols = [
        ("backend", "backend", "{}"),
        ("points", "points", "{:,}"),
        ("write pts/s", "write_pts_s", "{:,.0f}"),
        ("search p50/p95 ms", ("search_p50_ms", "search_p95_ms"), "{:.1f}/{:.1f}"),
        ("filtered p50/p95", ("filtered_p50_ms", "filtered_p95_ms"), "{:.1f}/{:.1f}"),
        ("prefetch p50/p95", ("prefetch_p50_ms", "prefetch_p95_ms"), "{:.1f}/{:.1f}"),
        ("recall@10", "recall_at_10", "{:.3f}"),
        ("RSS MB", "rss_mb", "{:,.0f}"),
        ("peak MB", "peak_rss_mb", "{:,.0f}"),
        ("optimize s", "optimize_s", "{:.0f}"),
    ]
    table = [[c[0] for c in cols]]
    for r in rows:
        line = []
        for _, key, fmt in cols:
            if isinstance(key, tuple):
                vals = [r.get(k) for k in key]
                line.append(fmt.format(*vals) if all(v is not None for v in vals) else "-")
            else:
                v = r.get(key)
                line.append(fmt.format(v) if v is not None else "-")
        table.append(line)
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    out = []
    for k, row in enumerate(table):
        out.append("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def check_targets(rows: list[dict[str, Any]]) -> list[str]:
    """Verdict for the embedded default (edge as written, i.e. without waiting for optimize)."""
    lines = []
    for r in rows:
        if r["backend"] not in ("edge", "edge+optimize"):
            continue
        ok_n = r["points"] >= TARGETS["points"]
        ok_s = r["search_p95_ms"] < TARGETS["search_p95_ms"]
        ok_w = r["write_pts_s"] >= TARGETS["write_pts_s"]
        lines.append(
            f"{r['backend']}: points {r['points']:,} {'OK' if ok_n else 'BELOW'} (>= {TARGETS['points']:,}); "
            f"search p95 {r['search_p95_ms']:.1f} ms {'OK' if ok_s else 'MISS'} (< {TARGETS['search_p95_ms']:.0f}); "
            f"writes {r['write_pts_s']:,.0f}/s {'OK' if ok_w else 'MISS'} (>= {TARGETS['write_pts_s']:,.0f})"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m embedstream.bench.store_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma list of {BACKENDS}")
    ap.add_argument("--memory-points", type=int, default=20_000)
    ap.add_argument("--path-points", type=int, default=2_000)
    ap.add_argument("--small-dim", type=int, default=SMALL_DIM, help="MRL prefetch vector size (0: none)")
    ap.add_argument("--queries", type=int, default=QUERIES)
    ap.add_argument("--no-optimize", action="store_true", help="skip the edge optimize() row (minutes at 100k)")
    ap.add_argument("--workdir", default=None, help="where temp stores go (default: system temp)")
    args = ap.parse_args(argv)

    backends = tuple(b.strip() for b in args.backends.split(",") if b.strip())
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}")
    small = args.small_dim if 0 < args.small_dim < args.dim else 0
    print(
        f"store bench: {args.points:,} x {args.dim}-d" + (f" (+{small}-d prefetch vector)" if small else "")
        + f", batch {BATCH}, "
        f"{args.queries} queries top-{TOP_K}, cpus={os.cpu_count()}",
        flush=True,
    )
    t0 = time.perf_counter()
    rows = run(
        args.points,
        args.dim,
        backends=backends,
        memory_points=args.memory_points,
        path_points=args.path_points,
        small_dim=args.small_dim,
        queries=args.queries,
        optimize=not args.no_optimize,
        workdir=args.workdir,
    )
    print(format_table(rows))
    for line in check_targets(rows):
        print(line)
    print(f"total {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
