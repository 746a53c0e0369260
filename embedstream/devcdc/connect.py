"""A Kafka Connect worker (standalone) with the Debezium PostgreSQL connector, for the CDC rig.

The worker's jars come from Maven Central through ``compose/connect-dev/pom.xml`` (the dev broker's
Kafka version, Debezium's connector), cached per version like the broker's; the JVM, the detached
process and the pid handling are the dev broker's (:mod:`embedstream.devkafka`).

Layout of a data dir (default ``~/.cache/embedstream/connect-data/<rest port>``)::

    worker.properties       rewritten on every start
    log4j2.properties       rewritten on every start
    connectors/NAME.json    each registered connector's config; every start registers them all again
    offsets.dat             the connectors' source offsets (the LSN Debezium resumes from)
    connect.log / connect.out / connect.pid

Standalone mode keeps connector configs in memory only, so :func:`register` writes each one to
``connectors/`` as well and :func:`start` registers them again: a restarted worker resumes every
connector from its stored offset.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping

from embedstream.devcdc.postgres import PostgresInfo
from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jars import cached_jars, kafka_version, pom_property
from embedstream.devkafka.jvm import JVM_OPTS, find_java
from embedstream.devkafka.layout import CACHE_ROOT, file_lock, file_tail, write_text
from embedstream.devkafka.process import EXIT_CODES, pid_alive, port_free, runs_with, spawn, terminate
from embedstream.devkafka.storage import log4j_file_config

DEFAULT_REST_PORT = 8083
HOST = "127.0.0.1"
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
DEFAULT_POM = Path(__file__).resolve().parents[2] / "compose" / "connect-dev" / "pom.xml"
CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
# Debezium and Connect log a line per poll and per offset commit at INFO; the rest is worth keeping.
QUIET_LOGGERS = ("org.apache.kafka.clients", "org.apache.kafka.common", "org.reflections", "org.eclipse.jetty",
                 "org.glassfish", "org.apache.kafka.connect.runtime.rest")

# Latency settings, the same in compose/cdc/connector.json (tests/unit/test_cdc_rig_settings.py). Measured with
# `embedstream bench cdc-settings` (one run; Intel Xeon, 2 vCPUs, load average 8-18; 200 changes/s from 4 writers):
# COMMIT -> the change record in Kafka, median (p95), with PostgreSQL's synchronous_commit on (devcdc/postgres.py).
#
# Debezium waits poll.interval.ms twice: its streaming loop sleeps it after 5 empty reads of the replication
# stream, and the Connect task's poll waits it for a batch to fill. 500 ms (Debezium's default): 456 (796) ms;
# 100: 88 (186); 10: 8-11 (21-49); 5: 5 (25); 1: 4 (98). The price is idle wake-ups: the Connect JVM with one
# idle connector used 0.7% of a core at 500, 1.5% at 100, 6-9% at 10, 11.7% at 5, 28.4% at 1.
POLL_INTERVAL_MS = "10"
# Connect's producer sends a change record at once instead of lingering 5 ms (Kafka 4's default) for company:
# 13.2 (35.1) ms with 5, 8.2-11.4 (20.8-48.6) with 0. Connect keeps one request in flight per task, so records
# still batch while one is out.
PRODUCER_LINGER_MS = "0"


@dataclasses.dataclass(frozen=True)
class ConnectInfo:
    rest_port: int
    pid: int
    data_dir: Path
    versions: str

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"


def pom_path() -> Path:
    pom = Path(os.environ.get("EMBEDSTREAM_CONNECT_POM", DEFAULT_POM))
    if not pom.is_file():
        raise DevKafkaError(f"Connect pom not found at {pom}; run from a repo checkout or set EMBEDSTREAM_CONNECT_POM")
    return pom


def versions(pom: Path | None = None) -> tuple[str, str]:
    """(Kafka, Debezium) versions; the Kafka version must be the dev broker's."""
    pom = pom or pom_path()
    kafka, debezium = pom_property(pom, "kafka.version"), pom_property(pom, "debezium.version")
    if kafka != kafka_version():
        raise DevKafkaError(f"{pom} pins Kafka {kafka} but the dev broker runs {kafka_version()}: keep them equal")
    return kafka, debezium


def ensure_jars() -> Path:
    """The worker's jars, fetched from Maven Central once per (Kafka, Debezium) version."""
    pom = pom_path()
    kafka, debezium = versions(pom)
    return cached_jars(pom, CACHE_ROOT / "connect" / f"{kafka}-{debezium}", f"Kafka Connect {kafka} + Debezium "
                       f"{debezium}", f"debezium-connector-postgres-{debezium}.jar")


def default_data_dir(rest_port: int) -> Path:
    env = os.environ.get("EMBEDSTREAM_CONNECT_DATA_DIR")
    return Path(env).expanduser() if env else CACHE_ROOT / "connect-data" / str(rest_port)


def _root(rest_port: int, data_dir: Path | str | None) -> Path:
    return (Path(data_dir).expanduser() if data_dir is not None else default_data_dir(rest_port)).resolve()


def worker_properties(bootstrap: str, rest_port: int, root: Path) -> str:
    """Standalone worker: JSON without schemas unless a connector says otherwise, offsets flushed every second
    (how far PostgreSQL keeps WAL for the slot and a restart replays; not on the path of a change)."""
    props = {
        "bootstrap.servers": bootstrap,
        "listeners": f"http://{HOST}:{rest_port}",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "offset.storage.file.filename": str(root / "offsets.dat"),
        "offset.flush.interval.ms": "1000",
        "plugin.discovery": "service_load",  # the jars ship ServiceLoader manifests: no class scan at start
        "producer.linger.ms": PRODUCER_LINGER_MS,
    }
    return "# Written by embedstream.devcdc on every start.\n" + "".join(f"{k}={v}\n" for k, v in props.items())


def debezium_config(pg: PostgresInfo, table: str, topic_prefix: str, *, slot: str | None = None,
                    flatten: bool = False, schemas: bool = False, extra: Mapping[str, str] | None = None) -> dict:
    """A Debezium PostgreSQL connector for one table (``schema.table``): pgoutput, its own slot and
    publication, topics created with 1 partition, JSON converter with or without schemas; ``flatten``
    adds the ExtractNewRecordState transform as deployments configure it (rewrite-with-tombstone, op)."""
    name = slot or topic_prefix.replace(".", "_").replace("-", "_")
    config = {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": "1",
        "plugin.name": "pgoutput",
        "database.hostname": pg.host,
        "database.port": str(pg.port),
        "database.user": pg.user,
        "database.password": "unused",  # trust authentication on loopback
        "database.dbname": pg.database,
        "topic.prefix": topic_prefix,
        "table.include.list": table,
        "slot.name": name,
        "publication.name": f"{name}_pub",
        "publication.autocreate.mode": "filtered",
        "topic.creation.default.replication.factor": "1",
        "topic.creation.default.partitions": "1",
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": str(schemas).lower(),
        "value.converter.schemas.enable": str(schemas).lower(),
        "poll.interval.ms": POLL_INTERVAL_MS,
        "status.update.interval.ms": "1000",  # how often the slot's confirmed position is reported
    }
    if flatten:
        config |= {"transforms": "unwrap", "transforms.unwrap.type": "io.debezium.transforms.ExtractNewRecordState",
                   "transforms.unwrap.delete.tombstone.handling.mode": "rewrite-with-tombstone",
                   "transforms.unwrap.add.fields": "op"}
    return config | dict(extra or {})


def topic_for(config: Mapping[str, str]) -> str:
    """The change topic of a one-table connector: ``<topic.prefix>.<schema>.<table>``."""
    return f"{config['topic.prefix']}.{config['table.include.list']}"


def live_pid(root: Path) -> int | None:
    try:
        pid = int((root / "connect.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if pid_alive(pid) and runs_with(pid, MAIN_CLASS, str(root / "worker.properties")) else None


def start(bootstrap: str, rest_port: int = DEFAULT_REST_PORT, data_dir: Path | str | None = None,
          wait_s: float = 120.0) -> ConnectInfo:
    """Start (or reuse) the worker and return once its REST API answers and its saved connectors run."""
    root = _root(rest_port, data_dir)
    (root / "connectors").mkdir(parents=True, exist_ok=True)
    kafka, debezium = versions()
    with file_lock(root / ".lock"):
        pid = live_pid(root)
        if pid is None:
            if not port_free(HOST, rest_port):
                raise DevKafkaError(f"REST port {HOST}:{rest_port} is in use by another process; pick another")
            libs = ensure_jars()
            write_text(root / "worker.properties", worker_properties(bootstrap, rest_port, root))
            write_text(root / "log4j2.properties", log4j_file_config(root / "connect.log", QUIET_LOGGERS))
            cmd = [find_java(), *JVM_OPTS, *os.environ.get("EMBEDSTREAM_CONNECT_JVM_OPTS", "").split(),
                   f"-Dlog4j2.configurationFile={root / 'log4j2.properties'}", "-cp", f"{libs}/*",
                   MAIN_CLASS, str(root / "worker.properties")]
            pid = spawn(cmd, root, root / "connect.out", root / "connect.pid")
        info = ConnectInfo(rest_port, pid, root, f"Kafka Connect {kafka}, Debezium {debezium}")
        _wait(lambda: _get(info, "/") is not None, pid, root, wait_s, "the REST API to answer")
        for path in sorted((root / "connectors").glob("*.json")):
            _put_config(info, path.stem, json.loads(path.read_text()))
        for path in sorted((root / "connectors").glob("*.json")):
            wait_running(info, path.stem, wait_s)
    return info


def register(info: ConnectInfo, name: str, config: Mapping[str, str], wait_s: float = 120.0) -> None:
    """Create or update connector ``name`` (saved, so a restart registers it again); waits until it runs."""
    write_text(info.data_dir / "connectors" / f"{name}.json", json.dumps(dict(config), indent=2))
    _put_config(info, name, config)
    wait_running(info, name, wait_s)


def unregister(info: ConnectInfo, name: str) -> None:
    (info.data_dir / "connectors" / f"{name}.json").unlink(missing_ok=True)
    _request(info, "DELETE", f"/connectors/{name}")


def wait_running(info: ConnectInfo, name: str, wait_s: float = 120.0) -> None:
    """Until the connector and its task report RUNNING; a FAILED one raises with its trace."""
    def running() -> bool:
        state = _get(info, f"/connectors/{name}/status") or {}
        for part in [state.get("connector") or {}, *(state.get("tasks") or [])]:
            if part.get("state") == "FAILED":
                raise DevKafkaError(f"connector {name} failed: {str(part.get('trace'))[:2000]}")
        tasks = state.get("tasks") or []
        return (state.get("connector") or {}).get("state") == "RUNNING" and bool(tasks) and all(
            t.get("state") == "RUNNING" for t in tasks)

    _wait(running, info.pid, info.data_dir, wait_s, f"connector {name} to run")


def stop(rest_port: int = DEFAULT_REST_PORT, data_dir: Path | str | None = None, timeout_s: float = 30.0) -> bool:
    """Stop the worker (SIGTERM: offsets flushed; SIGKILL after timeout_s); True if one was running."""
    root = _root(rest_port, data_dir)
    pid = live_pid(root)
    if pid is not None:
        terminate(pid, timeout_s)
        (root / "connect.pid").unlink(missing_ok=True)
    return pid is not None


def status(rest_port: int = DEFAULT_REST_PORT, data_dir: Path | str | None = None) -> dict:
    root = _root(rest_port, data_dir)
    pid = live_pid(root)
    info = ConnectInfo(rest_port, pid or 0, root, "")
    connectors = {path.stem: (_get(info, f"/connectors/{path.stem}/status") or {}) if pid else {}
                  for path in sorted((root / "connectors").glob("*.json"))}
    return {"running": pid is not None, "pid": pid, "url": info.url, "data_dir": str(root),
            "log": str(root / "connect.log"),
            "connectors": {name: (s.get("connector") or {}).get("state", "UNKNOWN") for name, s in connectors.items()}}


# -- REST ------------------------------------------------------------------------------------------
def _request(info: ConnectInfo, method: str, path: str, body: Any = None, timeout_s: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(info.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        raw = resp.read()
    return json.loads(raw) if raw else None


def _get(info: ConnectInfo, path: str) -> Any:
    try:
        return _request(info, "GET", path, timeout_s=5.0)
    except (OSError, ValueError):  # not up yet, 404 while a connector starts
        return None


def _put_config(info: ConnectInfo, name: str, config: Mapping[str, str]) -> None:
    try:
        _request(info, "PUT", f"/connectors/{name}/config", dict(config), timeout_s=120.0)
    except urllib.error.HTTPError as exc:
        raise DevKafkaError(f"registering connector {name} failed ({exc.code}): {exc.read().decode()[:2000]}") from None


def _wait(predicate, pid: int, root: Path, wait_s: float, what: str) -> None:
    deadline = time.monotonic() + wait_s
    while not predicate():
        if not pid_alive(pid):
            code = f" (exit code {EXIT_CODES[pid]})" if pid in EXIT_CODES else ""
            raise DevKafkaError(f"the Connect worker exited{code} waiting for {what}; see {root / 'connect.log'}\n"
                                + file_tail(root / "connect.out") + "\n" + file_tail(root / "connect.log"))
        if time.monotonic() >= deadline:
            raise DevKafkaError(f"timed out after {wait_s:.0f} s waiting for {what}; see {root / 'connect.log'}\n"
                                + file_tail(root / "connect.log"))
        time.sleep(0.2)
