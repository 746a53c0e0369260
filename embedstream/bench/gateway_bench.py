"""bench gateway: the same queries over HTTP (the gateway) and through the Kafka client, side by side.

One online embed worker (1 thread, precision ``fast``, as deployed) and one gateway run as separate
processes on the local broker; this process is the client. Requests alternate between the two paths
so drift in the shared CPUs hits both alike. Then a soak: ``concurrency`` HTTP clients for ``soak_s``
seconds, every request accounted for (answered, refused by status, lost). Every loop is bounded in
count and in time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import typer

from embedstream import logs
from embedstream.corpus import stdlib_paragraphs
from embedstream.config import KafkaSettings, Settings
from embedstream.producers.query_client import QueryClient


def _queries(count: int = 64) -> list[str]:
    """Query-sized texts (~12 words, 15-25 tokens), as in bench pipeline."""
    return [" ".join(p.split()[:12]) for p in stdlib_paragraphs()[:count]]


def _gateway(env: dict, port: int, reply_topic: str, log_dir: str) -> subprocess.Popen:
    log = open(os.path.join(log_dir, "gateway.log"), "wb")
    return subprocess.Popen([sys.executable, "-m", "embedstream.gateway", "--host", "127.0.0.1", "--port", str(port),
                             "--reply-topic", reply_topic, "--log-level", "warning"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the gateway did not answer /health within {timeout_s:g} s")


class RoundTrips:
    """One round trip of one text, by either path; raises on any error so nothing is silently dropped."""

    def __init__(self, url: str, client: QueryClient, timeout_s: float = 30.0):
        self.http = httpx.Client(base_url=url, timeout=timeout_s, limits=httpx.Limits(max_connections=64))
        self.client = client
        self.timeout_s = timeout_s

    def over_http(self, text: str) -> float:
        start = time.perf_counter()
        r = self.http.post("/embed", json={"inputs": text})
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        return (time.perf_counter() - start) * 1000

    def over_kafka(self, text: str) -> float:
        start = time.perf_counter()
        reply = self.client.embed(text, timeout_s=self.timeout_s, prompt=None)
        if reply.error:
            raise RuntimeError(f"worker error: {reply.error.message}")
        return (time.perf_counter() - start) * 1000

    def close(self) -> None:
        self.http.close()


def alternating(paths: RoundTrips, texts: list[str], count: int, concurrency: int, max_s: float) -> dict[str, list[float]]:
    """``count`` round trips per path, alternating, ``concurrency`` at a time, stopped after ``max_s``."""
    times: dict[str, list[float]] = {"http": [], "kafka": []}
    stop_at = time.monotonic() + max_s
    lock = threading.Lock()

    def one(i: int) -> None:
        if time.monotonic() > stop_at:
            return
        text = texts[i // 2 % len(texts)]
        name, fn = ("http", paths.over_http) if i % 2 == 0 else ("kafka", paths.over_kafka)
        ms = fn(text)
        with lock:
            times[name].append(ms)

    with ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(one, i) for i in range(2 * count)]:
            future.result()
    return times


def soak(paths: RoundTrips, texts: list[str], concurrency: int, seconds: float) -> dict:
    """``concurrency`` clients sending back to back over HTTP for ``seconds``; every request is counted."""
    counts: Counter = Counter()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(k: int) -> None:
        i = k
        while time.monotonic() < stop_at:
            outcome = "ok"
            try:
                r = paths.http.post("/embed", json={"inputs": texts[i % len(texts)]})
                if r.status_code != 200:
                    outcome = f"http_{r.status_code}"
            except httpx.HTTPError as exc:
                outcome = f"lost ({type(exc).__name__})"
            with lock:
                counts["sent"] += 1
                counts[outcome] += 1
            i += concurrency

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + paths.timeout_s + 5)
    out = dict(counts)
    out["lost"] = sum(v for key, v in counts.items() if key.startswith("lost"))
    out["seconds"] = seconds
    return out


def run(port: int = 9092, requests: int = 300, concurrency: tuple[int, ...] = (1, 16), soak_s: float = 60.0,
        soak_concurrency: int = 16, warmup: int = 100, max_s: float = 300.0) -> dict:
    from embedstream import devkafka
    from embedstream.bench.pipeline_bench import _env, _wait_ready, _worker  # the same worker processes
    from embedstream.gateway.server import free_port
    from embedstream.producers.topics import ensure_topics

    info = devkafka.start(port=port)
    prefix = f"benchgw-{uuid.uuid4().hex[:6]}"
    # Topics of this run only; the online worker needs its chunk topic too (it subscribes to it).
    topics = {"chunks_online": "chunks.online", "chunks_bulk": "chunks.bulk", "queries": "queries",
              "replies": "replies", "dead_letters": "dlq"}
    settings = Settings(kafka=KafkaSettings(bootstrap_servers=info.bootstrap,
                                            **{f"topic_{key}": f"{prefix}.{name}" for key, name in topics.items()}))
    k = settings.kafka
    ensure_topics(k, partitions=4)
    log_dir = tempfile.mkdtemp(prefix="embedstream-bench-gateway-")
    env = _env(settings, prefix, os.path.join(log_dir, "store"), "bench-gateway", 1)
    env["EMBEDSTREAM_ENGINE__PRECISION"] = "fast"
    gateway_port = free_port()
    url = f"http://127.0.0.1:{gateway_port}"
    procs = [_worker("online", env, log_dir)]
    out: dict = {"logs": log_dir, "rows": []}
    try:
        procs.append(_gateway(env, gateway_port, f"{prefix}.replies-gateway", log_dir))
        _wait_ready(log_dir, ["online"])
        _wait_http(url, procs[-1])
        texts = _queries()
        with QueryClient(k) as client:
            paths = RoundTrips(url, client)
            try:
                alternating(paths, texts, warmup, 1, max_s)
                for c in concurrency:
                    times = alternating(paths, texts, requests, c, max_s)
                    http, kafka = np.array(times["http"]), np.array(times["kafka"])
                    out["rows"].append({"concurrency": c, "count": min(len(http), len(kafka)),
                                        "http_p50": float(np.percentile(http, 50)), "http_p95": float(np.percentile(http, 95)),
                                        "kafka_p50": float(np.percentile(kafka, 50)),
                                        "kafka_p95": float(np.percentile(kafka, 95))})
                if soak_s > 0:
                    out["soak"] = soak(paths, texts, soak_concurrency, soak_s)
                    out["soak"]["concurrency"] = soak_concurrency
            finally:
                paths.close()
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return out


def print_table(out: dict) -> None:
    from rich.table import Table

    table = Table(title="bench gateway: /embed over HTTP vs QueryClient.embed over Kafka, one query each, same worker "
                        "(1 thread, precision fast); requests alternate between the paths")
    for column in ("concurrency", "requests per path", "HTTP p50 / p95 ms", "Kafka client p50 / p95 ms",
                   "gateway overhead p50 ms", "target"):
        table.add_column(column, justify="right")
    for row in out["rows"]:
        table.add_row(str(row["concurrency"]), str(row["count"]), f"{row['http_p50']:.2f} / {row['http_p95']:.2f}",
                      f"{row['kafka_p50']:.2f} / {row['kafka_p95']:.2f}", f"{row['http_p50'] - row['kafka_p50']:.2f}",
                      "<= 3")
    logs.console().print(table)
    soak = out.get("soak")
    if soak:
        refused = {k: v for k, v in soak.items() if k.startswith("http_")}
        logs.console().print(
            f"soak: {soak['concurrency']} concurrent HTTP clients for {soak['seconds']:g} s: sent {soak.get('sent', 0)}, "
            f"answered {soak.get('ok', 0)}, refused {sum(refused.values())} {refused or ''}, lost {soak['lost']} "
            f"({soak.get('sent', 0) / soak['seconds']:.0f} requests/s)")
    logs.console().print(f"logs: {out['logs']}")


def bench_gateway_cmd(
    port: int = typer.Option(9092, help="Local Kafka broker port (started when not running)"),
    requests: int = typer.Option(300, help="Round trips per path and concurrency"),
    concurrency: list[int] = typer.Option([1, 16], help="Concurrent clients (repeatable)"),
    soak_s: float = typer.Option(60.0, help="Soak seconds at --soak-concurrency (0: skip)"),
    soak_concurrency: int = typer.Option(16, help="Concurrent HTTP clients in the soak"),
    warmup: int = typer.Option(100, help="Round trips per path before measuring"),
    max_s: float = typer.Option(300.0, help="Time bound of each measured phase"),
) -> None:
    """Gateway round trip p50/p95 against the Kafka client at concurrency 1 and 16, then a lossless soak."""
    from embedstream import devkafka

    logs.configure()
    with devkafka.borrowed(port=port):  # a broker started for the bench is stopped however it ends
        result = run(port, requests, tuple(concurrency), soak_s, soak_concurrency, warmup, max_s)
    print_table(result)
