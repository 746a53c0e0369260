"""The gateway test stack: a gateway, an online embed worker (MiniLM) and a rerank worker (tiny cross-encoder,
search over a tiny-bert index), all on the test broker; and the gateway ports of this test run."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading

import numpy as np
import ports
from conftest import isolated_settings, make_engine, memory_store
from worker_rig import RunningWorker

from embedstream.config import ModelConfig
from embedstream.corpus import stdlib_paragraphs
from embedstream.engine.engine import EmbedRequest
from embedstream.gateway import GatewayOptions
from embedstream.gateway.server import BackgroundGateway
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.vectorstore.factory import open_store
from embedstream.workers.rerank_worker import RerankOptions, RerankWorker
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.search import Searcher
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig
from embedstream.workers.vector_search import VectorSearchWorker

MODEL = "all-MiniLM-L6-v2"
# Gateways of a test run listen 600..699 above its broker (+100 PostgreSQL, +200 Connect, +300 hybrid CLI,
# +400 quick starts, +500 command cleanup), so parallel runs on one host each keep to their own range.
_BASE = ports.port(ports.GATEWAYS)
_next = itertools.count()


def gateway_port() -> int:
    """A free port of this run's gateway range (each call another one)."""
    for _ in range(100):
        port = _BASE + next(_next) % 100
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_BASE}..{_BASE + 99}")


def background_gateway(settings, options: GatewayOptions) -> BackgroundGateway:
    return BackgroundGateway(settings, options, port=gateway_port())


@contextlib.contextmanager
def in_thread(worker):
    """Any worker loop (here the rerank worker) running in a daemon thread for the test's duration."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)


@contextlib.contextmanager
def gateway_stack(kafka_bootstrap, minilm_engine, ce_engine, tiny_ce_dir, tiny_bert_dir, name: str, **options):
    """Gateway + online embed worker (MiniLM) + rerank worker (tiny cross-encoder, search over a tiny-bert index).

    Yields the running ``BackgroundGateway``; ``options`` override the gateway's."""
    settings = isolated_settings(kafka_bootstrap, name)
    settings.models["tiny-ce"] = ModelConfig(path=str(tiny_ce_dir), kind="rerank")
    ensure_topics(settings.kafka, partitions=2)
    embedder = make_engine(tiny_bert_dir, name="tiny-bert")
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, embedder.spec, embedder.dimensions, "docs", SinkConfig())
    texts = [" ".join(p.split()[:40]) for p in stdlib_paragraphs()[300:320]]
    vectors = np.random.default_rng(0).standard_normal((20, embedder.dimensions)).astype(np.float32)
    sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=t, metadata={"half": i % 2}),
                               v / np.linalg.norm(v)) for i, (t, v) in enumerate(zip(texts, vectors))])
    rerank_worker = RerankWorker(settings, ce_engine, RerankOptions(default_collection="docs"),
                                 searcher=Searcher(store, embedder, ce_engine, "docs"))
    gateway_options = GatewayOptions(**{"model": MODEL, "rerank_model": "tiny-ce", "max_inputs": 2048,
                                        "max_body_bytes": 4_000_000, **options})
    # the search lane of the deployment that owns "docs": it hands searches asking for a rerank to the rerank worker
    owner = VectorSearchWorker(settings, store, MODEL, WorkerMetrics())
    with RunningWorker(settings, minilm_engine, memory_store(), lanes=("online",)), in_thread(rerank_worker), \
            in_thread(owner), background_gateway(settings, gateway_options) as gateway:
        yield gateway


def engine_vectors(engine, texts, prompt=None, **ask):
    """The engine's own vectors (and token counts) for ``texts``: what every route must hand back."""
    results, _ = engine.embed([EmbedRequest(i, t, prompt=prompt, **ask) for i, t in enumerate(texts)])
    return np.stack([r.vector.values for r in results]), [r.tokens for r in results]


def cos(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
