"""start / stop / restart / status of one dev broker: the jobs of the other modules in order."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jars import ensure_jars, kafka_version
from embedstream.devkafka.jvm import JVM_CRASH_CODES, discard_cds_archive, finish_cds_dump, find_java
from embedstream.devkafka.layout import DEFAULT_HOST, DEFAULT_PORT, Layout, file_lock, layout_for, write_text
from embedstream.devkafka.probe import broker_answers, wait_answering
from embedstream.devkafka.process import EXIT_CODES, check_ports_free, launch, live_pid, terminate
from embedstream.devkafka.storage import (
    configured_listener,
    format_storage,
    log4j_properties,
    read_cluster_id,
    server_properties,
)


DEFAULT_WAIT_S = 90.0

DEFAULT_STOP_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class BrokerInfo:
    """Where a running dev broker listens and where its files are."""

    host: str
    port: int
    pid: int
    data_dir: Path
    log_path: Path
    version: str
    cluster_id: str | None

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``."""
        return f"{self.host}:{self.port}"


def _info(host: str, port: int, pid: int, layout: Layout, version: str) -> BrokerInfo:
    cluster_id = read_cluster_id(layout)
    return BrokerInfo(host, port, pid, layout.root, layout.server_log, version, cluster_id)


def start(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | str | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    home: Path | str | None = None,
) -> BrokerInfo:
    """Start (or reuse) the dev broker for data_dir and return once it answers on host:port.

    Idempotent: a broker already running from data_dir with the same config is returned
    as is. Storage is formatted only on first use, so topics survive stop/start.
    """
    layout = layout_for(port, data_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    version = kafka_version()
    config = server_properties(host, port, layout)
    with file_lock(layout.lock_file):
        pid = live_pid(layout)
        if pid is not None:
            if layout.config.read_text() != config:
                raise DevKafkaError(
                    f"a broker (pid {pid}) already runs from {layout.root} with another host/port; "
                    "stop it first"
                )
            wait_answering(pid, host, port, wait_s, layout)
            return _info(host, port, pid, layout, version)
        layout.pid_file.unlink(missing_ok=True)  # stale
        finish_cds_dump(layout, clean_exit=False)  # exited without us: dump unverifiable
        java = find_java()
        libs = ensure_jars(home, version=version)
        write_text(layout.config, config)
        write_text(layout.log4j, log4j_properties(layout))
        if not layout.meta.is_file():
            format_storage(java, libs, layout)
        check_ports_free(host, port, layout)
        pid = launch(java, libs, layout)
        try:
            wait_answering(pid, host, port, wait_s, layout)
        except BaseException as exc:
            # Do not leave a half-started broker holding the ports and the data dir.
            with contextlib.suppress(DevKafkaError):
                terminate(pid, 10.0)
            finish_cds_dump(layout, clean_exit=False)
            layout.pid_file.unlink(missing_ok=True)
            if EXIT_CODES.get(pid) in JVM_CRASH_CODES and discard_cds_archive(libs):
                raise DevKafkaError(
                    f"{exc}\nthe JVM crashed; removed the shared class archive in case it was damaged, "
                    "so starting again runs without it"
                ) from exc
            raise
    return _info(host, port, pid, layout, version)


def stop(
    port: int = DEFAULT_PORT,
    data_dir: Path | str | None = None,
    timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> bool:
    """Stop the data dir's broker (SIGTERM, SIGKILL after timeout_s); True if one was running."""
    layout = layout_for(port, data_dir)
    if not layout.root.is_dir():
        return False
    with file_lock(layout.lock_file):
        pid = live_pid(layout)
        clean = terminate(pid, timeout_s) if pid is not None else False
        finish_cds_dump(layout, clean_exit=clean)
        layout.pid_file.unlink(missing_ok=True)
    return pid is not None


def restart(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | str | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    home: Path | str | None = None,
) -> BrokerInfo:
    """Stop then start with the same data dir (topics and offsets kept): for fault-injection tests."""
    stop(port, data_dir, timeout_s=stop_timeout_s)
    return start(host, port, data_dir, wait_s, home=home)


def status(port: int = DEFAULT_PORT, data_dir: Path | str | None = None) -> dict:
    """State of the data dir's broker: running/answering, pid, bootstrap, log and data paths."""
    layout = layout_for(port, data_dir)
    pid = live_pid(layout)
    host, cfg_port = configured_listener(layout) or (DEFAULT_HOST, port)
    return {
        "running": pid is not None,
        "answering": pid is not None and broker_answers(host, cfg_port),
        "pid": pid,
        "bootstrap": f"{host}:{cfg_port}",
        "data_dir": str(layout.root),
        "log": str(layout.server_log),
        "console_log": str(layout.console_log),
        "cluster_id": read_cluster_id(layout),
    }
