"""start / stop / status of one dev broker: the jobs of the other modules in order (restart, and a cluster of
them: cluster.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import ssl
from pathlib import Path
from typing import Mapping, Sequence

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jars import ensure_jars, kafka_version
from embedstream.devkafka.jvm import JVM_CRASH_CODES, discard_cds_archive, finish_cds_dump, find_java
from embedstream.devkafka.layout import DEFAULT_HOST, DEFAULT_PORT, Layout, file_lock, layout_for, write_text
from embedstream.devkafka.probe import broker_answers, wait_answering
from embedstream.devkafka.process import EXIT_CODES, check_ports_free, launch, live_pid, terminate
from embedstream.devkafka.security import (
    PLAINTEXT,
    SASL_SSL,
    AclGrant,
    SecureFiles,
    check_mode,
    format_args,
    prepare,
    provision,
    security_dir,
    server_overrides,
    tls_context,
    write_admin_env,
)
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
    security: str = PLAINTEXT
    ca_file: Path | None = None  # secured broker: what clients pass as ssl_cafile
    admin_env: Path | None = None  # secured broker: the admin's EMBEDSTREAM_KAFKA__* settings (0600)

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``."""
        return f"{self.host}:{self.port}"


def _info(
    host: str, port: int, pid: int, layout: Layout, version: str, files: SecureFiles | None
) -> BrokerInfo:
    cluster_id = read_cluster_id(layout)
    if files is None:
        return BrokerInfo(host, port, pid, layout.root, layout.server_log, version, cluster_id)
    return BrokerInfo(
        host, port, pid, layout.root, layout.server_log, version, cluster_id,
        security=SASL_SSL, ca_file=files.ca_file, admin_env=files.admin_env,
    )


def start(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | str | None = None,
    wait_s: float = DEFAULT_WAIT_S,
    *,
    home: Path | str | None = None,
    security: str = PLAINTEXT,
    users: Mapping[str, str] | None = None,
    grants: Sequence[AclGrant] = (),
) -> BrokerInfo:
    """Start (or reuse) the dev broker for data_dir and return once it answers on host:port.

    Idempotent: a broker already running from data_dir with the same config is returned
    as is. Storage is formatted only on first use, so topics survive stop/start.

    ``security="sasl_ssl"`` starts the secured broker (see security.py): SASL_SSL with SCRAM-SHA-512,
    TLS from the data dir's own CA (``BrokerInfo.ca_file``), ACLs enforced. ``users`` (name → password)
    are created or updated and ``grants`` added on every start; the super user ``admin`` is made once
    per data dir (its settings in ``BrokerInfo.admin_env``).
    """
    mode = check_mode(security)
    if mode == PLAINTEXT and (users or grants):
        raise DevKafkaError("users and ACL grants need security='sasl_ssl'")
    layout = layout_for(port, data_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    version = kafka_version()
    files = prepare(layout, host) if mode == SASL_SSL else None
    config = server_properties(host, port, layout, server_overrides(host, port, files) if files else None)
    tls = tls_context(files.ca_file) if files else None
    with file_lock(layout.lock_file):
        pid = live_pid(layout)
        if pid is not None:
            if layout.config.read_text() != config:
                raise DevKafkaError(
                    f"a broker (pid {pid}) already runs from {layout.root} with another host/port "
                    "or security; stop it first"
                )
            wait_answering(pid, host, port, wait_s, layout, tls)
        else:
            pid = _start_process(host, port, layout, config, version, files, tls, wait_s, home)
        if files is not None:
            bootstrap = f"{host}:{port}"
            write_admin_env(bootstrap, files)
            provision(bootstrap, files, dict(users or {}), grants, timeout_s=wait_s)
    return _info(host, port, pid, layout, version, files)


def _start_process(
    host: str,
    port: int,
    layout: Layout,
    config: str,
    version: str,
    files: SecureFiles | None,
    tls: ssl.SSLContext | None,
    wait_s: float,
    home: Path | str | None,
) -> int:
    """Write the config, format storage on first use, launch the JVM and wait until it answers."""
    pid, libs = launch_node(layout, config, version, home, files=files, host=host, port=port)
    await_node(pid, libs, host, port, layout, wait_s, tls)
    return pid


def launch_node(
    layout: Layout,
    config: str,
    version: str,
    home: Path | str | None,
    *,
    host: str,
    port: int,
    files: SecureFiles | None = None,
    cluster_id: str | None = None,
) -> tuple[int, Path]:
    """Write the config, format storage on first use (with ``cluster_id``: a cluster's shared id) and
    launch the JVM without waiting; returns (pid, jar dir). Nodes of a cluster are all launched before
    any is waited for: one node alone has no controller quorum."""
    layout.pid_file.unlink(missing_ok=True)  # stale
    finish_cds_dump(layout, clean_exit=False)  # exited without us: dump unverifiable
    java = find_java()
    libs = ensure_jars(home, version=version)
    write_text(layout.config, config, private=files is not None)  # a secured config holds the admin password
    write_text(layout.log4j, log4j_properties(layout))
    if not layout.meta.is_file():
        if files is None:
            format_storage(java, libs, layout, cluster_id=cluster_id)
        else:
            format_storage(java, libs, layout, format_args(files), secrets=(files.admin_password,))
            write_text(_scram_marker(files), "formatted with the admin's SCRAM credential\n")
    elif files is not None and not _scram_marker(files).is_file():
        raise DevKafkaError(
            f"{layout.root} was formatted for a plain broker, so it has no admin credential; "
            "start the secured broker with another data dir"
        )
    check_ports_free(host, port, layout)
    return launch(java, libs, layout), libs


def await_node(
    pid: int, libs: Path, host: str, port: int, layout: Layout, wait_s: float,
    tls: ssl.SSLContext | None = None, brokers: int = 1,
) -> None:
    """Wait until the launched broker answers (listing ``brokers`` brokers); stop it if it never does."""
    try:
        wait_answering(pid, host, port, wait_s, layout, tls, brokers=brokers)
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


def _scram_marker(files: SecureFiles) -> Path:
    return files.directory / "scram-formatted"


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


def status(port: int = DEFAULT_PORT, data_dir: Path | str | None = None) -> dict:
    """State of the data dir's broker: running/answering, pid, bootstrap, log and data paths."""
    layout = layout_for(port, data_dir)
    pid = live_pid(layout)
    protocol, host, cfg_port = configured_listener(layout) or ("PLAINTEXT", DEFAULT_HOST, port)
    ca_file = security_dir(layout) / "ca.pem"
    tls = tls_context(ca_file) if protocol == "SASL_SSL" and ca_file.is_file() else None
    return {
        "running": pid is not None,
        "answering": pid is not None and broker_answers(host, cfg_port, tls=tls),
        "pid": pid,
        "bootstrap": f"{host}:{cfg_port}",
        "security": protocol.lower(),
        "ca_file": str(ca_file) if tls else None,
        "data_dir": str(layout.root),
        "log": str(layout.server_log),
        "console_log": str(layout.console_log),
        "cluster_id": read_cluster_id(layout),
    }
