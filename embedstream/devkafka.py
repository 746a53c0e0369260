"""Local development Apache Kafka broker: one KRaft node (broker + controller).

No Docker here, so the broker is the real Apache Kafka from its official jars on
Maven Central (listed in ``compose/kafka-dev/pom.xml``), fetched once by ``mvn``
into a per-version cache and run as a detached ``java kafka.Kafka`` process.

Layout of a data dir (default ``~/.cache/embedstream/kafka-data/<port>``)::

    server.properties   rewritten on every start
    log4j2.properties   rewritten on every start
    kraft-logs/         topic data + KRaft metadata; formatted only once
    server.log          broker log (log4j2, rolled at 10 MB)
    kafka.out           JVM stdout/stderr (crashes, early failures)
    broker.pid          pid of the running broker (its own process group)
    cds-dump.pending    only while a broker dumps the shared class archive (see below)

Stdlib only on purpose: readiness is checked with raw ApiVersions + Metadata
requests, so this works before (and without) a Kafka client library.

Shell use: ``python -m embedstream.devkafka start|stop|restart|status|jars [--port N]``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import IO, Iterator, Sequence

__all__ = [
    "BrokerInfo",
    "DevKafkaError",
    "broker_answers",
    "default_data_dir",
    "ensure_jars",
    "kafka_version",
    "main",
    "restart",
    "start",
    "status",
    "stop",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9092
DEFAULT_WAIT_S = 90.0
DEFAULT_STOP_TIMEOUT_S = 30.0

DEFAULT_POM = Path(__file__).resolve().parent.parent / "compose" / "kafka-dev" / "pom.xml"
CACHE_ROOT = Path.home() / ".cache" / "embedstream"

MIN_JAVA = 17  # Kafka 4.x brokers are compiled for Java 17.
MAIN_CLASS = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
# Modest heap: the dev machine has 2 cores and runs models next to the broker.
# GC flags are the ones Kafka's own kafka-run-class.sh uses.
JVM_OPTS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    # C1 only: about half the start-up time and far less JIT CPU on 2 cores; a dev
    # broker's load is tiny next to the models. Override via EMBEDSTREAM_KAFKA_JVM_OPTS.
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
MVN_TIMEOUT_S = 900
STORAGE_FORMAT_TIMEOUT_S = 120

# Popen handles of brokers started by this process, so they can be reaped:
# without that a stopped child lingers as a zombie and still "exists" to kill(0).
_CHILDREN: dict[int, subprocess.Popen] = {}
_EXIT_CODES: dict[int, int] = {}  # exit codes of reaped children, for error messages
# A JVM fatal error (hs_err) aborts with SIGABRT; a bad class-data archive shows up so.
_JVM_CRASH_CODES = {134, -signal.SIGABRT, -signal.SIGBUS, -signal.SIGSEGV}


class DevKafkaError(RuntimeError):
    """The dev broker could not be provisioned, started or stopped; the message says why."""


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


@dataclasses.dataclass(frozen=True)
class _Layout:
    """File names inside one broker's data dir, kept in one place."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "server.properties"

    @property
    def log4j(self) -> Path:
        return self.root / "log4j2.properties"

    @property
    def log_dirs(self) -> Path:
        return self.root / "kraft-logs"

    @property
    def meta(self) -> Path:
        return self.log_dirs / "meta.properties"

    @property
    def pid_file(self) -> Path:
        return self.root / "broker.pid"

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def console_log(self) -> Path:
        return self.root / "kafka.out"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def cds_pending(self) -> Path:
        """Records the class-data archive this broker dumps at exit, and where it goes."""
        return self.root / "cds-dump.pending"


# --------------------------------------------------------------------------- jars


def _pom_path() -> Path:
    """The pom listing the broker jars; overridable for installs outside the repo checkout."""
    pom = Path(os.environ.get("EMBEDSTREAM_KAFKA_POM", DEFAULT_POM))
    if not pom.is_file():
        raise DevKafkaError(
            f"Kafka pom not found at {pom}; run from a repo checkout or set EMBEDSTREAM_KAFKA_POM"
        )
    return pom


def kafka_version(pom: Path | None = None) -> str:
    """The Kafka version pinned in the pom, so the pom stays the single source of truth."""
    pom = pom or _pom_path()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(pom).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise DevKafkaError(f"{pom} has no <properties><kafka.version>")
    return node.text.strip()


def _default_home(version: str) -> Path:
    """Per-version jar cache, so bumping the pom never mixes jars of two versions."""
    return CACHE_ROOT / "kafka" / version


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Serialise concurrent resolutions/starts (parallel test workers, two shells)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _tail_text(text: str, lines: int = 30) -> str:
    """Last lines of a command's output (the error is nearly always at the end), colour codes dropped."""
    return "\n".join(_ANSI_ESCAPE.sub("", text).strip().splitlines()[-lines:])


def _run_mvn(pom: Path, version: str, out_dir: Path) -> None:
    """Copy the broker's runtime jars from Maven Central into out_dir."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevKafkaError("mvn not found on PATH; install Maven 3.8+ (e.g. apt-get install maven)")
    cmd = [
        mvn, "-q", "-B", "-Dstyle.color=never",
        "-f", str(pom),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out_dir}",
    ]
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MVN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise DevKafkaError(f"mvn timed out after {MVN_TIMEOUT_S} s resolving Kafka {version}") from exc
    if proc.returncode != 0:
        raise DevKafkaError(
            f"mvn failed (exit {proc.returncode}) resolving Kafka {version}:\n"
            + _tail_text(proc.stdout + proc.stderr)
        )


def ensure_jars(home: Path | str | None = None, *, version: str | None = None) -> Path:
    """Return ``<home>/libs`` holding the broker jars, resolving them with mvn only the first time.

    ``home`` defaults to ``~/.cache/embedstream/kafka/<version>``. Jars are copied into a
    scratch dir and renamed into place only when complete, so an interrupted download
    is never mistaken for a usable cache.
    """
    pom = _pom_path()
    version = version or kafka_version(pom)
    home = Path(home) if home is not None else _default_home(version)
    libs = home / "libs"
    marker = libs / ".complete"
    if marker.is_file():
        return libs
    with _file_lock(home / ".lock"):
        if marker.is_file():  # another process finished while we waited
            return libs
        scratch = home / f"libs.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        _run_mvn(pom, version, scratch)
        if not (scratch / f"kafka_2.13-{version}.jar").is_file():
            raise DevKafkaError(f"mvn succeeded but kafka_2.13-{version}.jar is missing from {scratch}")
        (scratch / ".complete").write_text(version + "\n")
        shutil.rmtree(libs, ignore_errors=True)  # leftover of an older, incomplete layout
        scratch.rename(libs)
    return libs


# --------------------------------------------------------------------------- java


def _java() -> str:
    """Path of a Java 17+ ``java``: JAVA_HOME first (as Kafka's scripts do), then PATH."""
    return _java_info()[0]


@functools.lru_cache(maxsize=1)
def _java_info() -> tuple[str, str]:
    """(path, ``java -version`` banner) of the runtime, checked once per process."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "java") if java_home else None
    java = str(candidate) if candidate and candidate.is_file() else shutil.which("java")
    if java is None:
        raise DevKafkaError(
            "java not found: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless) "
            "or set JAVA_HOME"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0_x" style
            major = int(match.group(2))
        if major < MIN_JAVA:
            raise DevKafkaError(f"Kafka 4.x needs Java {MIN_JAVA}+, but {java} is Java {major}")
    return java, (out.stderr + out.stdout).strip()


# --------------------------------------------------------------------------- class-data sharing
#
# Booting the broker is mostly class loading and JIT on a small machine. An AppCDS
# archive (dumped by the first broker when it stops) plus C1-only JIT cuts a warm start
# from ~9 s to ~4 s on 2 busy cores. The archive is keyed by JDK build; the JVM itself
# rejects a stale or mismatched one with a warning and simply starts slower.


def _cds_enabled() -> bool:
    return os.environ.get("EMBEDSTREAM_KAFKA_CDS", "1") not in ("0", "false", "no")


def _cds_archive(libs: Path) -> Path:
    """Shared archive next to the jars, one per (Kafka version, JDK build)."""
    java, banner = _java_info()
    tag = hashlib.sha256(f"{os.path.realpath(java)}\n{banner}".encode()).hexdigest()[:12]
    return libs.parent / f"cds-{tag}.jsa"


def _cds_jvm_opts(libs: Path, layout: _Layout) -> list[str]:
    """Use the archive if present, else have this broker dump one at exit (see _finish_cds_dump).

    The dump goes to a unique temp file beside the archive, so publishing it is an
    atomic same-directory rename even when the data dir is on another filesystem.
    """
    if not _cds_enabled():
        return []
    archive = _cds_archive(libs)
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"]
    _remove_stale_dumps(archive.parent)
    dump = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp")
    _write_text(layout.cds_pending, f"{dump}\n{archive}\n")
    return [f"-XX:ArchiveClassesAtExit={dump}"]


def _remove_stale_dumps(directory: Path, max_age_s: float = 86400.0) -> None:
    """Drop dumps of brokers that were never stopped through us (they are 50 MB each)."""
    for tmp in directory.glob("cds-*.jsa.*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > max_age_s:
                tmp.unlink()


def _discard_cds_archive(libs: Path) -> bool:
    """Delete the shared archive (suspected of crashing the JVM); True if there was one."""
    if not _cds_enabled():
        return False
    archive = _cds_archive(libs)
    existed = archive.is_file()
    archive.unlink(missing_ok=True)
    return existed


def _cds_archive_loads(archive: Path, libs: Path) -> bool:
    """Whether a JVM starts with this archive: a damaged one crashes it (SIGBUS), not just warns."""
    cmd = [_java(), *JVM_OPTS, f"-XX:SharedArchiveFile={archive}", "-cp", f"{libs}/*", "-version"]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60).returncode == 0


def _finish_cds_dump(layout: _Layout, clean_exit: bool) -> None:
    """Publish a dumped archive, only if the JVM exited normally (a killed dump is junk)."""
    try:
        dump, archive = (Path(line) for line in layout.cds_pending.read_text().splitlines())
    except (OSError, ValueError):
        return
    try:
        if clean_exit and dump.is_file() and _cds_archive_loads(dump, archive.parent / "libs"):
            os.replace(dump, archive)
    except (OSError, DevKafkaError, subprocess.SubprocessError):
        pass  # best effort: the next broker simply dumps again
    finally:
        dump.unlink(missing_ok=True)
        layout.cds_pending.unlink(missing_ok=True)


# --------------------------------------------------------------------------- config


def default_data_dir(port: int = DEFAULT_PORT) -> Path:
    """``$EMBEDSTREAM_KAFKA_DATA_DIR`` if set, else one dir per port so brokers never share state."""
    env = os.environ.get("EMBEDSTREAM_KAFKA_DATA_DIR")
    return Path(env).expanduser() if env else CACHE_ROOT / "kafka-data" / str(port)


def _layout(port: int, data_dir: Path | str | None) -> _Layout:
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir(port)
    return _Layout(root.resolve())


def _server_properties(host: str, port: int, layout: _Layout) -> str:
    """Single-node KRaft config: everything replicated once, fast group joins."""
    controller_port = port + 1
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(layout.log_dirs),
        "num.partitions": "4",
        "auto.create.topics.enable": "true",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # Internal topics: one replica, and few partitions so the first consumer group
        # or transaction does not wait for 50 partitions to be created on 2 cores.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "4",
        # Tests join groups constantly; the default 3 s delay would dominate them.
        "group.initial.rebalance.delay.ms": "0",
    }
    header = "# Written by embedstream.devkafka on every start; edits are overwritten.\n"
    return header + "".join(f"{k}={v}\n" for k, v in props.items())


def _log4j_properties(layout: _Layout) -> str:
    """Broker log to a size-capped file; chatty request/state-change loggers only on WARN."""
    log = layout.server_log
    return f"""# Written by embedstream.devkafka on every start.
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 10MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
"""


def _write_text(path: Path, text: str) -> None:
    """Write via rename so a crash never leaves a half-written config behind."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _random_cluster_id() -> str:
    """Same format as ``kafka-storage random-uuid`` without paying a JVM start for it."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka rejects ids that look like CLI flags
            return cid


def _format_storage(java: str, libs: Path, layout: _Layout) -> None:
    """Format the KRaft log dir once; skipped later so topics and offsets survive restarts."""
    cmd = [
        java, "-Xmx256m", f"-Dlog4j2.configurationFile={layout.log4j}",
        "-cp", f"{libs}/*", STORAGE_TOOL,
        "format", "-t", _random_cluster_id(), "-c", str(layout.config),
    ]
    proc = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=STORAGE_FORMAT_TIMEOUT_S
    )
    if proc.returncode != 0 or not layout.meta.is_file():
        raise DevKafkaError(
            f"formatting Kafka storage in {layout.log_dirs} failed (exit {proc.returncode}):\n"
            + _tail_text(proc.stdout + proc.stderr)
        )


def _read_cluster_id(layout: _Layout) -> str | None:
    with contextlib.suppress(OSError):
        for line in layout.meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    return None


def _configured_listener(layout: _Layout) -> tuple[str, int] | None:
    """(host, port) the data dir's broker was last configured for, if any."""
    with contextlib.suppress(OSError):
        text = layout.config.read_text()
        match = re.search(r"^advertised\.listeners=PLAINTEXT://(.+):(\d+)$", text, re.M)
        if match:
            return match.group(1), int(match.group(2))
    return None


# --------------------------------------------------------------------------- processes


def _read_pid(layout: _Layout) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(layout.pid_file.read_text().strip())
    return None


def _pid_alive(pid: int) -> bool:
    """True while pid runs; reaps our own children so a stopped broker is not a zombie."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        _EXIT_CODES[pid] = child.returncode
        _CHILDREN.pop(pid, None)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie of some other parent is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _is_our_broker(pid: int, layout: _Layout) -> bool:
    """Guard against pid reuse: the process must be kafka.Kafka running this data dir's config."""
    if not Path("/proc/self").is_dir():
        return True  # no procfs (e.g. macOS): trust the pid file
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return MAIN_CLASS.encode() in argv and str(layout.config).encode() in argv


def _live_pid(layout: _Layout) -> int | None:
    """Pid of this data dir's broker if it is running, else None (pid file may be stale or lost)."""
    pid = _read_pid(layout)
    if pid is not None and _pid_alive(pid) and _is_our_broker(pid, layout):
        return pid
    return _find_broker_pid(layout)


def _find_broker_pid(layout: _Layout) -> int | None:
    """Scan /proc for this data dir's broker, so a deleted pid file never orphans a running one."""
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid != os.getpid() and _is_our_broker(pid, layout) and _pid_alive(pid):
            return pid
    return None


def _port_free(host: str, port: int) -> bool:
    """Whether the broker could bind host:port (SO_REUSEADDR, as Kafka binds)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _check_ports_free(host: str, port: int, layout: _Layout) -> None:
    for p, role in ((port, "client"), (port + 1, "controller")):
        if not _port_free(host, p):
            raise DevKafkaError(
                f"{role} port {host}:{p} is already in use by a process that is not the broker of "
                f"{layout.root}; stop it or pick another --port (the broker uses port and port+1)"
            )


def _launch(java: str, libs: Path, layout: _Layout) -> int:
    """Start the broker detached (own session, output to kafka.out) and record its pid."""
    extra = os.environ.get("EMBEDSTREAM_KAFKA_JVM_OPTS", "").split()
    cmd = [
        java, *JVM_OPTS, *_cds_jvm_opts(libs, layout), *extra,
        f"-Dlog4j2.configurationFile={layout.log4j}",
        "-cp", f"{libs}/*",
        MAIN_CLASS, str(layout.config),
    ]
    with open(layout.console_log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd, cwd=layout.root, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    _write_text(layout.pid_file, f"{proc.pid}\n")
    return proc.pid


def _signal_group(pid: int, sig: int) -> None:
    """Signal the broker's process group (it leads one), falling back to the pid alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return not _pid_alive(pid)


def _terminate(pid: int, timeout_s: float) -> bool:
    """SIGTERM (Kafka shuts down cleanly, flushing logs), SIGKILL if it overstays; True if clean."""
    _signal_group(pid, signal.SIGTERM)
    if _wait_exit(pid, timeout_s):
        return True
    _signal_group(pid, signal.SIGKILL)
    if not _wait_exit(pid, 10.0):
        raise DevKafkaError(f"broker pid {pid} survived SIGKILL")
    return False


def _file_tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            return _tail_text(fh.read().decode("utf-8", "replace"), lines)
    except OSError:
        return ""


def _logs_excerpt(layout: _Layout) -> str:
    """Tails of both logs: startup failures land in kafka.out, broker errors in server.log."""
    parts = []
    for path in (layout.server_log, layout.console_log):
        text = _file_tail(path)
        if text:
            parts.append(f"--- last lines of {path} ---\n{text}")
    return "\n".join(parts)


# --------------------------------------------------------------------------- probe


def _send_request(
    sock: socket.socket, api_key: int, version: int, body: bytes, correlation_id: int
) -> bytes:
    """Send one request (header v1) and return the response body after the correlation id."""
    client_id = b"embedstream-devkafka"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", _recv_exact(sock, 4))[0]
    response = _recv_exact(sock, size)
    if struct.unpack(">i", response[:4])[0] != correlation_id:
        raise ValueError("correlation id mismatch")
    return response[4:]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def _api_versions(sock: socket.socket) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 (answered by every broker): api key -> (min, max) version."""
    body = _send_request(sock, 18, 0, b"", correlation_id=1)
    error, count = struct.unpack(">hi", body[:6])
    if error != 0:
        raise ValueError(f"ApiVersions error {error}")
    entries = struct.iter_unpack(">hhh", body[6 : 6 + 6 * count])
    return {key: (lo, hi) for key, lo, hi in entries}


def _metadata_broker_count(sock: socket.socket, version: int) -> int:
    """Brokers listed by a (non-flexible, v1..v8) Metadata request for no topics."""
    body = struct.pack(">i", 0)  # empty topic list: cluster info only
    if version >= 4:
        body += b"\x00"  # allow_auto_topic_creation
    if version >= 8:
        body += b"\x00\x00"  # include cluster/topic authorized operations
    resp = _send_request(sock, 3, version, body, correlation_id=2)
    offset = 4 if version >= 3 else 0  # throttle_time_ms
    return struct.unpack(">i", resp[offset : offset + 4])[0]


def broker_answers(
    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, timeout_s: float = 2.0
) -> bool:
    """True when a Kafka broker at host:port serves requests and lists itself in metadata.

    Stronger than an open port: the listener opens before the broker has registered
    with its controller, and clients fail until it has.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            lo, hi = _api_versions(sock).get(3, (0, -1))
            versions = [v for v in range(1, 9) if lo <= v <= hi]
            if not versions:
                return False
            return _metadata_broker_count(sock, max(versions)) > 0
    except (OSError, ValueError, struct.error):
        return False


def _wait_answering(pid: int, host: str, port: int, wait_s: float, layout: _Layout) -> None:
    """Block until the broker answers; fail fast if the JVM dies, with the log tails."""
    deadline = time.monotonic() + wait_s
    while True:
        if broker_answers(host, port, timeout_s=2.0):
            return
        if not _pid_alive(pid):
            code = f" with exit code {_EXIT_CODES[pid]}" if pid in _EXIT_CODES else ""
            raise DevKafkaError(
                f"broker exited during startup{code}; see {layout.server_log}\n{_logs_excerpt(layout)}"
            )
        if time.monotonic() >= deadline:
            raise DevKafkaError(
                f"broker did not answer within {wait_s:.0f} s; see {layout.server_log}\n"
                + _logs_excerpt(layout)
            )
        time.sleep(0.2)


# --------------------------------------------------------------------------- public API


def _info(host: str, port: int, pid: int, layout: _Layout, version: str) -> BrokerInfo:
    cluster_id = _read_cluster_id(layout)
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
    layout = _layout(port, data_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    version = kafka_version()
    config = _server_properties(host, port, layout)
    with _file_lock(layout.lock_file):
        pid = _live_pid(layout)
        if pid is not None:
            if layout.config.read_text() != config:
                raise DevKafkaError(
                    f"a broker (pid {pid}) already runs from {layout.root} with another host/port; "
                    "stop it first"
                )
            _wait_answering(pid, host, port, wait_s, layout)
            return _info(host, port, pid, layout, version)
        layout.pid_file.unlink(missing_ok=True)  # stale
        _finish_cds_dump(layout, clean_exit=False)  # exited without us: dump unverifiable
        java = _java()
        libs = ensure_jars(home, version=version)
        _write_text(layout.config, config)
        _write_text(layout.log4j, _log4j_properties(layout))
        if not layout.meta.is_file():
            _format_storage(java, libs, layout)
        _check_ports_free(host, port, layout)
        pid = _launch(java, libs, layout)
        try:
            _wait_answering(pid, host, port, wait_s, layout)
        except BaseException as exc:
            # Do not leave a half-started broker holding the ports and the data dir.
            with contextlib.suppress(DevKafkaError):
                _terminate(pid, 10.0)
            _finish_cds_dump(layout, clean_exit=False)
            layout.pid_file.unlink(missing_ok=True)
            if _EXIT_CODES.get(pid) in _JVM_CRASH_CODES and _discard_cds_archive(libs):
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
    layout = _layout(port, data_dir)
    if not layout.root.is_dir():
        return False
    with _file_lock(layout.lock_file):
        pid = _live_pid(layout)
        clean = _terminate(pid, timeout_s) if pid is not None else False
        _finish_cds_dump(layout, clean_exit=clean)
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
    layout = _layout(port, data_dir)
    pid = _live_pid(layout)
    host, cfg_port = _configured_listener(layout) or (DEFAULT_HOST, port)
    return {
        "running": pid is not None,
        "answering": pid is not None and broker_answers(host, cfg_port),
        "pid": pid,
        "bootstrap": f"{host}:{cfg_port}",
        "data_dir": str(layout.root),
        "log": str(layout.server_log),
        "console_log": str(layout.console_log),
        "cluster_id": _read_cluster_id(layout),
    }


# --------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m embedstream.devkafka",
        description="Local single-node Apache Kafka (KRaft) for development and tests.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_)
        if name != "jars":
            cmd.add_argument(
                "--port", type=int, default=DEFAULT_PORT, help="client port; port+1 is the controller"
            )
            cmd.add_argument(
                "--data-dir", type=Path, default=None,
                help="default: $EMBEDSTREAM_KAFKA_DATA_DIR or ~/.cache/embedstream/kafka-data/<port>",
            )
        return cmd

    for name, help_ in (
        ("start", "start the broker (no-op if running); prints the bootstrap address on stdout"),
        ("restart", "stop and start, keeping data"),
    ):
        cmd = add(name, help_)
        cmd.add_argument("--host", default=DEFAULT_HOST)
        cmd.add_argument(
            "--wait", type=float, default=DEFAULT_WAIT_S, help="seconds to wait for the broker to answer"
        )
    add("stop", "stop the broker").add_argument(
        "--timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, help="seconds before SIGKILL"
    )
    add("status", "print status as JSON; exit 0 if answering, 3 otherwise")
    add("jars", "resolve the broker jars into the cache and print their directory")
    return parser


def _say(msg: str, stream: IO[str] = sys.stderr) -> None:
    print(msg, file=stream, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; returns the exit code (stdout carries only machine-readable output)."""
    args = _parser().parse_args(argv)
    try:
        if args.command in ("start", "restart"):
            fn = start if args.command == "start" else restart
            t0 = time.monotonic()
            info = fn(args.host, args.port, args.data_dir, args.wait)
            _say(
                f"kafka {info.version} answering on {info.bootstrap} after {time.monotonic() - t0:.1f} s "
                f"(pid {info.pid}, data {info.data_dir}, log {info.log_path})"
            )
            _say(info.bootstrap, sys.stdout)
        elif args.command == "stop":
            stopped = stop(args.port, args.data_dir, args.timeout)
            _say("broker stopped" if stopped else "no broker was running")
        elif args.command == "status":
            state = status(args.port, args.data_dir)
            _say(json.dumps(state, indent=2), sys.stdout)
            return 0 if state["answering"] else 3
        elif args.command == "jars":
            t0 = time.monotonic()
            libs = ensure_jars()
            _say(f"kafka jars ready after {time.monotonic() - t0:.1f} s")
            _say(str(libs), sys.stdout)
    except DevKafkaError as exc:
        _say(f"devkafka: error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
