"""`embedstream bench cdc`: freshness of the CDC path, from a row's COMMIT in PostgreSQL to the changed text
being visible in the vector store, on the real rig (dev PostgreSQL, Kafka Connect + Debezium, the bridge and an
embed worker on both lanes, an in-process Qdrant).

Rows of a seeded table are updated at stepped rates (open loop: one writer, changes spread evenly); each change
writes a fresh marker into the row's title, so chunk 0 changes and is embedded again. Per change:
``commit`` (the UPDATE's COMMIT returned) -> ``debezium`` (the change record's broker timestamp) -> ``bridge``
(the chunk event's timestamp) -> ``visible`` (a poller sees the marker in the stored point); the last stage is
split into the write (the embed worker's mean upsert during the step) and the rest (embed). Steps run idle
and while a bulk backlog (documents on the bulk lane) drains; the table has p50 / p95 / p99 per step and each
stage's share of the median, and the highest rate whose p95 stays under the target.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
from kafka import KafkaConsumer, TopicPartition

from embedstream import devkafka
from embedstream.corpus import documents, stdlib_paragraphs
from embedstream.bench.latency_bench import cpu_line
from embedstream.config import Settings
from embedstream.devcdc import connect, postgres
from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import all_topics, ensure_topics
from embedstream.workers.cdc_bridge import CdcBridge, CdcOptions
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.sink import point_id

ROWS = 200


@dataclass
class CdcStep:
    backlog: bool
    rate: float
    changes: int
    seen: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    debezium_ms: float  # medians of each stage
    bridge_ms: float
    embed_ms: float  # COMMIT's chunk event -> visible, less the write
    write_ms: float  # the embed worker's mean upsert (online lane) during the step
    backlog_left: int | None = None


@dataclass
class CdcBenchResult:
    cpu: str
    versions: str
    target_ms: float
    steps: list[CdcStep] = field(default_factory=list)
    table: str = ""
    png: str = ""


class _Stamps:
    """Broker timestamps of the Debezium records and chunk events, by (doc_id, marker), from two tailing consumers."""

    def __init__(self, bootstrap: str, cdc_topic: str, chunk_topic: str):
        self.debezium: dict[tuple[str, str], float] = {}
        self.bridge: dict[tuple[str, str], float] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._tail, args=(bootstrap, topic, out, parse), daemon=True)
                        for topic, out, parse in ((cdc_topic, self.debezium, self._from_change),
                                                  (chunk_topic, self.bridge, self._from_chunk))]
        for t in self.threads:
            t.start()

    @staticmethod
    def _from_change(value: dict) -> tuple[str, str] | None:
        after = value.get("after") or {}
        return (str(after.get("id")), after.get("title", "")) if after else None

    @staticmethod
    def _from_chunk(value: dict) -> tuple[str, str] | None:
        if value.get("kind") == "delete" or value.get("chunk_id") != 0:
            return None
        return value.get("doc_id"), value.get("text", "").split("\n\n", 1)[0]

    def _tail(self, bootstrap: str, topic: str, out: dict, parse) -> None:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
        consumer.assign([TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0})])
        while not self.stop.is_set():
            for records in consumer.poll(timeout_ms=100).values():
                for r in records:
                    try:
                        found = parse(json.loads(r.value)) if r.value else None
                    except ValueError:
                        continue
                    if found:
                        out.setdefault(found, r.timestamp / 1000.0)
        consumer.close()


def _marker(n: int) -> str:
    return f"Revision {n} of the guide"


def _step(rig: dict, rate: float, duration_s: float, backlog: bool, counter: list[int]) -> CdcStep:
    """Update rows at ``rate`` for ``duration_s``; wait for each change to be visible (30 s at most)."""
    pending: dict[str, tuple[str, float]] = {}  # doc_id -> (marker, commit time): a row's latest change
    done: list[tuple[str, str, float, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    store, collection = rig["store"], rig["collection"]

    def poll_visible() -> None:
        while not stop.is_set() or pending:
            with lock:
                items = list(pending.items())
            for doc_id, (marker, t0) in items:
                try:
                    payload = store.get_payloads(collection, [point_id(doc_id, 0)]).get(point_id(doc_id, 0)) or {}
                except Exception:  # noqa: BLE001 - the collection appears with the first write
                    payload = {}
                if str(payload.get("text", "")).startswith(marker):
                    with lock:
                        if pending.get(doc_id, ("",))[0] == marker:
                            pending.pop(doc_id)
                            done.append((doc_id, marker, t0, time.time()))
            if stop.is_set() and time.monotonic() > give_up[0]:
                return
            time.sleep(0.005)

    give_up = [float("inf")]
    upserts_before = _upserts(rig["worker"])
    poller = threading.Thread(target=poll_visible, daemon=True)
    poller.start()
    rnd = random.Random(int(rate * 100) + backlog)
    import psycopg

    sent = 0
    with psycopg.connect(rig["pg"].dsn, autocommit=True) as conn:
        start = time.monotonic()
        while time.monotonic() - start < duration_s:
            due = start + sent / rate
            time.sleep(max(0.0, due - time.monotonic()))
            with lock:
                free = [i for i in range(1, ROWS + 1) if str(i) not in pending]
            doc = str(rnd.choice(free))
            counter[0] += 1
            marker = _marker(counter[0])
            conn.execute(f"UPDATE {rig['table']} SET title = %s WHERE id = %s", (marker, int(doc)))
            with lock:
                pending[doc] = (marker, time.time())
            sent += 1
    give_up[0] = time.monotonic() + 30
    stop.set()
    poller.join(40)
    stamps: _Stamps = rig["stamps"]
    total = [(t1 - t0) * 1000 for _, _, t0, t1 in done]
    stages = [(stamps.debezium.get((d, m)), stamps.bridge.get((d, m)), t0, t1) for d, m, t0, t1 in done]
    stages = [(dz - t0, br - dz, t1 - br) for dz, br, t0, t1 in stages if dz and br]

    def med(i: int) -> float:
        return float(np.median([s[i] for s in stages]) * 1000) if stages else float("nan")

    left = rig["backlog_left"]() if backlog else None
    (sum0, n0), (sum1, n1) = upserts_before, _upserts(rig["worker"])
    write = (sum1 - sum0) / (n1 - n0) * 1000 if n1 > n0 else float("nan")
    return CdcStep(backlog, rate, sent, len(done), *(float(np.percentile(total, q)) if total else float("nan")
                                                       for q in (50, 95, 99)), med(0), med(1),
                   max(0.0, med(2) - write) if write == write else med(2), write, left)


def _upserts(worker) -> tuple[float, float]:
    """(seconds, count) of the embed worker's upserts on the online lane so far."""
    labels = {"stage": "upsert", "lane": "online"}
    get = worker.metrics.registry.get_sample_value
    return (get("embedstream_stage_duration_seconds_sum", labels) or 0.0,
            get("embedstream_stage_duration_seconds_count", labels) or 0.0)


def run(rates: list[float], step_s: float = 10.0, backlog_docs: int = 400, port: int = 9092, pg_port: int = 5432,
        rest_port: int = 8083, target_ms: float = 1000.0, out_dir: str = "bench-results",
        model: str = "all-MiniLM-L6-v2") -> CdcBenchResult:
    from embedstream.engine.engine import Engine
    from embedstream.vectorstore.factory import open_store
    from embedstream.vectorstore.locked import LockedStore

    work = tempfile.mkdtemp(prefix="embedstream-bench-cdc-")
    os.chmod(work, 0o755)  # PostgreSQL runs as 'postgres' when we are root
    with _started_broker(port) as bootstrap:
        pg = postgres.start(pg_port, os.path.join(work, "pg"))
        info = connect.start(bootstrap, rest_port, os.path.join(work, "connect"))
        try:
            return _run(bootstrap, pg, info, rates, step_s, backlog_docs, target_ms, out_dir, model, Engine,
                        lambda: LockedStore(open_store(":memory:", None, None)))
        finally:
            connect.stop(rest_port, os.path.join(work, "connect"))
            postgres.stop(pg_port, os.path.join(work, "pg"), mode="immediate")
            shutil.rmtree(work, ignore_errors=True)


class _started_broker:
    """The dev broker on ``port``: reused when running, else started and stopped again."""

    def __init__(self, port: int):
        self.port, self.started = port, False

    def __enter__(self) -> str:
        if devkafka.status(port=self.port)["answering"]:
            return devkafka.status(port=self.port)["bootstrap"]
        self.started = True
        return devkafka.start(port=self.port).bootstrap

    def __exit__(self, *exc) -> None:
        if self.started:
            devkafka.stop(port=self.port)


def _run(bootstrap, pg, info, rates, step_s, backlog_docs, target_ms, out_dir, model, engine_cls, new_store):
    import psycopg

    tag = uuid.uuid4().hex[:6]
    table = f"bench_{tag}"
    paras = stdlib_paragraphs()
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, title text, body text)")
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)",
                            [(i, _marker(0), "\n\n".join(paras[(3 * i + j) % len(paras)] for j in range(3)))
                             for i in range(1, ROWS + 1)])
    config = connect.debezium_config(pg, f"public.{table}", f"bench{tag}")
    settings = Settings()
    k = settings.kafka
    prefix = f"cdcb-{tag}"
    k.bootstrap_servers = bootstrap
    k.topic_chunks_online, k.topic_chunks_bulk = f"{prefix}.chunks.online", f"{prefix}.chunks.bulk"
    k.topic_queries, k.topic_replies, k.topic_dead_letters = f"{prefix}.queries", f"{prefix}.replies", f"{prefix}.dlq"
    k.topic_rerank, k.topic_search, k.topic_documents = f"{prefix}.rerank", f"{prefix}.search", f"{prefix}.documents"
    k.group_online, k.group_bulk, k.group_cdc = f"{prefix}-online", f"{prefix}-bulk", f"{prefix}-cdc"
    settings.qdrant.versioned_collections = False
    ensure_topics(k, partitions=1, topics=[connect.topic_for(config), *all_topics(k)])
    engine = engine_cls.from_name(model, settings)
    chunker = Chunker.for_model(engine.spec, 200, 32)
    store = new_store()
    worker = build_embed_worker(settings, ("online", "bulk"), store=store, engine=engine)
    bridge = CdcBridge(settings, chunker, CdcOptions(connect.topic_for(config), CdcConfig("id", ("title", "body"))))
    threads = [threading.Thread(target=w.run, daemon=True) for w in (worker, bridge)]
    for t in threads:
        t.start()
    connect.register(info, f"bench{tag}", config)
    stamps = _Stamps(bootstrap, connect.topic_for(config), k.topic_chunks_online)
    collection = settings.qdrant.collection
    lag = KafkaConsumer(bootstrap_servers=bootstrap, group_id=k.group_bulk, enable_auto_commit=False)

    def backlog_left() -> int:
        tps = [TopicPartition(k.topic_chunks_bulk, p) for p in lag.partitions_for_topic(k.topic_chunks_bulk) or ()]
        ends = lag.end_offsets(tps)
        return sum(ends[tp] - (lag.committed(tp) or 0) for tp in tps)

    rig = {"pg": pg, "table": table, "store": store, "worker": worker, "collection": collection, "stamps": stamps,
           "backlog_left": backlog_left}
    result = CdcBenchResult(cpu_line(), info.versions, target_ms)
    counter = [0]
    try:
        deadline = time.monotonic() + 600  # the snapshot: every row indexed before measuring
        while time.monotonic() < deadline:
            try:
                if store.count(collection) >= ROWS:
                    break
            except Exception:  # noqa: BLE001 - the collection appears with the first write
                pass
            time.sleep(0.5)
        for backlog in (False, True):
            for rate in rates:
                if backlog:
                    with ChunkPublisher(k, lane="bulk", record_documents=False) as publisher:
                        publisher.publish_documents(documents(backlog_docs, seed=int(rate)), chunker)
                result.steps.append(_step(rig, rate, step_s, backlog, counter))
                s = result.steps[-1]
                print(f"  {'backlog' if backlog else 'idle   '} {rate:6.1f}/s: p50 {s.p50_ms:7.0f} ms  p95 "
                      f"{s.p95_ms:7.0f} ms  ({s.seen}/{s.changes} seen)", flush=True)
    finally:
        stamps.stop.set()
        for w in (bridge, worker):
            w.stop()
        for t in threads:
            t.join(60)
        lag.close()
        connect.unregister(info, f"bench{tag}")
    os.makedirs(out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result.table = os.path.join(out_dir, f"cdc-{stamp}.json")
    with open(result.table, "w") as fh:
        json.dump(asdict(result), fh, indent=2)
    result.png = os.path.join(out_dir, f"cdc-{stamp}.png")
    try:
        plot(result, result.png)
    except ImportError as exc:
        result.png = f"none ({exc}; pip install 'embedstream[bench]' for it)"
    return result


def highest_rate(result: CdcBenchResult, backlog: bool) -> float | None:
    ok = [s.rate for s in result.steps if s.backlog == backlog and s.p95_ms <= result.target_ms and s.seen == s.changes]
    return max(ok) if ok else None


def print_table(result: CdcBenchResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CDC freshness: COMMIT -> visible in Qdrant ({result.versions})")
    for col in ("load", "rate/s", "changes", "seen", "p50 ms", "p95 ms", "p99 ms", "debezium", "bridge",
                "embed", "write", "backlog left"):
        table.add_column(col, justify="right")
    for s in result.steps:
        parts = [s.debezium_ms, s.bridge_ms, s.embed_ms, s.write_ms]
        total = sum(p for p in parts if p == p) or float("nan")
        shares = [f"{p:.0f} ms ({100 * p / total:.0f}%)" if p == p else "-" for p in parts]
        table.add_row("bulk backlog" if s.backlog else "idle", f"{s.rate:g}", str(s.changes), str(s.seen),
                      f"{s.p50_ms:.0f}", f"{s.p95_ms:.0f}", f"{s.p99_ms:.0f}", *shares,
                      "" if s.backlog_left is None else str(s.backlog_left))
    console = Console(width=max(140, Console().width))
    console.print(table)
    for backlog in (False, True):
        best = highest_rate(result, backlog)
        console.print(f"highest rate with p95 <= {result.target_ms:.0f} ms ({'bulk backlog' if backlog else 'idle'}): "
                      f"{best if best is not None else 'none of those measured'}")
    console.print(f"host: {result.cpu}\ntable: {result.table}\nplot: {result.png}", highlight=False, markup=False)


def plot(result: CdcBenchResult, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for backlog, style in ((False, "-"), (True, "--")):
        steps = [s for s in result.steps if s.backlog == backlog]
        for q in ("p50", "p95", "p99"):
            ax.plot([s.rate for s in steps], [getattr(s, f"{q}_ms") for s in steps], style, marker="o",
                    label=f"{q} {'bulk backlog' if backlog else 'idle'}")
    ax.axhline(result.target_ms, color="grey", linewidth=0.8)
    ax.set_xlabel("row changes per second")
    ax.set_ylabel("COMMIT -> visible (ms)")
    ax.set_title("embedstream CDC freshness")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
