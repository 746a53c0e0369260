"""`embedstream bench lookup`: what the unchanged-chunk lookup costs as a document grows, and what the
embedding identity costs at start.

**Lookups.** One document of ``--chunks`` chunks is sent in batches of ``--batch`` chunks, twice: first
whole (every chunk new: the lookup misses all of them), then again with a paragraph inserted at its start
(every chunk moved one place on: each borrows the vectors of the point that held its text). For each
batch, in turns on the same store and the same state:

* the lookup as the worker runs it (``StoredChunks.lookup``: the batch's own points by id, then the
  points of the document that hold the missed texts, found by a filter on doc_id + content_hash +
  identity), its time and the points it read;
* the read the lookup made before (every point of the document, with its vectors), its time and the
  points it read.

Vectors are random unit vectors (no model runs: the lookup's cost is the store's). Each batch's two reads
are timed five times in turns (median), in CPU time of the process (the embedded store computes in it; on
a shared host wall time mostly measures the neighbours). The table shows batches spread over the document and the ratio of
the last five batches' median time to the first five's.

**Identity.** The weights' content hash of each model folder (sha256 of config, weight and tokenizer
files), first in the process and again (cached by size, dates and inode), and sha256's rate on this host.

    embedstream bench lookup [--chunks 2000] [--batch 56] [--url http://127.0.0.1:6333]
"""

from __future__ import annotations

import hashlib
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embedstream.engine.identity import EmbeddingIdentity, _file_digests, folder_digest
from embedstream.engine.model_spec import resolve_model
from embedstream.schemas import ChunkEvent
from embedstream.vectorstore.factory import open_store
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, ReusedChunk, SinkConfig
from embedstream.workers.unchanged import StoredChunks

DIM = 384
REPEATS = 5  # each batch's reads are timed this often (median)


class _Counting:
    """The real store, counting the points its reads return."""

    def __init__(self, store):
        self.store = store
        self.points = 0

    def get_payloads(self, *args, **kwargs):
        found = self.store.get_payloads(*args, **kwargs)
        self.points += len(found)
        return found

    def scroll(self, *args, **kwargs):
        found = self.store.scroll(*args, **kwargs)
        self.points += len(found)
        return found

    def __getattr__(self, name):
        return getattr(self.store, name)


@dataclass
class Row:
    send: str  # "first" | "shifted"
    batch: int
    stored: int  # points of the document in the store before the batch
    lookup_points: int
    lookup_ms: float
    whole_points: int
    whole_ms: float


def run_lookups(chunks: int = 2000, batch: int = 56, url: str | None = None) -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="embedstream-lookup-bench-"))
    store = _Counting(open_store(url, None, root / "edge"))
    collection = f"lookup-bench-{uuid.uuid4().hex[:8]}"
    spec = resolve_model("all-MiniLM-L6-v2", {"all-MiniLM-L6-v2": _registry_entry()})
    sink = QdrantSink(store, spec, DIM, collection, SinkConfig(), identity=EmbeddingIdentity({"bench": "lookup"}))
    lookup = StoredChunks(sink).lookup
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((chunks + 1, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    texts = [f"Paragraph {i} of the long guide: how the stream of records reaches the index." for i in range(chunks)]
    rows: list[Row] = []
    try:
        sink.ensure(collection)
        lookup([ChunkEvent(doc_id="warm-up", chunk_id=0, text="warm-up")])
        for send, doc_texts in (("first", texts), ("shifted", ["A new first paragraph of the guide.", *texts])):
            for number, first in enumerate(range(0, len(doc_texts), batch), 1):
                events = [ChunkEvent(doc_id="long", chunk_id=i, text=doc_texts[i])
                          for i in range(first, min(first + batch, len(doc_texts)))]
                stored = store.store.count(collection)
                looked, whole = [], []
                for _ in range(REPEATS):  # in turns; both only read
                    store.points, started = 0, time.process_time()
                    found = lookup(events)
                    looked.append(((time.process_time() - started) * 1000, store.points))
                    store.points, started = 0, time.process_time()
                    store.scroll(collection, "doc_id", "long", with_vectors=True)  # the read before: the whole document
                    whole.append(((time.process_time() - started) * 1000, store.points))
                rows.append(Row(send, number, stored, looked[0][1], statistics.median(ms for ms, _ in looked),
                                whole[0][1], statistics.median(ms for ms, _ in whole)))
                sink.upsert([ReusedChunk(e, r, {}) if r is not None and r.kind == "vectors"
                             else EmbeddedChunk(e, vectors[e.chunk_id % len(vectors)], {}) for e, r in zip(events, found)])
    finally:
        try:
            store.store.drop(collection)
        finally:
            store.store.close()
            shutil.rmtree(root, ignore_errors=True)
    return rows


def _registry_entry():
    from embedstream.config import default_registry

    return default_registry()["all-MiniLM-L6-v2"]


def identity_costs() -> list[tuple[str, float, float, float]]:
    """(what, MB, first hash s, again s) per model folder, and sha256 over 512 MB of page cache."""
    from embedstream.config import default_registry
    from embedstream.engine.model_spec import resolve_path

    out = []
    registry = default_registry()
    for name in ("all-MiniLM-L6-v2", "splade-tiny"):
        if name not in registry:
            continue
        folder = resolve_path(registry[name].path)
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6
        _file_digests.clear()
        started = time.perf_counter()
        folder_digest(folder)
        first = time.perf_counter() - started
        started = time.perf_counter()
        folder_digest(folder)
        out.append((name, size, first, time.perf_counter() - started))
    block = np.random.default_rng(1).integers(0, 255, 1 << 20, dtype=np.uint8).tobytes()
    digest, started = hashlib.sha256(), time.perf_counter()
    for _ in range(512):
        digest.update(block)
    out.append(("sha256 of 512 MB in memory", 512.0, time.perf_counter() - started, 0.0))
    return out


def print_tables(rows: list[Row], costs: list[tuple[str, float, float, float]], batch: int) -> None:
    print(f"\nUnchanged-chunk lookup of one document, batches of {batch} chunks (CPU ms of one call, median of "
          f"{REPEATS})\n")
    print("| send | batch | document's points stored | lookup: points read | lookup ms | whole-document read "
          "(before): points | whole-document ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for send in ("first", "shifted"):
        mine = [r for r in rows if r.send == send]
        picks = sorted({0, len(mine) // 4, len(mine) // 2, 3 * len(mine) // 4, len(mine) - 1})
        for r in (mine[i] for i in picks):
            print(f"| {r.send} | {r.batch} | {r.stored:,} | {r.lookup_points} | {r.lookup_ms:.1f} | {r.whole_points:,} "
                  f"| {r.whole_ms:.1f} |")
    print("\n| send | lookup ms, median of the first 5 / last 5 batches | ratio | whole-document read ms, first 5 / last 5 "
          "| ratio | most points read by one lookup |")
    print("|---|---|---:|---|---:|---:|")
    for send in ("first", "shifted"):
        mine = [r for r in rows if r.send == send]
        head = [r for r in mine[:5]]
        tail = [r for r in mine[-5:]]
        look = (statistics.median(r.lookup_ms for r in head), statistics.median(r.lookup_ms for r in tail))
        whole = (statistics.median(r.whole_ms for r in head), statistics.median(r.whole_ms for r in tail))
        print(f"| {send} | {look[0]:.1f} / {look[1]:.1f} | {look[1] / max(look[0], 1e-9):.2f} | "
              f"{whole[0]:.1f} / {whole[1]:.1f} | {whole[1] / max(whole[0], 1e-9):.1f} | "
              f"{max(r.lookup_points for r in mine)} |")
    print("\nEmbedding identity: the weights' content hash at start\n")
    print("| what | MB | first hash s | again (cached) s | MB/s |")
    print("|---|---:|---:|---:|---:|")
    for what, size, first, again in costs:
        print(f"| {what} | {size:,.0f} | {first:.3f} | {again:.4f} | {size / max(first, 1e-9):,.0f} |")


def main(chunks: int = 2000, batch: int = 56, url: str | None = None) -> None:
    rows = run_lookups(chunks, batch, url)
    print_tables(rows, identity_costs(), batch)
