"""Same index, same queries -> the same top-k: in two worker processes (real ones, one after the other on
the same qdrant-edge directory), and on qdrant-edge and qdrant-client's local engine (another engine, as
a server is), for every fusion and for dense search. Before the fusion left the store, RRF's ties came
back in a different order in every process (qdrant-edge fuses through a randomly seeded hash map)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedstream.bench import hybrid_set
from embedstream.engine.identity import EmbeddingIdentity
from embedstream.engine.sparse import BM25Encoder
from embedstream.ranking import FUSIONS
from embedstream.schemas import ChunkEvent
from embedstream.vectors import encoded_rows
from embedstream.vectorstore.edge_store import EdgeStore
from embedstream.vectorstore.qdrant_client_store import QdrantClientStore
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

DIM = 32
TOP_K = 10
MODES = [("dense", None)] + [("hybrid", name) for name in FUSIONS]

# One worker process: open the index, answer every query in every mode, print the top-k ids as JSON.
_WORKER = """
import json, sys
import numpy as np
from embedstream.engine.sparse import BM25Encoder
from embedstream.schemas.rerank import SearchRequest
from embedstream.vectorstore.edge_store import EdgeStore
from embedstream.workers.search import Searcher

folder, queries_file = sys.argv[1], sys.argv[2]
job = json.loads(open(queries_file).read())
vectors = {q: np.asarray(v, dtype=np.float32) for q, v in zip(job["queries"], job["vectors"])}
store = EdgeStore(folder)
searcher = Searcher(store, lambda text: vectors[text], None, "docs", sparse=BM25Encoder())
out = {}
for mode, fusion in job["modes"]:
    extra = {} if fusion is None else {"fusion": fusion}
    out[f"{mode}/{fusion}"] = [
        [h.id for h in searcher.search(SearchRequest(request_id="r", query=q, reply_to="t", rerank=False, mode=mode,
                                                     top_k=job["top_k"], top_n=job["top_k"], **extra)).hits]
        for q in job["queries"]]
store.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def labelled():
    return hybrid_set.build(chunks=300, known_items=30, exact=30, seed=5)


@pytest.fixture(scope="module")
def vectors(labelled):
    """Synthetic unit vectors (a random tiny model maps every text to nearly one vector: cosines would all
    tie at 6 places): a known-item query is its answer's vector plus noise, an exact-term query is noise."""
    rng = np.random.default_rng(11)
    docs = rng.standard_normal((len(labelled.chunks), DIM)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = []
    for query in labelled.queries:
        noise = rng.standard_normal(DIM).astype(np.float32)
        q = docs[query.answer] + 1.5 * noise / np.linalg.norm(noise) if query.kind == "known_item" else noise
        queries.append(q / np.linalg.norm(q))
    return docs, np.stack(queries)


def _fill(store, labelled, docs) -> None:
    sink = QdrantSink(store, _Spec(), DIM, "docs", SinkConfig(sparse="bm25"),
                      identity=EmbeddingIdentity({"model": "synthetic"}))
    rows = encoded_rows(docs, BM25Encoder().encode_texts(labelled.chunks, query=False))
    sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=f"c{i}", chunk_id=0, text=text), rows[i])
                 for i, text in enumerate(labelled.chunks)])


class _Spec:
    """The sink's view of the model that wrote the vectors (a name; no Matryoshka sizes; its identity given apart)."""

    name = "synthetic"
    matryoshka_dims: tuple[int, ...] = ()


def _run_worker(folder: Path, job: Path) -> dict:
    result = subprocess.run([sys.executable, "-c", _WORKER, str(folder), str(job)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_two_worker_processes_rank_the_same_index_identically(tmp_path, labelled, vectors):
    docs, queries = vectors
    store = EdgeStore(tmp_path / "index")
    _fill(store, labelled, docs)
    store.close()
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"queries": [q.text for q in labelled.queries], "vectors": queries.tolist(),
                               "modes": MODES, "top_k": TOP_K}))
    first = _run_worker(tmp_path / "index", job)
    second = _run_worker(tmp_path / "index", job)
    assert set(first) == {f"{mode}/{fusion}" for mode, fusion in MODES}
    for key, rankings in first.items():
        assert all(len(ids) == TOP_K for ids in rankings), key
        changed = [q.text for q, a, b in zip(labelled.queries, rankings, second[key]) if a != b]
        assert not changed, f"{key}: {len(changed)} of {len(rankings)} queries ranked differently: {changed[:5]}"


def test_qdrant_edge_and_another_engine_rank_the_same_index_identically(tmp_path, labelled, vectors):
    from embedstream.schemas.rerank import SearchRequest
    from embedstream.workers.search import Searcher

    docs, queries = vectors
    by_text = {q.text: v for q, v in zip(labelled.queries, queries)}
    rankings = []
    for store in (EdgeStore(tmp_path / "edge"), QdrantClientStore.in_memory()):
        _fill(store, labelled, docs)
        searcher = Searcher(store, lambda text: by_text[text], None, "docs", sparse=BM25Encoder())
        rankings.append({
            f"{mode}/{fusion}": [[h.id for h in searcher.search(SearchRequest(
                request_id="r", query=q.text, reply_to="t", rerank=False, mode=mode, top_k=TOP_K, top_n=TOP_K,
                **({} if fusion is None else {"fusion": fusion}))).hits] for q in labelled.queries]
            for mode, fusion in MODES})
        store.close()
    edge, other = rankings
    for key in edge:
        changed = sum(a != b for a, b in zip(edge[key], other[key]))
        assert changed == 0, f"{key}: {changed} of {len(edge[key])} queries ranked differently"
