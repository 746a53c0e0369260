"""`embedstream bench fleet`: what the bulk lane's consumer group changes cost, per rebalance protocol, on a
3-broker cluster, while the online lane answers queries.

Per protocol (``KafkaSettings.group_protocol``: ``consumer`` = KIP-848, ``cooperative-sticky``, ``eager``):

* phase 1, dynamic members (session timeout 6 s): worker A drains a bulk backlog that a producer keeps at
  about ``--backlog`` chunks not yet committed; **scale 1 → 3** (B and C start), **scale 3 → 1** (B and C stop, SIGTERM), **kill -9** of one of
  two members (B started again, then killed);
* phase 2, static members (``group_instance_id``, session timeout 180 s): two workers drain another backlog;
  **rolling restart**: each stopped and started again under its id, one after the other.

Every worker is a real ``embedstream worker embed --lanes bulk`` process (librdkafka consumers, so all three
protocols run on the same client) with its own embedded store (no Qdrant server here: the index is the union
of the stores by point id, what one shared collection holds after idempotent upserts) and
``skip_unchanged`` off, so every redelivered chunk is embedded again and counted. An online worker process
answers 10 queries/s throughout; the bulk workers run at niceness 10 (on one host they would otherwise take
the CPU the online lane needs, which separate machines do not).

Per event: **pause s**, the longest stretch without the group's committed offsets moving at all (all of the
lane stopped); **stall s**, the same for the worst single partition (what moved); **query p95**, of the
queries sent during the event; **re-embedded**, chunks embedded during the event beyond those committed
(the workers' counters; a killed worker's last scrape, 0.5 s old at most). **lost**, per phase and exact:
records below the group's committed offsets that no store holds (the phase's rows repeat it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from embedstream import devkafka
from embedstream.bench.fleet_rig import Progress, QueryLoad, window_p
from embedstream.config import KafkaSettings

PROTOCOLS = ("consumer", "cooperative-sticky", "eager")
PARTITIONS = 6  # three members hold two each
DYNAMIC_SESSION_MS = 6_000
STATIC_SESSION_MS = 180_000  # longer than a worker's restart on a busy 2-vCPU host: its partitions wait for it
SETTLE_S = 20.0  # an event's window runs this long after the change took effect
BULK_NICE = 10  # bulk workers yield the CPU to the online one, as on separate machines (``bench pipeline``'s default)


@dataclass
class EventRow:
    event: str
    protocol: str
    pause_s: float
    stall_s: float
    query_p95_ms: float | None
    lost: int
    re_embedded: int
    note: str = ""


@dataclass
class FleetResult:
    cpu: str
    rows: list[EventRow] = field(default_factory=list)
    totals: dict[str, dict] = field(default_factory=dict)


class _Worker:
    """One ``embedstream worker embed`` process with its own store, log and metrics port."""

    def __init__(self, name: str, lanes: str, env: dict, root: Path, metrics_port: int, nice: int = 0):
        self.name, self.lanes, self.env, self.root, self.metrics_port = name, lanes, env, root, metrics_port
        self.nice = nice
        self.store = root / f"store-{name}"
        self.log = root / f"worker-{name}.log"
        self.proc: subprocess.Popen | None = None
        self.embedded = 0.0  # last scrape of embedstream_texts_total{kind="chunk"}

    def start(self) -> _Worker:
        env = dict(self.env, EMBEDSTREAM_QDRANT__PATH=str(self.store))
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", self.lanes, "--no-search",
                 "--metrics-port", str(self.metrics_port)],
                env=env, cwd=str(self.root), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def assigned(self, since: int = 0) -> bool:
        """The worker logged a partition assignment after byte ``since`` of its log."""
        return self.logged(b"partitions assigned", since)

    def logged(self, what: bytes, since: int = 0) -> bool:
        with open(self.log, "rb") as fh:
            fh.seek(since)
            return what in fh.read()

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def scrape(self) -> float:
        import re

        try:
            body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        except Exception:  # noqa: BLE001 - not serving yet, or dying: the last value stands
            return self.embedded
        found = re.findall(r'^embedstream_texts_total\{[^}]*kind="chunk"[^}]*\} (\S+)$', body, re.M)
        self.embedded = sum(float(v) for v in found) if found else self.embedded
        return self.embedded

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


class _Scraper:
    """Scrapes every worker's counter twice a second (a killed one keeps its last value)."""

    def __init__(self):
        self.workers: list[_Worker] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-scrape", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            for worker in list(self.workers):
                if worker.alive():
                    worker.scrape()

    def total(self) -> float:
        return sum(w.embedded for w in self.workers)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def _settings(bootstrap: str, prefix: str, protocol: str, client: str) -> KafkaSettings:
    return KafkaSettings(bulk_client=client,
        bootstrap_servers=bootstrap, topic_chunks_online=f"{prefix}.chunks.online", topic_chunks_bulk=f"{prefix}.chunks.bulk",
        topic_queries=f"{prefix}.queries", topic_replies=f"{prefix}.replies", topic_dead_letters=f"{prefix}.dlq",
        topic_documents=f"{prefix}.documents", group_online=f"{prefix}-online", group_bulk=f"{prefix}-bulk",
        group_protocol=protocol)


def _env(k: KafkaSettings, **extra: str) -> dict:
    """A worker's environment: the bench's topics and groups (as ``bench pipeline``'s), the protocol and client
    measured, and every redelivered chunk embedded again (counted)."""
    from embedstream.bench.pipeline_bench import _env as pipeline_env
    from embedstream.config import Settings

    env = pipeline_env(Settings(kafka=k), k.group_bulk.removesuffix("-bulk"), None, "docs", threads=1)
    env.update({
        "EMBEDSTREAM_KAFKA__TOPIC_DOCUMENTS": k.topic_documents,
        "EMBEDSTREAM_KAFKA__GROUP_PROTOCOL": k.group_protocol,
        "EMBEDSTREAM_KAFKA__BULK_CLIENT": k.bulk_client,
        "EMBEDSTREAM_KAFKA__CREATE_TOPICS": "false",
        "EMBEDSTREAM_WORKER__SKIP_UNCHANGED": "false",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
    })
    env.update(extra)
    return env


class _Feeder:
    """Keeps a bulk backlog of about ``backlog`` chunks not yet committed by the group (so every event happens
    mid-backlog whatever the host's speed), adding at most ``rate`` chunks/s."""

    def __init__(self, k: KafkaSettings, prefix: str, backlog: int, rate: float, progress: Progress):
        from embedstream.producers.publisher import ChunkPublisher

        self.publisher = ChunkPublisher(k, lane="bulk", create_topics=False, record_documents=False)
        self.prefix, self.backlog, self.rate, self.progress, self.sent = prefix, backlog, rate, progress, 0
        self._stop = threading.Event()
        for _ in range(backlog):
            self._one()
        self.publisher.flush(120)
        self._thread = threading.Thread(target=self._run, name="fleet-feeder", daemon=True)
        self._thread.start()

    def _one(self) -> None:
        from embedstream.schemas import ChunkEvent

        i = self.sent
        words = " ".join(f"w{(i * 7 + j * 13) % 997}" for j in range(24))
        self.publisher.publish_chunk(ChunkEvent(doc_id=f"{self.prefix}-{i // 4}", chunk_id=i % 4,
                                                text=f"chunk {i}: {words}"))
        self.sent += 1

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            committed = sum(self.progress.samples[-1][1]) if self.progress.samples else 0
            for _ in range(min(int(self.rate), max(0, self.backlog - (self.sent - committed)))):
                self._one()
            self.publisher.flush(30)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.publisher.flush(120)


def _wait(predicate, timeout_s: float, what: str, workers: list[_Worker] = ()) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        for worker in workers:
            if worker.proc is not None and not worker.alive() and worker.proc.returncode not in (-9, 0):
                raise RuntimeError(f"worker {worker.name} exited {worker.proc.returncode}; see {worker.log}")
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.25)


def _lost(k: KafkaSettings, progress: Progress, workers: list[_Worker]) -> tuple[int, int]:
    """(records below the committed offsets no store holds, points in the union of the stores)."""
    from kafka import KafkaConsumer

    from embedstream.schemas import ChunkEvent
    from embedstream.schemas.codec import decode
    from embedstream.vectorstore.edge_store import EdgeStore
    from embedstream.workers.sink import point_id

    committed = dict(zip(progress.partitions, progress.offsets()))
    wanted: set = set()
    reader = KafkaConsumer(**k.client_kwargs(), enable_auto_commit=False, auto_offset_reset="earliest",
                           fetch_max_wait_ms=50)
    reader.assign(list(committed))
    reader.seek_to_beginning()
    left = {tp for tp, end in committed.items() if end > 0}
    deadline = time.monotonic() + 300
    while left and time.monotonic() < deadline:
        for tp, records in reader.poll(timeout_ms=500).items():
            for record in records:
                if record.offset < committed[tp]:
                    event = decode(record.value, ChunkEvent)
                    wanted.add(point_id(event.doc_id, event.chunk_id))
                if record.offset >= committed[tp] - 1:
                    left.discard(tp)
    reader.close()
    union: set = set()
    for store_dir in {w.store for w in workers}:
        if store_dir.exists():
            store = EdgeStore(store_dir)
            try:
                name = store.get_alias("docs") or "docs"  # the workers create docs_v1 behind the alias docs
                if store.collection_exists(name):
                    union |= {p.id for p in store.scroll(name)}
            finally:
                store.close()
    return len(wanted - union), len(union)


def _event(rows: list, name: str, protocol: str, progress: Progress, load: QueryLoad, scraper: _Scraper,
           start: float, end: float, embedded_at_start: float, committed_at_start: int, note: str = "") -> None:
    re_embedded = (scraper.total() - embedded_at_start) - (progress.committed() - committed_at_start)
    p95 = window_p(load.outcomes, start, end, 95)
    rows.append(EventRow(name, protocol, progress.longest_pause(start, end), progress.longest_stall(start, end),
                         None if p95 is None else p95 * 1000, 0, max(0, int(round(re_embedded))), note))


def run_protocol(bootstrap: str, protocol: str, client: str, root: Path, metrics_base: int, rate: float,
                 initial: int, query_rate: float, say=print) -> tuple[list[EventRow], dict]:
    from embedstream.producers.query_client import QueryClient
    from embedstream.producers.topics import ensure_topics

    prefix = f"fleet-{protocol[:4]}-{uuid.uuid4().hex[:6]}"
    k = _settings(bootstrap, prefix, protocol, client)
    label = protocol if client == "librdkafka" else f"{protocol} (kafka-python)"
    ensure_topics(k, PARTITIONS)
    ports = iter(range(metrics_base, metrics_base + 20))
    scraper = _Scraper()
    rows: list[EventRow] = []
    online = _Worker("online", "online", _env(k), root, next(ports)).start()
    workers: list[_Worker] = []
    feeder = progress = load = queries = None
    try:
        dynamic = _env(k, EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS=str(DYNAMIC_SESSION_MS))
        a = _Worker(f"{protocol}-a", "bulk", dynamic, root, next(ports), BULK_NICE)
        workers.append(a)
        scraper.workers = workers
        progress = Progress(k, k.topic_chunks_bulk, k.group_bulk).start()
        feeder = _Feeder(k, prefix, initial, rate, progress)
        a.start()
        _wait(lambda: a.assigned() and online.assigned(), 600, "worker A and the online worker", [a, online])
        queries = QueryClient(k)
        load = QueryLoad(queries, query_rate, timeout_s=5.0).start()
        time.sleep(10)

        def mark():
            return time.monotonic(), scraper.total(), progress.committed()

        # scale 1 -> 3: the window opens when both new workers have loaded the model and are about to join (a
        # worker's start-up is not the group's doing) and closes SETTLE_S after both hold partitions
        b = _Worker(f"{protocol}-b", "bulk", dynamic, root, next(ports), BULK_NICE)
        c = _Worker(f"{protocol}-c", "bulk", dynamic, root, next(ports), BULK_NICE)
        workers += [b, c]
        b.start(), c.start()
        _wait(lambda: b.logged(b"embed worker started") and c.logged(b"embed worker started"), 600,
              "B and C loaded", workers)
        start, emb, com = mark()
        _wait(lambda: b.assigned() and c.assigned(), 300, "B and C taking partitions", workers)
        time.sleep(SETTLE_S)
        _event(rows, "scale 1 -> 3", label, progress, load, scraper, start, time.monotonic(), emb, com)
        say(_line(rows[-1]))

        start, emb, com = mark()
        for worker in (b, c):
            worker.stop()
        time.sleep(SETTLE_S)
        _event(rows, "scale 3 -> 1", label, progress, load, scraper, start, time.monotonic(), emb, com)
        say(_line(rows[-1]))

        b2 = _Worker(f"{protocol}-b", "bulk", dynamic, root, b.metrics_port, BULK_NICE)  # B's store again
        workers.append(b2)
        since = b.log_size()
        b2.start()
        _wait(lambda: b2.assigned(since), 600, "B back", workers)
        time.sleep(10)
        start, emb, com = mark()
        b2.stop(signal.SIGKILL)
        time.sleep(DYNAMIC_SESSION_MS / 1000 + SETTLE_S)
        _event(rows, "kill -9 of 1 of 2", label, progress, load, scraper, start, time.monotonic(), emb, com,
               note=f"session {DYNAMIC_SESSION_MS / 1000:g} s")
        say(_line(rows[-1]))
        feeder.close()
        _wait(lambda: progress.committed() >= progress.end(), 600, "phase 1's backlog drained", workers)
        a.scrape()
        a.stop()  # its store is read next
        lost, points = _lost(k, progress, workers)
        for row in rows:
            row.lost = lost
        totals = {"phase 1": {"records": progress.end(), "points": points, "lost": lost,
                              "embedded": round(scraper.total())}}
        progress.close()

        # phase 2: static members, a rolling restart
        k2 = _settings(bootstrap, prefix + "s", protocol, client)
        ensure_topics(k2, PARTITIONS, topics=[k2.topic_chunks_bulk])
        static = {"EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS": str(STATIC_SESSION_MS)}
        progress = Progress(k2, k2.topic_chunks_bulk, k2.group_bulk).start()
        feeder = _Feeder(k2, prefix + "s", initial, rate, progress)
        phase2 = [_Worker(f"{protocol}-s{i}", "bulk", _env(k2, **static, EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID=f"s{i}"),
                          root, next(ports), BULK_NICE) for i in (1, 2)]
        scraper.workers = phase2
        for worker in phase2:
            worker.start()
        _wait(lambda: all(w.assigned() for w in phase2), 600, "the static members", phase2)
        time.sleep(10)
        start, emb, com = mark()
        for i, worker in enumerate(list(phase2)):
            worker.stop()
            again = _Worker(worker.name, "bulk", worker.env, root, worker.metrics_port, BULK_NICE)
            phase2.append(again)
            since = worker.log_size()
            again.start()
            _wait(lambda: again.alive() and _consuming(again, since), 300, f"{worker.name} back", phase2)
        time.sleep(SETTLE_S)
        _event(rows, "rolling restart (static)", label, progress, load, scraper, start, time.monotonic(), emb, com,
               note=f"2 members, session {STATIC_SESSION_MS / 1000:g} s")
        say(_line(rows[-1]))
        feeder.close()
        _wait(lambda: progress.committed() >= progress.end(), 600, "phase 2's backlog drained", phase2)
        for worker in phase2:
            if worker.alive():
                worker.scrape()
            worker.stop()
        lost2, points2 = _lost(k2, progress, phase2)
        rows[-1].lost = lost2
        totals["phase 2"] = {"records": progress.end(), "points": points2, "lost": lost2,
                             "embedded": round(scraper.total())}
        outcomes = load.stop()
        totals["queries"] = {kind: sum(1 for o in outcomes if o.kind == kind) for kind in {o.kind for o in outcomes}}
        return rows, totals
    finally:
        for worker in [*workers, *(phase2 if "phase2" in locals() else []), online]:
            worker.stop(signal.SIGKILL if not worker.alive() else signal.SIGTERM, timeout_s=30)
        if load is not None:
            load.stop(settle_s=0)
        if queries is not None:
            queries.close()
        if feeder is not None:
            feeder.close()
        if progress is not None:
            progress.close()
        scraper.close()


def _line(row: EventRow) -> str:
    p95 = "-" if row.query_p95_ms is None else f"{row.query_p95_ms:.0f} ms"
    return (f"  {row.event} [{row.protocol}]: pause {row.pause_s:.1f} s, stall {row.stall_s:.1f} s, query p95 {p95}, "
            f"re-embedded {row.re_embedded}")


def _consuming(worker: _Worker, since: int) -> bool:
    """A restarted static member is back: it was assigned its partitions again (no rebalance: they wait for it)
    or its counter moved."""
    return worker.assigned(since) or worker.scrape() > 0


def run(port: int, data_dir: str | None, protocols: list[str], rate: float, initial: int, query_rate: float,
        clients: list[str] = ("librdkafka",), say=print, out: Path | None = None) -> FleetResult:
    from embedstream.bench.latency_bench import cpu_line

    result = FleetResult(cpu_line())
    with devkafka.borrowed(port=port, data_dir=data_dir, brokers=3) as info, \
            tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        runs = [(p, c) for c in clients for p in protocols if not (p == "consumer" and c == "kafka-python")]
        for i, (protocol, client) in enumerate(runs):
            root = Path(tmp) / f"{protocol}-{client}"
            root.mkdir()
            try:
                rows, totals = run_protocol(info.bootstrap, protocol, client, root, port + 10 + 20 * (i % 4), rate,
                                            initial, query_rate, say)
            except RuntimeError as exc:  # one protocol's failure is its result; the others still run
                say(f"{protocol} ({client}) failed: {exc}")
                result.totals[f"{protocol} ({client})"] = {"failed": str(exc)[:500]}
                continue
            result.rows += rows
            result.totals[rows[0].protocol] = totals
            if out is not None:  # after each run: a long bench that fails later keeps what it measured
                _write(result, out)
    result.cpu = f"{result.cpu}; at the end: {cpu_line()}"
    if out is not None:
        _write(result, out)
    return result


def _write(result: FleetResult, out: Path) -> None:
    import dataclasses
    import json

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dataclasses.asdict(result), indent=2) + "\n")


def print_table(result: FleetResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="bulk lane group changes on a 3-broker cluster (10 queries/s on the online lane)")
    for column in ("event", "protocol", "pause s", "stall s", "query p95 ms", "chunks lost", "chunks re-embedded"):
        table.add_column(column, justify="left" if column in ("event", "protocol") else "right")
    for row in result.rows:
        table.add_row(row.event, row.protocol, f"{row.pause_s:.1f}", f"{row.stall_s:.1f}",
                      "-" if row.query_p95_ms is None else f"{row.query_p95_ms:.0f}", str(row.lost),
                      str(row.re_embedded))
    console = Console(width=max(Console().width, 120))  # a table that wraps in a log is unreadable
    console.print(table)
    for protocol, totals in result.totals.items():
        console.print(f"{protocol}: {totals}")
    console.print(result.cpu)
