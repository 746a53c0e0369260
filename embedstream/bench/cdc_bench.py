"""`embedstream bench cdc`: freshness and cost of the CDC path by change mix, from a row's COMMIT in PostgreSQL to
the change being readable in the vector store, on the real rig (dev PostgreSQL, Kafka Connect + Debezium, the
bridge and an embed worker on both lanes, the embedded Qdrant (qdrant-edge) in a temporary folder: the
production store of a single-node deployment; qdrant-client's ``:memory:`` mode scans every point for each
filtered call, 250 ms at 3,000 points on this host, so it measured itself rather than the pipeline).

Mixes (``--mix``): ``flips`` set a short row's status (a metadata-only change: a payload write, no forward
pass), ``long-flips`` a 20 KB row's (TOASTed: Debezium sends a placeholder for the body, which the bridge
fills in from the documents log); ``edits`` rewrite one sentence in the middle of a 20 KB row (the chunks
around it are embedded again); ``rewrites`` replace a short row's whole text. Rows are changed at stepped rates
(open loop: changes spread evenly over the step, a row changed again only once its last change is visible) by
several writer processes (``--writers``), each on its own connection committing one UPDATE per transaction
(:mod:`embedstream.bench.cdc_writers`). Each change writes a fresh marker (the status, the edited sentence, the
new title) and a reader polls the point that must show it.

Per change, the stages (``STAGES``), each from clocks on this host: ``debezium`` COMMIT returned (the writer) ->
the connector read the change (the record's ``ts_us``); ``kafka`` -> the record appended to the change topic
(created with ``LogAppendTime``: the broker's clock); ``bridge`` -> the chunk event published (its
timestamp); ``worker`` -> the embed worker's store write that carries the change begins (consumed, batched,
looked up, embedded when it must be); ``write`` -> that write returns (``wait=true``); ``searchable`` -> the
reader sees it. "ours" is bridge + worker + write + searchable. Per step: p50 / p95 / p99 end to end, p50 /
p95 and share of each stage, forward passes per change (sequences the model ran, from the worker's metrics)
and the load average; per mix the highest rate whose p95 stays under the target, and whether the index then
equals the table (text, metadata, no stale chunk). Steps run idle and while a bulk backlog (documents on the
bulk lane) drains.
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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as RdPartition
from kafka import KafkaConsumer, TopicPartition

from embedstream import devkafka
from embedstream.bench.cdc_settings import create_change_topic
from embedstream.bench.cdc_writers import Writers
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
# A change's way, stage by stage (each ends where the next begins; see the module doc).
STAGES = ("debezium", "kafka", "bridge", "worker", "write", "searchable")
OURS = ("bridge", "worker", "write", "searchable")  # from the change record in Kafka to readable
WRITERS = 4
WARM_UP_S = 3.0  # changes made before each mix's steps, not measured
_OUTSTANDING_PER_WRITER = 8  # changes handed to the writers and not committed yet: more and the step waits
_MARK = re.compile(r"Revision (\d+) ")


@dataclass
class StageStats:
    p50_ms: float
    p95_ms: float
    mean_ms: float


@dataclass
class CdcStep:
    mix: str
    backlog: bool
    rate: float
    writers: int
    achieved: float  # changes committed per second
    changes: int
    seen: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    forward_per_change: float  # sequences the model ran, per change
    stages: dict[str, StageStats]  # STAGES, plus "ours", over the changes every stamp was found for
    timed: int  # changes with every stage's stamps
    load: tuple[float, float, float]  # the host's load average at the step's end
    backlog_left: int | None = None
    # per timed change: seconds from the step's start to its COMMIT, then each of STAGES in ms (the JSON's raw data)
    samples: list[list[float]] = field(default_factory=list)


@dataclass
class CdcBenchResult:
    cpu: str
    versions: str
    target_ms: float
    steps: list[CdcStep] = field(default_factory=list)
    index_equals_table: dict[str, str] = field(default_factory=dict)  # mix -> "yes" or what differs
    table: str = ""
    png: str = ""


def _marks(doc: str, status, text: str) -> list[tuple[str, str]]:
    """The (doc, marker) keys a record or point carries: its status and each ``Revision <n>`` in its text."""
    return [(doc, str(status)), *((doc, n) for n in _MARK.findall(text))]


class _Stamps:
    """Per (doc_id, marker): when Debezium read the change and when its record reached Kafka, and when the bridge
    published its chunk event, from two tailing consumers.

    The marker of a change is its status or the number in its ``Revision <n>`` sentence (title or body); a
    record with several keeps the first time each was seen, so the new one gets this record's."""

    def __init__(self, bootstrap: str, cdc_topic: str, chunk_topic: str):
        self.debezium: dict[tuple[str, str], tuple[float, float]] = {}  # (Debezium's ts, appended to the log)
        self.bridge: dict[tuple[str, str], float] = {}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._tail, args=(bootstrap, topic, out, parse), daemon=True)
                        for topic, out, parse in ((cdc_topic, self.debezium, self._from_change),
                                                  (chunk_topic, self.bridge, self._from_chunk))]
        for t in self.threads:
            t.start()

    @staticmethod
    def _from_change(value: dict, timestamp: float) -> list[tuple[tuple[str, str], tuple[float, float]]]:
        after = value.get("after") or {}
        if not after:
            return []
        read = value["ts_us"] / 1e6 if value.get("ts_us") else value.get("ts_ms", 0) / 1e3
        text = f"{after.get('title') or ''} {after.get('body') or ''}"
        return [(key, (read, timestamp)) for key in _marks(str(after.get("id")), after.get("status"), text)]

    @staticmethod
    def _from_chunk(value: dict, timestamp: float) -> list[tuple[tuple[str, str], float]]:
        if value.get("kind") == "delete":
            return []
        status = (value.get("metadata") or {}).get("status")
        return [(key, timestamp) for key in _marks(str(value.get("doc_id")), status, value.get("text", ""))]

    def _tail(self, bootstrap: str, topic: str, out: dict, parse) -> None:
        # librdkafka: fetching and parsing in native threads, so the readers take little CPU (and GIL) from the
        # bridge and the worker they measure (two kafka-python readers took ~12% of a core at 200 changes/s)
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"embedstream-bench-stamps-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        consumer.assign([RdPartition(topic, 0, OFFSET_BEGINNING)])  # the bench's topics have one partition
        while not self.stop.is_set():
            for message in consumer.consume(500, 0.1):
                if message.error() or not message.value():
                    continue
                try:
                    found = parse(json.loads(message.value()), message.timestamp()[1] / 1000.0)
                except ValueError:
                    continue
                for key, when in found:
                    out.setdefault(key, when)
        consumer.close()


class _TimedStore:
    """The bench's store as the embed worker sees it: the real store, with the time each write that carries a
    change's marker began and returned, per (doc_id, marker) (the first such write)."""

    WRITES = ("upsert", "overwrite_payloads")

    def __init__(self, store):
        self._store = store
        self.writes: dict[tuple[str, str], tuple[float, float]] = {}

    def __getattr__(self, name: str):
        attr = getattr(self._store, name)
        if name not in self.WRITES:
            return attr

        def timed(collection, items, *args, **kwargs):
            began = time.time()
            result = attr(collection, items, *args, **kwargs)
            ended = time.time()
            payloads = items.values() if isinstance(items, Mapping) else (p.payload for p in items)
            for payload in payloads:
                for key in _marks(str(payload.get("doc_id")), payload.get("status"), str(payload.get("text", ""))):
                    self.writes.setdefault(key, (began, ended))
            return result

        return timed


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
    """Change rows at ``rate`` for ``duration_s`` through the writers; wait for each change to be readable (30 s
    at most)."""
    rows: _Rows = rig["rows"]
    writers: Writers = rig["writers"]
    pending: dict[int, tuple] = {}  # doc -> (marker, point id, test): a row's latest change, until readable
    seen: dict[tuple[str, str], float] = {}  # (doc, marker) -> when the reader saw it
    lock = threading.Lock()
    stop = threading.Event()
    store, collection = rig["store"], rig["collection"]
    give_up = [float("inf")]

    def poll_visible() -> None:
        """Every 5 ms, read the points of the pending changes whose store write has returned (a handful: the
        reader takes little CPU from the pipeline it measures); every 100 ms, all of them (a change written
        by a path the timed store does not see is found too, only later)."""
        last_all = 0.0
        while not stop.is_set() or pending:
            everything = time.monotonic() - last_all >= 0.1
            last_all = time.monotonic() if everything else last_all
            with lock:
                items = [(doc, change) for doc, change in pending.items()
                         if everything or (str(doc), change[0]) in store.writes]
            try:
                payloads = store.get_payloads(collection, [pid for _, (_, pid, _) in items]) if items else {}
            except Exception:  # noqa: BLE001 - the collection appears with the first write
                payloads = {}
            now = time.time()
            with lock:
                for doc, (marker, pid, test) in items:
                    if test(payloads.get(pid) or {}) and pending.get(doc, ("",))[0] == marker:
                        pending.pop(doc)
                        seen[(str(doc), marker)] = now
            if stop.is_set() and time.monotonic() > give_up[0]:
                return
            time.sleep(0.005)

    before = _forward_passes(rig["worker"])
    poller = threading.Thread(target=poll_visible, daemon=True)
    poller.start()
    candidates = rows.ids(mix)
    keys: list[tuple[str, str]] = []
    start = time.monotonic()
    while time.monotonic() - start < duration_s:
        time.sleep(max(0.0, start + len(keys) / rate - time.monotonic()))
        if writers.outstanding() >= _OUTSTANDING_PER_WRITER * writers.count:
            time.sleep(0.001)  # the writers are behind: what they commit is the achieved rate
            continue
        first = (counter[0] * 7919) % len(candidates)
        with lock:
            doc = next((d for d in candidates[first:] + candidates[:first] if d not in pending), None)
        if doc is None:  # every row has a change on its way: wait for one to become readable
            time.sleep(0.001)
            continue
        counter[0] += 1
        sql, params, marker, pid, test = rows.change(mix, doc, counter[0])
        with lock:
            pending[doc] = (marker, pid, test)
        keys.append((str(doc), marker))
        writers.submit(keys[-1], sql, params)
    ended = time.time()
    commits = writers.drain()
    give_up[0] = time.monotonic() + 30
    stop.set()
    poller.join(40)
    committed = {key: commits[key] for key in keys if key in commits}
    achieved = sum(1 for t in committed.values() if t <= ended) / duration_s
    total = [(seen[k] - t0) * 1000 for k, t0 in committed.items() if k in seen]
    stamps: _Stamps = rig["stamps"]
    timed_store: _TimedStore = rig["store"]
    spans, samples = [], []
    began = ended - duration_s
    for key, t0 in committed.items():
        dz, br, wr, t1 = stamps.debezium.get(key), stamps.bridge.get(key), timed_store.writes.get(key), seen.get(key)
        if dz and br and wr and t1:
            spans.append(np.diff([t0, dz[0], dz[1], br, wr[0], wr[1], t1]) * 1000)
            samples.append([round(t0 - began, 4), *(round(float(x), 2) for x in spans[-1])])
    left = rig["backlog_left"]() if backlog else None
    forward = (_forward_passes(rig["worker"]) - before) / len(keys) if keys else float("nan")
    return CdcStep(mix, backlog, rate, writers.count, achieved, len(keys), len(total),
                   *(float(np.percentile(total, q)) if total else float("nan") for q in (50, 95, 99)),
                   forward, _stage_stats(np.array(spans)), len(spans), os.getloadavg(), left, samples)


def _stage_stats(spans: np.ndarray) -> dict[str, StageStats]:
    """p50, p95 and mean of each stage (columns in ``STAGES`` order), and of ``OURS`` summed per change."""
    if not len(spans):
        return {}
    ours = spans[:, [STAGES.index(s) for s in OURS]].sum(axis=1)
    columns = {name: spans[:, i] for i, name in enumerate(STAGES)} | {"ours": ours}
    return {name: StageStats(float(np.percentile(v, 50)), float(np.percentile(v, 95)), float(v.mean()))
            for name, v in columns.items()}


def _forward_passes(worker) -> float:
    """The sequences the embed worker's online passes ran so far."""
    return worker.metrics.registry.get_sample_value("embedstream_batch_size_sum", {"lane": "online"}) or 0.0


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
        model: str = "all-MiniLM-L6-v2", mixes: list[str] | None = None, writers: int = WRITERS) -> CdcBenchResult:
    """``rates``: for every mix (None: each mix's own, ``MIXES``); ``backlog_docs`` 0: idle steps only;
    ``writers``: the processes committing the changes."""
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
                        lambda: open_store(None, None, os.path.join(work, "qdrant-edge")), writers)
        finally:
            connect.stop(rest_port, os.path.join(work, "connect"))
            postgres.stop(pg_port, os.path.join(work, "pg"), mode="immediate")
            shutil.rmtree(work, ignore_errors=True)


def check_mixes(mixes: list[str] | None) -> None:
    """ValueError naming what is wrong when ``mixes`` names a mix this bench does not know."""
    unknown = set(mixes or ()) - set(MIXES)
    if unknown:
        raise ValueError(f"unknown mix {', '.join(sorted(unknown))}; choose from {', '.join(MIXES)}")


def _run(bootstrap, pg, info, plan, step_s, backlog_docs, target_ms, out_dir, model, engine_cls, new_store,
         writer_count=WRITERS):
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
    create_change_topic(bootstrap, connect.topic_for(config))
    ensure_topics(k, partitions=1, topics=all_topics(k))
    store = _TimedStore(new_store())
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

    result = CdcBenchResult(cpu_line(), info.versions, target_ms)
    os.makedirs(out_dir, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    result.table = os.path.join(out_dir, f"cdc-{stamp}.json")
    counter = [0]
    writers = None
    try:
        writers = Writers(pg.dsn, writer_count)
        rig = {"pg": pg, "rows": rows, "store": store, "worker": worker, "collection": collection, "stamps": stamps,
               "backlog_left": backlog_left, "writers": writers}
        print(f"  snapshot of {len(rows.rows)} rows ...", flush=True)
        print(f"  snapshot indexed (index equals table): {_index_equals_table(rig, timeout_s=1200)}", flush=True)
        for mix, rates in plan:
            # Not measured: the first changes after the snapshot (or another mix) pay for Connect's JIT compiling
            # Debezium's streaming path and for the first lookups of their rows (p95 ~460 ms in the first 2 s
            # of the first 100/s step, ~60 ms after).
            warm = _step(rig, mix, min(rates), WARM_UP_S, False, counter)
            print(f"  {mix:8s} warm-up  {min(rates):6.1f}/s for {WARM_UP_S:.0f} s: p95 {warm.p95_ms:7.0f} ms "
                  f"(not reported)", flush=True)
            for backlog in (False, True) if backlog_docs else (False,):
                for rate in rates:
                    if backlog:
                        with ChunkPublisher(k, lane="bulk", record_documents=False) as publisher:
                            publisher.publish_documents(documents(backlog_docs, seed=int(rate)), chunker)
                    result.steps.append(_step(rig, mix, rate, step_s, backlog, counter))
                    _save(result)  # after every step: a run cut short keeps what it measured
                    s = result.steps[-1]
                    ours = s.stages.get("ours")
                    print(f"  {mix:8s} {'backlog' if backlog else 'idle   '} {rate:6.1f}/s ({s.achieved:.0f}/s "
                          f"committed): p50 {s.p50_ms:7.0f} ms  p95 {s.p95_ms:7.0f} ms  ours p95 "
                          f"{ours.p95_ms if ours else float('nan'):6.0f} ms  forward/change "
                          f"{s.forward_per_change:5.2f}  ({s.seen}/{s.changes} seen)  load {s.load[0]:.1f}", flush=True)
            result.index_equals_table[mix] = _index_equals_table(rig)
            _save(result)
            print(f"  {mix}: index equals table: {result.index_equals_table[mix]}", flush=True)
    finally:
        if writers is not None:
            writers.close()
        stamps.stop.set()
        for w in (bridge, worker):
            w.stop()
        for t in threads:
            t.join(60)
        lag.close()
        store.close()
        connect.unregister(info, f"bench{tag}")
    result.png = os.path.join(out_dir, f"cdc-{stamp}.png")
    try:
        plot(result, result.png)
    except ImportError as exc:
        result.png = f"none ({exc}; pip install 'embedstream[bench]' for it)"
    return result


def _save(result: CdcBenchResult) -> None:
    with open(result.table, "w") as fh:
        json.dump(asdict(result), fh, indent=2)


def highest_rate(result: CdcBenchResult, mix: str, backlog: bool, target_ms: float | None = None) -> float | None:
    target = result.target_ms if target_ms is None else target_ms
    ok = [s.rate for s in result.steps if s.mix == mix and s.backlog == backlog and s.p95_ms <= target
          and s.seen == s.changes and s.achieved >= 0.9 * s.rate]
    return max(ok) if ok else None


def print_table(result: CdcBenchResult) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(160, Console().width))
    table = Table(title=f"CDC freshness by change mix: COMMIT -> readable in Qdrant ({result.versions})")
    for col in ("mix", "load", "rate/s", "writers", "committed/s", "changes", "seen", "p50 ms", "p95 ms", "p99 ms",
                "ours p95 ms", "forward/change", "load average", "backlog left"):
        table.add_column(col, justify="right")
    for s in result.steps:
        ours = s.stages.get("ours")
        table.add_row(s.mix, "bulk backlog" if s.backlog else "idle", f"{s.rate:g}", str(s.writers), f"{s.achieved:.0f}",
                      str(s.changes), str(s.seen), f"{s.p50_ms:.0f}", f"{s.p95_ms:.0f}", f"{s.p99_ms:.0f}",
                      f"{ours.p95_ms:.0f}" if ours else "-", f"{s.forward_per_change:.2f}",
                      " / ".join(f"{x:.1f}" for x in s.load), "" if s.backlog_left is None else str(s.backlog_left))
    console.print(table)
    stages = Table(title="Where the time goes, per stage: p50 / p95 ms (share of the mean end-to-end latency); "
                         "ours = bridge + worker + write + searchable")
    for col in ("mix", "load", "rate/s", "timed", *STAGES, "ours"):
        stages.add_column(col, justify="right")
    for s in result.steps:
        total = sum(s.stages[name].mean_ms for name in STAGES) if s.stages else float("nan")
        cells = [f"{st.p50_ms:.0f} / {st.p95_ms:.0f} ({100 * st.mean_ms / total:.0f}%)" if (st := s.stages.get(name))
                 else "-" for name in (*STAGES, "ours")]
        stages.add_row(s.mix, "bulk backlog" if s.backlog else "idle", f"{s.rate:g}", f"{s.timed}/{s.seen}", *cells)
    console.print(stages)
    for mix in dict.fromkeys(s.mix for s in result.steps):
        for backlog in dict.fromkeys(s.backlog for s in result.steps if s.mix == mix):
            best = highest_rate(result, mix, backlog)
            console.print(f"{mix} ({'bulk backlog' if backlog else 'idle'}): highest rate with p95 <= "
                          f"{result.target_ms:.0f} ms (and committed): {best if best is not None else 'none of those measured'}")
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
