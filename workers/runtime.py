"""Assemble workers from settings: engine, vector store, sink, options; ``run_until_signalled`` runs any of them."""

from __future__ import annotations

from typing import Any

from embedstream import logs
from embedstream.config import Settings
from embedstream.engine.engine import Engine
from embedstream.engine.tuning import shape_for_lanes
from embedstream.vectorstore.factory import open_store
from embedstream.workers.embed_worker import EmbedWorker, WorkerOptions
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.rerank_worker import RerankOptions, RerankWorker
from embedstream.workers.search import Searcher
from embedstream.workers.serve import run_until_signalled
from embedstream.workers.sink import QdrantSink, SinkConfig

__all__ = ["build_embed_worker", "build_rerank_worker", "open_settings_store", "run_until_signalled", "sink_config_from"]

log = logs.get("embedstream.worker")


def open_settings_store(settings: Settings):
    """The configured store; collections it creates get the cluster options (shards, replicas, write consistency)."""
    q = settings.qdrant
    store = open_store(q.url, q.api_key.get_secret_value() if q.api_key else None, q.path)
    if hasattr(store, "collection_options"):  # a Qdrant server or cluster (the embedded store has no shards)
        store.collection_options = q.cluster_options()
    return store


def sink_config_from(settings: Settings) -> SinkConfig:
    q = settings.qdrant
    return SinkConfig(q.vector_datatype, q.quantization, tuple(q.matryoshka_dims), versioned=q.versioned_collections,
                      sparse=None if settings.sparse.kind == "none" else settings.sparse.kind)


def build_embed_worker(settings: Settings, lanes: tuple[str, ...], model: str | None = None, store=None,
                       options: WorkerOptions | None = None, engine: Engine | None = None) -> EmbedWorker:
    """An embed worker on ``lanes``; its knobs come from ``settings.worker`` unless ``options`` are given."""
    engine = engine or Engine.from_name(model or settings.default_model, settings, shape=shape_for_lanes(lanes))
    store = store if store is not None else open_settings_store(settings)
    sink = QdrantSink(store, engine.spec, engine.dimensions, settings.qdrant.collection, sink_config_from(settings),
                      identity=engine.identity)
    sink.check_existing(settings.qdrant.collection)  # a collection without the sparse vector: refused now
    if engine.sparse is not None:
        log.info("sparse vectors written beside the dense ones", encoder=engine.sparse.describe())
    options = options or WorkerOptions.from_settings(settings, lanes)
    return EmbedWorker(settings, engine, sink, options, WorkerMetrics(model=engine.spec.name))


def build_rerank_worker(settings: Settings, model: str, embed_model: str | None = None, store=None,
                        options: RerankOptions | None = None, engine: Engine | None = None,
                        search: bool = True, remote_embed: bool = False) -> RerankWorker:
    """Cross-encoder engine + (optionally) a Searcher over the configured store and query embedder.

    ``remote_embed``: query vectors come from the embed workers over Kafka instead of an in-process
    embedder (the stages run apart).
    """
    engine = engine or Engine.from_name(model, settings)
    searcher = None
    owned: list = []  # what is opened here closes with the worker; a store given belongs to the caller
    if search:
        if store is None:
            store = open_settings_store(settings)
            owned.append(store.close)
        if remote_embed:
            from embedstream.producers.query_client import QueryClient
            from embedstream.workers.search import kafka_embedder

            client = QueryClient(settings.kafka)
            owned.append(client.close)
            embedder: Any = kafka_embedder(client, embed_model)
        else:
            embedder = Engine.from_name(embed_model or settings.default_model, settings)
        searcher = Searcher(store, embedder, engine, settings.qdrant.collection,
                            dense_scale=settings.sparse.dense_scale, exact=settings.qdrant.exact_search)
    options = options or RerankOptions.from_settings(settings)
    return RerankWorker(settings, engine, options, WorkerMetrics(model=engine.spec.name), searcher,
                        owned=tuple(owned))
