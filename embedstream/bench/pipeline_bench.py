"""`embedstream bench pipeline`: Kafka -> worker -> Qdrant throughput and query round trips.

In one run on the local broker:
1. the engine alone on the chunk texts (tokens/s baseline, same batching as the worker),
2. bulk chunks/s end to end (publish a backlog, time until every point is in the store) and its
   ratio to (1),
3. query round-trip p50/p95 with the workers idle, and while a second, fresh bulk backlog drains
   (the throughput phase runs without queries, so neither measurement disturbs the other).
Workers run as separate processes per lane (the seeds' "separate deployments"): the bulk worker
with one torch thread at a lower CPU priority (``worker embed --nice 10``), the online worker with
two threads, so bulk work cannot hold the cores a live query needs. Measured here (p95 under
backlog): nice 0 / 1 online thread 35-41 ms; nice 10 / 1 thread 28-31 ms; nice 10 / 2 threads 24 ms.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np

from embedstream import logs
from embedstream import devkafka
from embedstream.bench.corpus import documents
from embedstream.config import Settings
from embedstream.engine.engine import EmbedRequest, Engine
from embedstream.gcfreeze import freeze_startup_objects
from producers.chunker import Chunker
from producers.publisher import ChunkPublisher, ensure_topics
from producers.query_client import QueryClient


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _env(settings: Settings, prefix: str, store_url: str | None, collection: str, threads: int) -> dict:
    env = dict(os.environ)
    k = settings.kafka
    env.update({
        "EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "EMBEDSTREAM_KAFKA__TOPIC_CHUNKS_ONLINE": k.topic_chunks_online,
        "EMBEDSTREAM_KAFKA__TOPIC_CHUNKS_BULK": k.topic_chunks_bulk,
        "EMBEDSTREAM_KAFKA__TOPIC_QUERIES": k.topic_queries,
        "EMBEDSTREAM_KAFKA__TOPIC_DEAD_LETTERS": k.topic_dead_letters,
        "EMBEDSTREAM_KAFKA__GROUP_ONLINE": f"{prefix}-online",
        "EMBEDSTREAM_KAFKA__GROUP_BULK": f"{prefix}-bulk",
        "EMBEDSTREAM_QDRANT__COLLECTION": collection,
        "EMBEDSTREAM_ENGINE__THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    })
    if store_url:
        env["EMBEDSTREAM_QDRANT__PATH"] = store_url
        env["EMBEDSTREAM_QDRANT_PATH"] = store_url
    return env


def _worker(lanes: str, env: dict, log_dir: str, nice: int = 0) -> subprocess.Popen:
    """A worker process; ``nice`` lowers a bulk deployment's CPU priority below the online one."""
    log = open(os.path.join(log_dir, f"worker-{lanes}.log"), "wb")  # a file, not a pipe: never blocks the worker
    return subprocess.Popen([sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", lanes,
                             "--metrics-port", "0", "--nice", str(nice)], env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_ready(log_dir: str, lanes: list[str], timeout_s: float = 300) -> None:
    """Workers load torch and the model first (tens of seconds on a busy 2-core box)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        texts = [open(os.path.join(log_dir, f"worker-{lane}.log"), errors="replace").read() for lane in lanes]
        if all("partitions assigned" in t for t in texts):
            return
        if any("Traceback" in t for t in texts):
            raise RuntimeError(f"a worker failed to start; see {log_dir}")
        time.sleep(0.5)
    raise RuntimeError(f"workers not ready after {timeout_s}s; see {log_dir}")


def _round_trips(client: QueryClient, texts: list[str], count: int) -> list[float]:
    times = []
    for i in range(count):
        start = time.perf_counter()
        reply = client.embed(texts[i % len(texts)], timeout_s=30)
        times.append((time.perf_counter() - start) * 1000)
        if reply.error:
            raise RuntimeError(f"query failed: {reply.error.message}")
    return times


def _lag(k, group: str) -> int:
    """Records on the bulk topic the group has not committed yet (chunks, and trims that follow them)."""
    from kafka import KafkaConsumer, TopicPartition

    probe = KafkaConsumer(**k.client_kwargs(), group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(k.topic_chunks_bulk, p) for p in probe.partitions_for_topic(k.topic_chunks_bulk)]
        ends = probe.end_offsets(parts)
        return sum(ends[tp] - (probe.committed(tp) or 0) for tp in parts)
    finally:
        probe.close()


def _wait_committed(k, group: str, timeout_s: float = 1800) -> None:
    end = time.monotonic() + timeout_s
    while _lag(k, group) > 0:
        if time.monotonic() > end:
            raise RuntimeError(f"bulk backlog not drained after {timeout_s:g} s")
        time.sleep(0.2)


def run(docs: int = 300, queries: int = 200, port: int = 9092, online_threads: int = 2, bulk_nice: int = 10,
        warmup: int = 150) -> dict:
    info = devkafka.start(port=port)
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    settings = Settings()
    k = settings.kafka
    k.bootstrap_servers = info.bootstrap
    k.topic_chunks_online, k.topic_chunks_bulk = f"{prefix}.chunks.online", f"{prefix}.chunks.bulk"
    k.topic_queries, k.topic_replies, k.topic_dead_letters = f"{prefix}.queries", f"{prefix}.replies", f"{prefix}.dlq"
    ensure_topics(k, partitions=4)
    engine = Engine.from_name(settings.default_model, settings)
    chunker = Chunker.for_model(engine.spec, chunk_tokens=200, overlap_tokens=24)
    corpus = documents(docs, seed=21)
    texts = [t for d in corpus for t in chunker.chunk(d["text"])]
    queries_text = [" ".join(t.split()[:12]) for t in texts[:50]]  # query-sized: ~12 words, 15-25 tokens
    out: dict = {"chunks": len(texts), "real_tokens": 0, "online_threads": online_threads, "bulk_nice": bulk_nice}

    # 1. engine alone, one thread (as each worker process runs)
    import torch

    torch.set_num_threads(1)
    requests = [EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)]
    engine.embed(requests[:64])
    start = time.perf_counter()
    _, timings = engine.embed(requests, sort_by_length=False)
    out["engine_s"] = time.perf_counter() - start
    out["real_tokens"] = timings.tokens
    out["engine_chunks_per_s"] = len(texts) / out["engine_s"]

    store_dir = tempfile.mkdtemp(prefix="embedstream-bench-")
    bulk_env = _env(settings, prefix, os.path.join(store_dir, "bulk"), "bench", 1)
    online_env = _env(settings, prefix, os.path.join(store_dir, "online"), "bench-online", online_threads)
    procs = [_worker("bulk", bulk_env, store_dir, nice=bulk_nice), _worker("online", online_env, store_dir)]
    out["logs"] = store_dir
    try:
        _wait_ready(store_dir, ["bulk", "online"])
        freeze_startup_objects()  # this process loaded a model too: keep full GCs out of the timings
        with QueryClient(k) as client, ChunkPublisher(k, lane="bulk") as pub:
            # Warm up first: for about the first 100 round trips on fresh topics, one in ten
            # took 70-100 ms in a hop (client -> worker or back) while the forward pass stayed at
            # 6 ms; after that none did. Steady state is what a running service sees.
            _round_trips(client, queries_text, warmup)
            idle = _round_trips(client, queries_text, queries)
            # 2. bulk throughput alone: publish the backlog, time until every chunk is committed
            #    (the bulk worker commits only after its upserts, so committed == points written)
            start = time.perf_counter()
            total = pub.publish_documents(corpus, chunker)
            pub.flush()
            _wait_committed(k, f"{prefix}-bulk")
            out["pipeline_s"] = time.perf_counter() - start
            # 3. a second, fresh backlog (other documents: nothing to skip as unchanged), and
            #    query round trips while it drains
            busy_corpus = [dict(d, doc_id=f"busy-{d['doc_id']}") for d in documents(docs, seed=22)]
            pub.publish_documents(busy_corpus, chunker)
            pub.flush()
            busy = _round_trips(client, queries_text, queries)
            out["backlog_left_after_queries"] = _lag(k, f"{prefix}-bulk")
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    out["pipeline_chunks_per_s"] = total / out["pipeline_s"]
    out["ratio"] = out["pipeline_chunks_per_s"] / out["engine_chunks_per_s"]
    out["idle_p50"], out["idle_p95"] = _percentile(idle, 50), _percentile(idle, 95)
    out["busy_p50"], out["busy_p95"] = _percentile(busy, 50), _percentile(busy, 95)
    out["busy_over_idle_p95"] = out["busy_p95"] / out["idle_p95"]
    return out


def print_table(out: dict) -> None:
    from rich.table import Table

    table = Table(title=f"bench pipeline: {out['chunks']} chunks, {out['real_tokens']} real tokens; bulk worker "
                        f"1 thread at nice {out['bulk_nice']}, online worker {out['online_threads']} threads")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("engine alone (1 thread), chunks/s", f"{out['engine_chunks_per_s']:.1f}", "")
    table.add_row("bulk end to end Kafka -> Qdrant, chunks/s", f"{out['pipeline_chunks_per_s']:.1f}", "")
    table.add_row("end to end / engine", f"{out['ratio']:.2f}", ">= 0.85")
    table.add_row("query round trip idle p50 / p95 ms", f"{out['idle_p50']:.1f} / {out['idle_p95']:.1f}", "")
    table.add_row("query round trip under bulk backlog p50 / p95 ms", f"{out['busy_p50']:.1f} / {out['busy_p95']:.1f}", "p95 <= 30")
    table.add_row("backlog p95 / idle p95", f"{out['busy_over_idle_p95']:.2f}", "<= 1.5")
    table.add_row("bulk chunks still queued when the last query returned", str(out["backlog_left_after_queries"]),
                  "> 0 (queries ran under backlog)")
    logs.console().print(table)
