"""The broker process: launching it detached, finding it again (pid file or /proc), stopping it.

``spawn`` is the one launch of every dev service (the broker, Kafka Connect, PostgreSQL): each is bound
to its owner there (``leash.bind``: a test run, a command that borrowed a broker), so it dies with the
owner however the owner ends; outside an owner (``embedstream dev kafka start``) it outlives the command."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from embedstream.devkafka import leash
from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jvm import JVM_OPTS, cds_jvm_opts
from embedstream.devkafka.layout import Layout, write_text


MAIN_CLASS = "kafka.Kafka"

# Popen handles of brokers started by this process, so they can be reaped:
# without that a stopped child lingers as a zombie and still "exists" to kill(0).
_CHILDREN: dict[int, subprocess.Popen] = {}
EXIT_CODES: dict[int, int] = {}  # exit codes of reaped children, for error messages


def _read_pid(layout: Layout) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(layout.pid_file.read_text().strip())
    return None


def pid_alive(pid: int) -> bool:
    """True while pid runs; reaps our own children so a stopped broker is not a zombie."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        EXIT_CODES[pid] = child.returncode
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


def _is_our_broker(pid: int, layout: Layout) -> bool:
    """Guard against pid reuse: the process must be kafka.Kafka running this data dir's config."""
    return runs_with(pid, MAIN_CLASS, str(layout.config))


def runs_with(pid: int, *args: str) -> bool:
    """Whether process pid has every one of ``args`` in its argv (True without procfs, e.g. macOS)."""
    if not Path("/proc/self").is_dir():
        return True  # no procfs: trust the pid file
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return all(arg.encode() in argv for arg in args)


def live_pid(layout: Layout) -> int | None:
    """Pid of this data dir's broker if it is running, else None (pid file may be stale or lost)."""
    pid = _read_pid(layout)
    if pid is not None and pid_alive(pid) and _is_our_broker(pid, layout):
        return pid
    return _find_broker_pid(layout)


def _find_broker_pid(layout: Layout) -> int | None:
    """Scan /proc for this data dir's broker, so a deleted pid file never orphans a running one."""
    for proc in Path("/proc").glob("[0-9]*"):
        pid = int(proc.name)
        if pid != os.getpid() and _is_our_broker(pid, layout) and pid_alive(pid):
            return pid
    return None


def port_free(host: str, port: int) -> bool:
    """Whether the broker could bind host:port (SO_REUSEADDR, as Kafka binds)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_ports_free(host: str, port: int, layout: Layout) -> None:
    for p, role in ((port, "client"), (port + 1, "controller")):
        if not port_free(host, p):
            raise DevKafkaError(
                f"{role} port {host}:{p} is already in use by a process that is not the broker of "
                f"{layout.root}; stop it or pick another --port (the broker uses port and port+1)"
            )


def launch(java: str, libs: Path, layout: Layout) -> int:
    """Start the broker detached (own session, output to kafka.out) and record its pid."""
    extra = os.environ.get("EMBEDSTREAM_KAFKA_JVM_OPTS", "").split()
    cmd = [
        java, *JVM_OPTS, *cds_jvm_opts(libs, layout), *extra,
        f"-Dlog4j2.configurationFile={layout.log4j}",
        "-cp", f"{libs}/*",
        MAIN_CLASS, str(layout.config),
    ]
    return spawn(cmd, layout.root, layout.console_log, layout.pid_file)


def spawn(cmd: list[str], cwd: Path, console_log: Path, pid_file: Path) -> int:
    """Start ``cmd`` detached (own session, output appended to console_log), bind it to the owner in force
    (if any) and record its pid."""
    with open(console_log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, close_fds=True,
        )
    _CHILDREN[proc.pid] = proc
    try:
        leash.bind(proc.pid)
    except OSError as exc:  # an owner is in force but its leash is gone: nothing would stop this process
        terminate(proc.pid, 5.0)
        raise DevKafkaError(str(exc)) from None
    write_text(pid_file, f"{proc.pid}\n")
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
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return not pid_alive(pid)


def terminate(pid: int, timeout_s: float) -> bool:
    """SIGTERM (Kafka shuts down cleanly, flushing logs), SIGKILL if it overstays; True if clean."""
    _signal_group(pid, signal.SIGTERM)
    if _wait_exit(pid, timeout_s):
        return True
    _signal_group(pid, signal.SIGKILL)
    if not _wait_exit(pid, 10.0):
        raise DevKafkaError(f"broker pid {pid} survived SIGKILL")
    return False
