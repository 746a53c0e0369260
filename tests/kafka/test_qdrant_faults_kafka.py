"""A Qdrant node failing under the embed worker is a transient fault end to end (issue #34): through a real worker
on the real broker, writes to an endpoint that answers Qdrant's cluster errors, refuses, hangs, over REST and gRPC
for longer than ``record_retry_limit_s`` back off and keep the offset; nothing is dead-lettered, no worker exits;
once the store answers again, every chunk is written, once."""

from __future__ import annotations

import time

import grpc
import pytest
from conftest import isolated_settings, make_engine, memory_store, read_dead_letters, wait_for
from failing_endpoints import ErrorEndpoint, GrpcErrorEndpoint, SilentEndpoint, endpoint_port
from kafka import KafkaAdminClient
from qdrant_client import QdrantClient
from worker_rig import Running, publish_bulk_chunks

from embedstream.producers.topics import ensure_topics
from embedstream.vectorstore.qdrant_client_store import QdrantClientStore
from embedstream.workers.embed_worker import EmbedWorker, WorkerOptions
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.runtime import build_embed_worker, sink_config_from
from embedstream.workers.sink import QdrantSink

pytestmark = pytest.mark.kafka

CHUNKS = 12
NO_ACTIVE_REPLICA = "Service internal error: The replica set for shard 0 on peer 7 has no active replica"
UNAVAILABLE = "Shard temporarily unavailable: partial snapshot recovery is in progress"


def _worker_over(settings, engine, client: QdrantClient) -> EmbedWorker:
    """A bulk embed worker writing through ``client`` (built as ``build_embed_worker`` does, less its start-up
    check of the collection, which needs the store to answer)."""
    sink = QdrantSink(QdrantClientStore(client), engine.spec, engine.dimensions, settings.qdrant.collection,
                      sink_config_from(settings))
    return EmbedWorker(settings, engine, sink, WorkerOptions.from_settings(settings, ("bulk",)), WorkerMetrics())


def _committed(settings) -> int:
    admin = KafkaAdminClient(**settings.kafka.client_kwargs())
    try:
        offsets = admin.list_group_offsets(settings.kafka.group_bulk).get(settings.kafka.group_bulk) or {}
    finally:
        admin.close()
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic == settings.kafka.topic_chunks_bulk
               and meta.offset >= 0)


def _failed_more(worker, count: int, what: str) -> None:
    """Wait until the worker's writes failed ``count`` more times (each a retry after a back-off); it still runs."""
    start = worker.metrics.sink_failures._value.get()
    wait_for(lambda: worker.metrics.sink_failures._value.get() >= start + count, 90, f"{count} failed writes: {what}")
    assert worker.failure is None


@pytest.mark.timeout(600)
def test_a_failing_qdrant_node_holds_the_offsets_and_loses_nothing(kafka_bootstrap, tiny_bert_dir):
    settings = isolated_settings(kafka_bootstrap, "qfault")
    settings.worker.sink_backoff_s = [0.05, 0.3]
    settings.worker.record_retry_limit_s = 1.0  # an unclassified failure would be dead-lettered within a second
    engine = make_engine(tiny_bert_dir, name="tiny-bert")
    ensure_topics(settings.kafka)  # the dead-letter topic too, to be read empty
    publish_bulk_chunks(settings, [f"chunk number {i} about files, sorting and threads" for i in range(CHUNKS)])

    rest = QdrantClient(url=f"http://127.0.0.1:{endpoint_port(20)}", timeout=1, check_compatibility=False)
    with Running(_worker_over(settings, engine, rest)) as w:
        with ErrorEndpoint(20, 503, UNAVAILABLE) as node:
            _failed_more(w, 3, "503, Qdrant's ShardUnavailable")
            node.answer(500, NO_ACTIVE_REPLICA)
            _failed_more(w, 3, "500, the shard has no active replica")
        _failed_more(w, 3, "the node down: connection refused")
        with SilentEndpoint(20):
            _failed_more(w, 2, "the node hung: the client's timeout")
        time.sleep(1.5)  # past record_retry_limit_s since the first failure, many times over
        assert _committed(settings) == 0 and w.failure is None

    client = QdrantClient(host="127.0.0.1", grpc_port=endpoint_port(21), prefer_grpc=True, timeout=1,
                          check_compatibility=False)
    with Running(_worker_over(settings, engine, client)) as w:
        with GrpcErrorEndpoint(21, grpc.StatusCode.UNAVAILABLE, UNAVAILABLE):
            _failed_more(w, 3, "gRPC UNAVAILABLE")
        with GrpcErrorEndpoint(21, grpc.StatusCode.INTERNAL, NO_ACTIVE_REPLICA):
            _failed_more(w, 3, "gRPC INTERNAL, no active replica")
        _failed_more(w, 2, "gRPC, the node down")
        assert _committed(settings) == 0 and w.failure is None
    assert read_dead_letters(settings, 1, timeout_s=3) == []  # no record was blamed for the cluster's fault

    store = memory_store()  # the cluster is back: the same group takes up where nothing was committed
    with Running(build_embed_worker(settings, ("bulk",), store=store, engine=engine)) as w:
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == CHUNKS, 120, "every chunk written")
        wait_for(lambda: _committed(settings) == CHUNKS, 60, "the offsets committed after the writes")
        assert w.failure is None
    sources = sorted((p.payload["source"]["partition"], p.payload["source"]["offset"]) for p in store.scroll("docs"))
    assert len(set(sources)) == CHUNKS  # each record once
    assert read_dead_letters(settings, 1, timeout_s=3) == []
