"""Assemble a worker from settings: engine, vector store, sink, Kafka loop, health endpoints."""

from __future__ import annotations

from embedstream.config import Settings
from embedstream.engine.engine import Engine
from embedstream.vectorstore.factory import open_store
from embedstream.workers.embed_worker import EmbedWorker, WorkerOptions
from embedstream.workers.kafka_io import broker_reachable
from embedstream.workers.kafka_io import run_until_signalled as run_until_signalled_generic
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.sink import QdrantSink, SinkConfig


def open_settings_store(settings: Settings):
    q = settings.qdrant
    return open_store(q.url, q.api_key.get_secret_value() if q.api_key else None, q.path)


def sink_config_from(settings: Settings) -> SinkConfig:
    q = settings.qdrant
    return SinkConfig(q.vector_datatype, q.quantization, tuple(q.matryoshka_dims), versioned=q.versioned_collections)


def build_embed_worker(settings: Settings, lanes: tuple[str, ...], model: str | None = None, store=None,
                       options: WorkerOptions | None = None, engine: Engine | None = None) -> EmbedWorker:
    engine = engine or Engine.from_name(model or settings.default_model, settings)
    store = store if store is not None else open_settings_store(settings)
    sink_config = sink_config_from(settings)
    sink = QdrantSink(store, engine.spec, engine.dimensions, settings.qdrant.collection, sink_config)
    options = options or WorkerOptions(lanes=lanes, online_window_ms=settings.kafka.online_batch_window_ms)
    return EmbedWorker(settings, engine, sink, options, WorkerMetrics(model=engine.spec.name))


def run_until_signalled(worker: EmbedWorker, metrics_port: int | None) -> None:
    """Serve health/metrics, stop cleanly on SIGTERM/SIGINT (final commit of finished work)."""
    consumers = list(worker.consumers.values())
    checks = {
        "broker": lambda: all(broker_reachable(c) for c in consumers),
        "qdrant": lambda: worker.sink.store.list_collections() is not None,
    }
    run_until_signalled_generic(worker, metrics_port, checks, "embed worker")
