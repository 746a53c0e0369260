"""`embedstream bench cdc`: freshness and cost of the CDC path by change mix, from a row's COMMIT in PostgreSQL to
the change being readable in the vector store, on the real rig (dev PostgreSQL, Kafka Connect + Debezium, the
bridge and an embed worker on both lanes, the embedded Qdrant (qdrant-edge) in a temporary folder: the
production store of a single-node deployment; qdrant-client's ``:memory:`` mode scans every point for each
filtered call, 250 ms at 3,000 points on this host, so it measured itself rather than the pipeline).

Mixes (``--mix``): ``flips`` set a short row's status (a metadata-only change: a payload write, no forward
pass), ``long-flips`` a 20 KB row's (TOASTed: Debezium sends a placeholder for the body, which the bridge
fills in from the documents log); ``edits`` rewrite one sentence in the middle of a 20 KB row (the chunks
around it are embedded again); ``rewrites`` replace a short row's whole text. Rows are changed at stepped rates (open loop: one writer,
changes spread evenly, a row changed again only once its last change is visible); each change writes a fresh
marker (the status, the edited sentence, the new title) and a poller reads the point that must show it. Per
change: ``commit`` (the UPDATE's COMMIT returned) -> ``debezium`` (the change record's broker timestamp) ->
``bridge`` (the chunk event's timestamp) -> ``visible``; the last stage is split into the write (the worker's
mean sink write during the step) and the rest (embed). Per step: p50 / p95 / p99, forward passes per change
(sequences the model ran, from the worker's metrics), each stage's median; per mix the highest rate whose p95
stays under the target, and whether the index then equals the table (text, metadata, no stale chunk). Steps
run idle and while a bulk backlog (documents on the bulk lane) drains.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
from kafka import KafkaConsumer, TopicPartition

from embedstream import devkafka
from embedstream.bench.latency_bench import cpu_line
from embedstream.config import Settings
from embedstream.corpus import documents, edit_sentence, long_text, stdlib_paragraphs
from embedstream.devcdc import connect, postgres
from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import all_topics, ensure_topics
from embedstream.vectorstore import CollectionNotFound
from embedstream.workers.cdc_bridge import CdcBridge, CdcOptions
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.sink import point_id

SHORT_ROWS = 600  # ids 1..600: a title and three paragraphs (flips, rewrites)
LONG_ROWS = 30  # ids 1001..1030: ~20 KB bodies (edits)
LONG_BASE = 1000
CONFIG = CdcConfig("id", ("title", "body"), ("status",))
MIXES = {"flips": (20, 50, 100, 200, 300), "long-flips": (5, 10, 20, 50), "edits": (1, 2, 5, 10),
         "rewrites": (1, 2, 5, 10, 20)}
LONG_MIXES = ("long-flips", "edits")
_MARK = re.compile(r"Revision (\d+) ")


@dataclass
class CdcStep:
    mix: str
    backlog: bool
    rate: float
    achieved: float  # changes committed per second (the one writer may fall short of ``rate``)
    changes: int
    seen: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    forward_per_change: float  # sequences the model ran, per change
    debezium_ms: float  # medians of each stage
    bridge_ms: float
    embed_ms: float  # COMMIT's chunk event -> visible, less the write
    write_ms: float  # the embed worker's mean sink write (online lane) during the step
    backlog_left: int | None = None


@dataclass
class CdcBenchResult:
    cpu: str
    versions: str
    target_ms: float
    steps: list[CdcStep] = field(default_factory=list)
    index_equals_table: dict[str, str] = field(default_factory=dict)  # mix -> "yes" or what differs
    table: str = ""
    png: str = ""


class _Stamps:
    """Broker timestamps of the Debezium records and chunk events, by (doc_id, marker), from two tailing consumers.

    The marker of a change is its status or the number in its ``Revision <n>`` sentence (title or body); a
    record with several keeps the first time each was seen, so the new one gets this record's."""

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
    def _from_change(value: dict) -> list[tuple[str, str]]:
        after = value.get("after") or {}
        doc = str(after.get("id"))
        marks = _MARK.findall(f"{after.get('title') or ''} {after.get('body') or ''}")  # earlier ones are kept
        return [(doc, str(after.get("status"))), *((doc, n) for n in marks)] if after else []

    @staticmethod
    def _from_chunk(value: dict) -> list[tuple[str, str]]:
        if value.get("kind") == "delete":
            return []
        doc = str(value.get("doc_id"))
        marks = _MARK.findall(value.get("text", ""))
        return [(doc, str((value.get("metadata") or {}).get("status"))), *((doc, n) for n in marks)]

    def _tail(self, bootstrap: str, topic: str, out: dict, parse) -> None:
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
        consumer.assign([TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0})])
        while not self.stop.is_set():
            for records in consumer.poll(timeout_ms=100).values():
                for r in records:
                    try:
                        found = parse(json.loads(r.value)) if r.value else []
                    except ValueError:
                        continue
                    for key in found:
                        out.setdefault(key, r.timestamp / 1000.0)
        consumer.close()


class _Rows:
    """The table's rows as the bench last wrote them, and the change each mix makes: the SQL, the marker, and
    the point (with the payload test) that shows the change once it is readable."""

    def __init__(self, table: str, chunker: Chunker):
        self.table, self.chunker = table, chunker
        paras = stdlib_paragraphs()
        self.rows: dict[int, dict] = {
            i: {"title": f"Guide {i}", "body": "\n\n".join(paras[(3 * i + j) % len(paras)] for j in range(3)),
                "status": "draft"} for i in range(1, SHORT_ROWS + 1)}
        self.rows.update({LONG_BASE + i: {"title": f"Handbook {i}", "body": long_text(i), "status": "draft"}
                          for i in range(1, LONG_ROWS + 1)})

    def ids(self, mix: str) -> list[int]:
        return [i for i in self.rows if (i > LONG_BASE) == (mix in LONG_MIXES)]

    def change(self, mix: str, doc: int, n: int) -> tuple[str, tuple, str, str, object]:
        """(sql, params, marker, point id, test of its payload) of change ``n`` to row ``doc``."""
        row = self.rows[doc]
        if mix in ("flips", "long-flips"):
            row["status"] = marker = f"s{n}"
            return (f"UPDATE {self.table} SET status = %s WHERE id = %s", (marker, doc), marker,
                    point_id(str(doc), 0), lambda p, m=marker: p.get("status") == m)
        if mix == "edits":
            # a sentence replaced or inserted (seed % 3 of 0 or 1), never only deleted: the new one is the marker
            row["body"] = edit_sentence(row["body"], n - (n % 3 == 2), f"Revision {n} rewrote this sentence to say so.")
            params: tuple = (row["body"], doc)
            sql = f"UPDATE {self.table} SET body = %s WHERE id = %s"
        else:
            paras = stdlib_paragraphs()
            row["title"] = f"Revision {n} of the guide"
            row["body"] = "\n\n".join(paras[(7 * n + j) % len(paras)] for j in range(3))
            params, sql = (row["title"], row["body"], doc), f"UPDATE {self.table} SET title = %s, body = %s WHERE id = %s"
        token = f"Revision {n} "
        chunks = self.chunker.chunk(self.text(doc))
        index = next(i for i, chunk in enumerate(chunks) if token in chunk)
        return sql, params, str(n), point_id(str(doc), index), lambda p, t=token: t in str(p.get("text", ""))

    def text(self, doc: int) -> str:
        row = self.rows[doc]
        return "\n\n".join(v for v in (row["title"], row["body"]) if v and v.strip())

    def expected(self, dsn: str) -> dict[str, tuple]:
        """What the collection must hold for the table as PostgreSQL has it: per point (doc, chunk id, text, status)."""
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            table = {doc: {"title": t, "body": b, "status": s}
                     for doc, t, b, s in conn.execute(f"SELECT id, title, body, status FROM {self.table}")}
        out = {}
        texts = ["\n\n".join(v for v in (r["title"], r["body"]) if v and v.strip()) for r in table.values()]
        for doc, chunks in zip(table, self.chunker.chunk_many(texts)):
            for i, chunk in enumerate(chunks):
                out[point_id(str(doc), i)] = (str(doc), i, chunk, table[doc]["status"])
        return out


def _step(rig: dict, mix: str, rate: float, duration_s: float, backlog: bool, counter: list[int]) -> CdcStep:
    """Change rows at ``rate`` for ``duration_s``; wait for each change to be readable (30 s at most)."""
    rows: _Rows = rig["rows"]
    pending: dict[int, tuple] = {}  # doc -> (marker, point id, test, commit time): a row's latest change
    done: list[tuple[str, str, float, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    store, collection = rig["store"], rig["collection"]
    give_up = [float("inf")]

    def poll_visible() -> None:
        while not stop.is_set() or pending:
            with lock:
                items = list(pending.items())
            try:
                payloads = store.get_payloads(collection, [pid for _, (_, pid, _, _) in items]) if items else {}
            except Exception:  # noqa: BLE001 - the collection appears with the first write
                payloads = {}
            now = time.time()
            with lock:
                for doc, (marker, pid, test, t0) in items:
                    if test(payloads.get(pid) or {}) and pending.get(doc, ("",))[0] == marker:
                        pending.pop(doc)
                        done.append((str(doc), marker, t0, now))
            if stop.is_set() and time.monotonic() > give_up[0]:
                return
            time.sleep(0.005)

    before = _worker_counts(rig["worker"])
    poller = threading.Thread(target=poll_visible, daemon=True)
    poller.start()
    candidates = rows.ids(mix)
    import psycopg

    sent = 0
    with psycopg.connect(rig["pg"].dsn, autocommit=True) as conn:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < duration_s:
            time.sleep(max(0.0, start + sent / rate - time.monotonic()))
            with lock:
                free = [i for i in candidates if i not in pending]
            if not free:  # every row has a change on its way: wait for one to become readable
                time.sleep(0.001)
                continue
            doc = free[(counter[0] * 7919) % len(free)]
            counter[0] += 1
            sql, params, marker, pid, test = rows.change(mix, doc, counter[0])
            conn.execute(sql, params)
            with lock:
                pending[doc] = (marker, pid, test, time.time())
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
    after = _worker_counts(rig["worker"])
    write = (after[0] - before[0]) / (after[1] - before[1]) * 1000 if after[1] > before[1] else float("nan")
    forward = (after[2] - before[2]) / sent if sent else float("nan")
    return CdcStep(mix, backlog, rate, sent / max(elapsed, 1e-9), sent, len(done), *(float(np.percentile(total, q)) if total else float("nan")
                                                         for q in (50, 95, 99)), forward, med(0), med(1),
                   max(0.0, med(2) - write) if write == write else med(2), write, left)


def _worker_counts(worker) -> tuple[float, float, float]:
    """(seconds, count) of the embed worker's sink writes on the online lane so far, and the sequences its
    online passes ran."""
    get = worker.metrics.registry.get_sample_value
    labels = {"stage": "upsert", "lane": "online"}
    return (get("embedstream_stage_duration_seconds_sum", labels) or 0.0,
            get("embedstream_stage_duration_seconds_count", labels) or 0.0,
            get("embedstream_batch_size_sum", {"lane": "online"}) or 0.0)


def _index_equals_table(rig: dict, timeout_s: float = 120.0) -> str:
    """Once the bridge and the online lane have caught up: "yes" when the collection holds exactly the table's
    chunks (text, status) for the table's rows, else what differs. Backlog documents are not the table's."""
    wanted = rig["rows"].expected(rig["pg"].dsn)
    end = time.monotonic() + timeout_s
    while True:
        try:
            points = rig["store"].scroll(rig["collection"])
        except CollectionNotFound:  # the first write creates it
            points = []
        have = {p.id: (p.payload.get("doc_id"), p.payload.get("chunk_id"), p.payload.get("text"),
                       p.payload.get("status")) for p in points if str(p.payload.get("doc_id")).isdigit()}
        if have == wanted or time.monotonic() > end:
            break
        time.sleep(0.5)
    if have == wanted:
        return "yes"
    stale = len(set(have) - set(wanted))
    missing = len(set(wanted) - set(have))
    differ = sum(1 for pid in set(have) & set(wanted) if have[pid] != wanted[pid])
    return f"no: {missing} missing, {stale} stale, {differ} differ"


def run(rates: list[float] | None = None, step_s: float = 10.0, backlog_docs: int = 400, port: int = 9092,
        pg_port: int = 5432, rest_port: int = 8083, target_ms: float = 1000.0, out_dir: str = "bench-results",
        model: str = "all-MiniLM-L6-v2", mixes: list[str] | None = None) -> CdcBenchResult:
    """``rates``: for every mix (None: each mix's own, ``MIXES``); ``backlog_docs`` 0: idle steps only."""
    from embedstream.engine.engine import Engine
    from embedstream.vectorstore.factory import open_store

    check_mixes(mixes)
    work = tempfile.mkdtemp(prefix="embedstream-bench-cdc-")
    os.chmod(work, 0o755)  # PostgreSQL runs as 'postgres' when we are root
    with devkafka.borrowed(port=port) as broker:  # a broker started for the bench is stopped however it ends
        bootstrap = broker.bootstrap
        pg = postgres.start(pg_port, os.path.join(work, "pg"))
        info = connect.start(bootstrap, rest_port, os.path.join(work, "connect"))
        try:
            plan = [(mix, tuple(rates) if rates else MIXES[mix]) for mix in (mixes or list(MIXES))]
            return _run(bootstrap, pg, info, plan, step_s, backlog_docs, target_ms, out_dir, model, Engine,
                        lambda: open_store(None, None, os.path.join(work, "qdrant-edge")))
        finally:
            connect.stop(rest_port, os.path.join(work, "connect"))
            postgres.stop(pg_port, os.path.join(work, "pg"), mode="immediate")
            shutil.rmtree(work, ignore_errors=True)


def check_mixes(mixes: list[str] | None) -> None:
    """ValueError naming what is wrong when ``mixes`` names a mix this bench does not know."""
    unknown = set(mixes or ()) - set(MIXES)
    if unknown:
        raise ValueError(f"unknown mix {', '.join(sorted(unknown))}; choose from {', '.join(MIXES)}")


def _run(bootstrap, pg, info, plan, step_s, backlog_docs, target_ms, out_dir, model, engine_cls, new_store):
    import psycopg

    tag = uuid.uuid4().hex[:6]
    table = f"bench_{tag}"
    settings = Settings()
    engine = engine_cls.from_name(model, settings)
    chunker = Chunker.for_model(engine.spec, 200, 32)
    rows = _Rows(table, chunker)
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, title text, body text, status text)")
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, %s)",
                            [(i, r["title"], r["body"], r["status"]) for i, r in rows.rows.items()])
    config = connect.debezium_config(pg, f"public.{table}", f"bench{tag}")
    k = settings.kafka
    prefix = f"cdcb-{tag}"
    k.bootstrap_servers = bootstrap
    k.topic_chunks_online, k.topic_chunks_bulk = f"{prefix}.chunks.online", f"{prefix}.chunks.bulk"
    k.topic_queries, k.topic_replies, k.topic_dead_letters = f"{prefix}.queries", f"{prefix}.replies", f"{prefix}.dlq"
    k.topic_rerank, k.topic_search, k.topic_documents = f"{prefix}.rerank", f"{prefix}.search", f"{prefix}.documents"
    k.group_online, k.group_bulk, k.group_cdc = f"{prefix}-online", f"{prefix}-bulk", f"{prefix}-cdc"
    settings.qdrant.versioned_collections = False
    ensure_topics(k, partitions=1, topics=[connect.topic_for(config), *all_topics(k)])
    store = new_store()
    worker = build_embed_worker(settings, ("online", "bulk"), store=store, engine=engine)
    bridge = CdcBridge(settings, chunker, CdcOptions(connect.topic_for(config), CONFIG))
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

    rig = {"pg": pg, "rows": rows, "store": store, "worker": worker, "collection": collection, "stamps": stamps,
           "backlog_left": backlog_left}
    result = CdcBenchResult(cpu_line(), info.versions, target_ms)
    counter = [0]
    try:
        print(f"  snapshot of {len(rows.rows)} rows ...", flush=True)
        print(f"  snapshot indexed (index equals table): {_index_equals_table(rig, timeout_s=1200)}", flush=True)
        for mix, rates in plan:
            for backlog in (False, True) if backlog_docs else (False,):
                for rate in rates:
                    if backlog:
                        with ChunkPublisher(k, lane="bulk", record_documents=False) as publisher:
                            publisher.publish_documents(documents(backlog_docs, seed=int(rate)), chunker)
                    result.steps.append(_step(rig, mix, rate, step_s, backlog, counter))
                    s = result.steps[-1]
                    print(f"  {mix:8s} {'backlog' if backlog else 'idle   '} {rate:6.1f}/s: p50 {s.p50_ms:7.0f} ms  "
                          f"p95 {s.p95_ms:7.0f} ms  forward/change {s.forward_per_change:5.2f}  "
                          f"({s.seen}/{s.changes} seen)", flush=True)
            result.index_equals_table[mix] = _index_equals_table(rig)
            print(f"  {mix}: index equals table: {result.index_equals_table[mix]}", flush=True)
    finally:
        stamps.stop.set()
        for w in (bridge, worker):
            w.stop()
        for t in threads:
            t.join(60)
        lag.close()
        store.close()
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


def highest_rate(result: CdcBenchResult, mix: str, backlog: bool, target_ms: float | None = None) -> float | None:
    target = result.target_ms if target_ms is None else target_ms
    ok = [s.rate for s in result.steps if s.mix == mix and s.backlog == backlog and s.p95_ms <= target
          and s.seen == s.changes and s.achieved >= 0.9 * s.rate]
    return max(ok) if ok else None


def print_table(result: CdcBenchResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"CDC freshness by change mix: COMMIT -> readable in Qdrant ({result.versions})")
    for col in ("mix", "load", "rate/s", "achieved/s", "changes", "seen", "p50 ms", "p95 ms", "p99 ms", "forward/change",
                "debezium", "bridge", "embed", "write", "backlog left"):
        table.add_column(col, justify="right")
    for s in result.steps:
        parts = [s.debezium_ms, s.bridge_ms, s.embed_ms, s.write_ms]
        total = sum(p for p in parts if p == p) or float("nan")
        shares = [f"{p:.0f} ms ({100 * p / total:.0f}%)" if p == p else "-" for p in parts]
        table.add_row(s.mix, "bulk backlog" if s.backlog else "idle", f"{s.rate:g}", f"{s.achieved:.0f}",
                      str(s.changes), str(s.seen),
                      f"{s.p50_ms:.0f}", f"{s.p95_ms:.0f}", f"{s.p99_ms:.0f}", f"{s.forward_per_change:.2f}", *shares,
                      "" if s.backlog_left is None else str(s.backlog_left))
    console = Console(width=max(160, Console().width))
    console.print(table)
    for mix in dict.fromkeys(s.mix for s in result.steps):
        for backlog in dict.fromkeys(s.backlog for s in result.steps if s.mix == mix):
            best = highest_rate(result, mix, backlog)
            console.print(f"{mix} ({'bulk backlog' if backlog else 'idle'}): highest rate with p95 <= "
                          f"{result.target_ms:.0f} ms (and achieved): {best if best is not None else 'none of those measured'}")
        console.print(f"{mix}: index equals table: {result.index_equals_table.get(mix, '-')}")
    console.print(f"host: {result.cpu}\ntable: {result.table}\nplot: {result.png}", highlight=False, markup=False)


def plot(result: CdcBenchResult, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = list(dict.fromkeys(s.mix for s in result.steps))
    fig, axes = plt.subplots(1, len(mixes), figsize=(5 * len(mixes), 4), squeeze=False)
    for ax, mix in zip(axes[0], mixes):
        for backlog, style in ((False, "-"), (True, "--")):
            steps = [s for s in result.steps if s.mix == mix and s.backlog == backlog]
            for q in ("p50", "p95", "p99"):
                if steps:
                    ax.plot([s.rate for s in steps], [getattr(s, f"{q}_ms") for s in steps], style, marker="o",
                            label=f"{q} {'bulk backlog' if backlog else 'idle'}")
        ax.axhline(result.target_ms, color="grey", linewidth=0.8)
        ax.set_xlabel("row changes per second")
        ax.set_ylabel("COMMIT -> readable (ms)")
        ax.set_title(f"{mix}")
        ax.legend(fontsize=7)
    fig.suptitle("embedstream CDC freshness by change mix")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
