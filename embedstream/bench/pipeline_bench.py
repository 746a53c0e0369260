"""`embedstream bench pipeline`: Kafka -> worker -> Qdrant throughput and query round trips.

In one run on the local broker:
1. throughput, in rounds taken in turns: the engine alone on a backlog's texts (same batching as
   the worker, one thread), then that backlog end to end (publish it, time until every point is
   in the store); the ratio is the median of the rounds' ratios, since this 2-vCPU host's speed
   drifts by 10-15% from one minute to the next,
2. query round-trip p50/p95 with the workers idle, and while a fresh bulk backlog drains
   (the throughput rounds send no queries, so neither measurement disturbs the other).
Workers run as separate processes per lane (the seeds' "separate deployments"): the bulk worker
with one torch thread at a lower CPU priority (``worker embed --nice 10``), the online worker with
one thread at precision ``fast`` (bf16 where the CPU computes it natively). Measured here, each
against the last: a second online thread made the query's forward pass slower, not faster
(11.0 vs 7.3 ms p50: on 2 cores an OpenMP team stalls whenever the broker or a Kafka IO thread
preempts one of its threads), and bf16 weights (21 MB) stay in the L3 cache where float32's
(42 MB) are read from memory on every query (4.5 vs 8.1 ms forward p50).
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
from embedstream.corpus import documents
from embedstream.config import Settings
from embedstream.engine.engine import EmbedRequest, Engine
from embedstream.gcfreeze import freeze_startup_objects
from embedstream.producers.chunker import Chunker
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import ensure_topics
from embedstream.producers.query_client import QueryClient


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
        # The workers trust reply topics named after their replies topic (workers/trust.py): without
        # it a bench's reply_to would be refused (dead-lettered, never answered).
        "EMBEDSTREAM_KAFKA__TOPIC_REPLIES": k.topic_replies,
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
                             "--metrics-port", "0", "--nice", str(nice), "--no-search"], env=env, stdout=log, stderr=subprocess.STDOUT)


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


class _LagProbe:
    """Records on the bulk topic a group has not committed yet (chunks, and trims that follow them).

    One long-lived client: a fresh consumer per probe cost the host CPU the workers were measured on."""

    def __init__(self, k, group: str):
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(**k.client_kwargs(), group_id=group, enable_auto_commit=False)
        ids = self.consumer.partitions_for_topic(k.topic_chunks_bulk)
        self.parts = [TopicPartition(k.topic_chunks_bulk, p) for p in ids]

    def lag(self) -> int:
        ends = self.consumer.end_offsets(self.parts)
        return sum(ends[tp] - (self.consumer.committed(tp) or 0) for tp in self.parts)

    def wait_drained(self, timeout_s: float = 1800) -> None:
        end = time.monotonic() + timeout_s
        while self.lag() > 0:
            if time.monotonic() > end:
                raise RuntimeError(f"bulk backlog not drained after {timeout_s:g} s")
            time.sleep(0.2)

    def __enter__(self) -> "_LagProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.consumer.close()


def _engine_alone(engine: Engine, texts: list[str]) -> tuple[float, int]:
    """Seconds and real tokens for the engine alone on ``texts``, in arrival order (as the worker takes them)."""
    requests = [EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)]
    start = time.perf_counter()
    _, timings = engine.embed(requests, sort_by_length=False)
    return time.perf_counter() - start, timings.tokens


def _backlog(docs: int, seed: int, tag: str) -> list[dict]:
    """A bulk backlog of new documents (fresh ids: nothing is skipped as unchanged)."""
    return [dict(d, doc_id=f"{tag}-{d['doc_id']}") for d in documents(docs, seed=seed)]


def run(docs: int = 300, queries: int = 200, port: int = 9092, online_threads: int = 1, bulk_nice: int = 10,
        warmup: int = 150, rounds: int = 3, online_precision: str = "fast") -> dict:
    info = devkafka.start(port=port)
    prefix = f"bench-{uuid.uuid4().hex[:6]}"
    settings = Settings()
    k = settings.kafka
    k.bootstrap_servers = info.bootstrap
    k.topic_chunks_online, k.topic_chunks_bulk = f"{prefix}.chunks.online", f"{prefix}.chunks.bulk"
    k.topic_queries, k.topic_replies, k.topic_dead_letters = f"{prefix}.queries", f"{prefix}.replies", f"{prefix}.dlq"
    ensure_topics(k, partitions=4)
    engine = Engine.from_name(settings.default_model, settings)  # the bulk worker's settings: same precision
    chunker = Chunker.for_model(engine.spec, chunk_tokens=200, overlap_tokens=24)
    backlogs = [_backlog(docs, 21 + r, f"r{r}") for r in range(rounds)]
    texts = [[t for d in corpus for t in chunker.chunk(d["text"])] for corpus in backlogs]
    queries_text = [" ".join(t.split()[:12]) for t in texts[0][:50]]  # query-sized: ~12 words, 15-25 tokens
    out: dict = {"chunks": sum(map(len, texts)), "real_tokens": 0, "online_threads": online_threads, "bulk_nice": bulk_nice,
                 "rounds": rounds, "online_precision": online_precision}

    import torch

    torch.set_num_threads(1)  # as the bulk worker process runs
    engine.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts[0][:64])])

    store_dir = tempfile.mkdtemp(prefix="embedstream-bench-")
    bulk_env = _env(settings, prefix, os.path.join(store_dir, "bulk"), "bench", 1)
    online_env = _env(settings, prefix, os.path.join(store_dir, "online"), "bench-online", online_threads)
    online_env["EMBEDSTREAM_ENGINE__PRECISION"] = online_precision
    procs = [_worker("bulk", bulk_env, store_dir, nice=bulk_nice), _worker("online", online_env, store_dir)]
    out["logs"] = store_dir
    engine_rates, pipeline_rates, ratios = [], [], []
    try:
        _wait_ready(store_dir, ["bulk", "online"])
        freeze_startup_objects()  # this process loaded a model too: keep full GCs out of the timings
        with _LagProbe(k, f"{prefix}-bulk") as probe, ChunkPublisher(k, lane="bulk") as pub:
            # 1. throughput rounds, engine alone and end to end in turns, no queries (and no
            #    query client yet: its reply reader would share this process's GIL with the engine)
            for corpus, round_texts in zip(backlogs, texts):
                engine_s, tokens = _engine_alone(engine, round_texts)
                out["real_tokens"] += tokens
                start = time.perf_counter()
                total = pub.publish_documents(corpus, chunker)
                pub.flush()
                probe.wait_drained()  # the bulk worker commits only after its upserts: committed == written
                pipeline_s = time.perf_counter() - start
                engine_rates.append(len(round_texts) / engine_s)
                pipeline_rates.append(total / pipeline_s)
                ratios.append(pipeline_rates[-1] / engine_rates[-1])
            # 2. query round trips. Warm up first: for about the first 100 round trips on fresh
            #    topics, one in ten took 70-100 ms in a hop (client -> worker or back) while the
            #    forward pass stayed at 6 ms; after that none did. Steady state is what a running
            #    service sees.
            with QueryClient(k) as client:
                _round_trips(client, queries_text, warmup)
                idle = _round_trips(client, queries_text, queries)
                pub.publish_documents(_backlog(docs, 99, "busy"), chunker)
                pub.flush()
                busy = _round_trips(client, queries_text, queries)
                out["backlog_left_after_queries"] = probe.lag()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    out["engine_chunks_per_s"] = statistics.median(engine_rates)
    out["pipeline_chunks_per_s"] = statistics.median(pipeline_rates)
    out["round_ratios"] = ratios
    out["ratio"] = statistics.median(ratios)
    out["idle_p50"], out["idle_p95"] = _percentile(idle, 50), _percentile(idle, 95)
    out["busy_p50"], out["busy_p95"] = _percentile(busy, 50), _percentile(busy, 95)
    out["busy_over_idle_p95"] = out["busy_p95"] / out["idle_p95"]
    return out


def print_table(out: dict) -> None:
    from rich.table import Table

    table = Table(title=f"bench pipeline: {out['rounds']} rounds, {out['chunks']} chunks, {out['real_tokens']} real "
                        f"tokens in all; bulk worker 1 thread at nice {out['bulk_nice']}, online worker "
                        f"{out['online_threads']} thread(s) at precision {out['online_precision']}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("target", justify="right")
    table.add_row("engine alone (1 thread), chunks/s, median", f"{out['engine_chunks_per_s']:.1f}", "")
    table.add_row("bulk end to end Kafka -> Qdrant, chunks/s, median", f"{out['pipeline_chunks_per_s']:.1f}", "")
    rounds = " / ".join(f"{r:.2f}" for r in out["round_ratios"])
    table.add_row(f"end to end / engine, median of rounds ({rounds})", f"{out['ratio']:.2f}", ">= 0.85")
    table.add_row("query round trip idle p50 / p95 ms", f"{out['idle_p50']:.1f} / {out['idle_p95']:.1f}", "")
    table.add_row("query round trip under bulk backlog p50 / p95 ms", f"{out['busy_p50']:.1f} / {out['busy_p95']:.1f}", "p95 <= 30")
    table.add_row("backlog p95 / idle p95", f"{out['busy_over_idle_p95']:.2f}", "<= 1.5")
    table.add_row("bulk chunks still queued when the last query returned", str(out["backlog_left_after_queries"]),
                  "> 0 (queries ran under backlog)")
    logs.console().print(table)
