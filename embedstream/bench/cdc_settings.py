"""`embedstream bench cdc-settings`: what each latency setting of the CDC rig buys, Debezium's part alone.

One run, one rig (dev PostgreSQL, Kafka Connect + Debezium, the broker); per variant a table of its own and a
connector for it with the rig's settings (``devcdc.connect.debezium_config``) and one thing changed: a connector
property (``poll.interval.ms``, Connect's producer linger through ``producer.override.linger.ms``) or a setting of
the writers' PostgreSQL sessions (``synchronous_commit``). The writers (:mod:`embedstream.bench.cdc_writers`)
update rows at a rate; per change: the UPDATE's round trip, ``capture`` = COMMIT returned -> the connector read
the change (the record's ``ts_us``), ``connect`` -> the record appended to its topic (``LogAppendTime``: the
broker's clock), and the sum. Per variant also the Connect JVM's CPU with the connector idle and while changes
flow (``/proc``: Linux). No bridge, no embed worker: ``bench cdc`` measures the whole way.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as RdPartition
from kafka import KafkaAdminClient

from embedstream import devkafka
from embedstream.bench.cdc_writers import Writers
from embedstream.bench.latency_bench import cpu_line
from embedstream.devcdc import connect, postgres

ROWS = 2000


@dataclass(frozen=True)
class Variant:
    name: str
    connector: dict[str, str] = field(default_factory=dict)  # connector properties over the rig's
    session: dict[str, str] = field(default_factory=dict)  # the writers' PostgreSQL session settings


# The rig's settings (synchronous_commit on, poll.interval.ms 10, Connect's producer linger 0), then each of
# them undone or moved, one at a time.
VARIANTS = (
    Variant("rig"),
    Variant("synchronous_commit off", session={"synchronous_commit": "off"}),
    Variant("poll 500 ms (default)", {"poll.interval.ms": "500"}),
    Variant("poll 100 ms", {"poll.interval.ms": "100"}),
    Variant("poll 5 ms", {"poll.interval.ms": "5"}),
    Variant("poll 1 ms", {"poll.interval.ms": "1"}),
    Variant("linger 5 ms (default)", {"producer.override.linger.ms": "5"}),
    Variant("rig, again"),  # the first row, measured again at the end: how much the host moved meanwhile
)
WARM_UP_S = 3.0  # changes through a first connector, not reported: Connect's JIT compiles Debezium's streaming path


@dataclass
class SettingRow:
    variant: str
    rate: float
    committed: float  # per second
    changes: int
    found: int  # changes whose record was found in Kafka
    round_trip_ms: tuple[float, float]  # the UPDATE, p50 / p95
    capture_ms: tuple[float, float]
    connect_ms: tuple[float, float]
    total_ms: tuple[float, float]
    jvm_idle_pct: float  # of one core
    jvm_busy_pct: float
    load: tuple[float, float, float]


@dataclass
class SettingsResult:
    cpu: str
    versions: str
    writers: int
    rows: list[SettingRow] = field(default_factory=list)
    table: str = ""


def create_change_topic(bootstrap: str, topic: str) -> None:
    """A connector's topic, created before it starts: its records are stamped with the broker's clock when
    appended (``LogAppendTime``), so a change's way into Kafka ends when it is in the log."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="embedstream-bench-cdc")
    try:
        admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1,
                                     "configs": {"message.timestamp.type": "LogAppendTime"}}},
                            timeout_ms=30_000, wait_for_metadata=True)
    finally:
        admin.close()


def jvm_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(rate: float = 200.0, step_s: float = 10.0, idle_s: float = 10.0, writers: int = 4, port: int = 9092,
        pg_port: int = 5432, rest_port: int = 8083, out_dir: str = "bench-results",
        variants: tuple[Variant, ...] = VARIANTS) -> SettingsResult:
    work = tempfile.mkdtemp(prefix="embedstream-bench-cdc-settings-")
    os.chmod(work, 0o755)  # PostgreSQL runs as 'postgres' when we are root
    with devkafka.borrowed(port=port) as broker:
        pg = postgres.start(pg_port, os.path.join(work, "pg"))
        info = connect.start(broker.bootstrap, rest_port, os.path.join(work, "connect"))
        try:
            result = SettingsResult(cpu_line(), info.versions, writers)
            _measure(broker.bootstrap, pg, info, variants[0], rate, WARM_UP_S, 0.0, writers)
            for variant in variants:
                result.rows.append(_measure(broker.bootstrap, pg, info, variant, rate, step_s, idle_s, writers))
                row = result.rows[-1]
                print(f"  {variant.name:24s} COMMIT -> Kafka p50 {row.total_ms[0]:6.1f} ms  p95 {row.total_ms[1]:6.1f} ms"
                      f"  JVM idle {row.jvm_idle_pct:4.1f}%  load {row.load[0]:.1f}", flush=True)
        finally:
            connect.stop(rest_port, os.path.join(work, "connect"))
            postgres.stop(pg_port, os.path.join(work, "pg"), mode="immediate")
            shutil.rmtree(work, ignore_errors=True)
    os.makedirs(out_dir, exist_ok=True)
    result.table = os.path.join(out_dir, f"cdc-settings-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(result.table, "w") as fh:
        json.dump(asdict(result), fh, indent=2)
    return result


def _measure(bootstrap: str, pg, info, variant: Variant, rate: float, step_s: float, idle_s: float,
             writer_count: int) -> SettingRow:
    import psycopg

    tag = uuid.uuid4().hex[:6]
    table = f"settings_{tag}"
    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, status text)")
        conn.execute(f"INSERT INTO {table} SELECT g, 'new' FROM generate_series(1, {ROWS}) g")
    config = connect.debezium_config(pg, f"public.{table}", f"settings{tag}", extra=variant.connector)
    topic = connect.topic_for(config)
    create_change_topic(bootstrap, topic)
    connect.register(info, f"settings{tag}", config)
    found: dict[str, tuple[float, float]] = {}  # status -> (Debezium's ts, appended)
    stop = threading.Event()
    reader = threading.Thread(target=_read, args=(bootstrap, topic, found, stop), daemon=True)
    reader.start()
    writers = Writers(pg.dsn, writer_count, session=variant.session)
    try:
        time.sleep(5.0)  # the connector settles into streaming
        before = jvm_cpu_s(info.pid)
        time.sleep(idle_s)
        idle = (jvm_cpu_s(info.pid) - before) / idle_s if idle_s else float("nan")
        before, start = jvm_cpu_s(info.pid), time.monotonic()
        sent = 0
        while time.monotonic() - start < step_s:
            time.sleep(max(0.0, start + sent / rate - time.monotonic()))
            sent += 1
            writers.submit(f"s{sent}", f"UPDATE {table} SET status = %s WHERE id = %s", (f"s{sent}", sent % ROWS + 1))
        busy = (jvm_cpu_s(info.pid) - before) / (time.monotonic() - start)
        ended = time.time()
        commits = writers.drain()
        deadline = time.monotonic() + 30
        while any(key not in found for key in commits) and time.monotonic() < deadline:
            time.sleep(0.05)
        round_trips = [writers.round_trips[k] * 1000 for k in commits]
    finally:
        writers.close()
        stop.set()
        reader.join(10)
        connect.unregister(info, f"settings{tag}")
        _drop(pg, config["slot.name"], table)
    spans = np.array([[found[k][0] - t0, found[k][1] - found[k][0]] for k, t0 in commits.items() if k in found]) * 1000
    committed = sum(1 for t0 in commits.values() if t0 <= ended) / step_s

    def p(values) -> tuple[float, float]:
        return (float(np.percentile(values, 50)), float(np.percentile(values, 95))) if len(values) else (np.nan, np.nan)

    return SettingRow(variant.name, rate, committed, len(commits), len(spans),
                      p(round_trips), p(spans[:, 0] if len(spans) else []), p(spans[:, 1] if len(spans) else []),
                      p(spans.sum(axis=1) if len(spans) else []), 100 * idle, 100 * busy, os.getloadavg())


def _read(bootstrap: str, topic: str, found: dict, stop: threading.Event) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"embedstream-bench-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    consumer.assign([RdPartition(topic, 0, OFFSET_BEGINNING)])
    while not stop.is_set():
        for message in consumer.consume(500, 0.1):
            if message.error() or not message.value():
                continue
            value = json.loads(message.value())
            after = value.get("after") or {}
            read = value["ts_us"] / 1e6 if value.get("ts_us") else value.get("ts_ms", 0) / 1e3
            found.setdefault(str(after.get("status")), (read, message.timestamp()[1] / 1000.0))
    consumer.close()


def _drop(pg, slot: str, table: str) -> None:
    import psycopg

    with psycopg.connect(pg.dsn, autocommit=True) as conn:
        for _ in range(50):
            try:
                conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                             (slot,))
                break
            except psycopg.errors.ObjectInUse:  # the task is still stopping
                time.sleep(0.2)
        conn.execute(f"DROP TABLE {table}")


def print_table(result: SettingsResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"COMMIT -> change record in Kafka by setting ({result.versions}, {result.writers} writers): "
                        "p50 / p95 ms; the rig: synchronous_commit on, poll.interval.ms 10, Connect producer linger 0; "
                        "Connect CPU: % of one core")
    for col in ("variant", "rate/s", "committed/s", "found", "UPDATE", "capture", "connect", "COMMIT -> Kafka",
                "CPU idle", "CPU busy", "load"):
        table.add_column(col, justify="right")
    for r in result.rows:
        table.add_row(r.variant, f"{r.rate:g}", f"{r.committed:.0f}", f"{r.found}/{r.changes}",
                      *(f"{a:.2f} / {b:.2f}" if i == 0 else f"{a:.1f} / {b:.1f}"
                        for i, (a, b) in enumerate((r.round_trip_ms, r.capture_ms, r.connect_ms, r.total_ms))),
                      f"{r.jvm_idle_pct:.1f}", f"{r.jvm_busy_pct:.1f}", f"{r.load[0]:.1f}")
    console = Console(width=max(160, Console().width))
    console.print(table)
    console.print(f"host: {result.cpu}\ntable: {result.table}", highlight=False, markup=False)
