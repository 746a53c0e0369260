"""Processes bound to their owner: whatever an owner starts dies with it, however the owner ends (kill -9 too).

The owner (a test run, a command that ``borrowed()`` a broker) starts one *leash*: a small process in a
session of its own (so a signal to the owner's process group never reaches it) that reads the owner's end
of a pipe and listens on a Unix socket. Every launch made under the owner (the dev broker, Kafka Connect,
PostgreSQL, a worker process) registers its pid there (``bind``), from the owner or from any process below
it: the socket's address travels in ``EMBEDSTREAM_LEASH``. When the owner ends, the kernel closes the
pipe and the leash SIGKILLs every registered process still running (its whole process group where it
leads one: the JVM's threads, PostgreSQL's backends) and exits, so the next run finds its ports free.

A pid is registered with its start time, so a pid the kernel reused for someone else is never killed.
``embedstream dev kafka start`` outside an owner binds nothing: a broker a user starts outlives the command.

Run as a script (``python -I leash.py SOCKET``) this file is the leash itself: standard library only.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = "EMBEDSTREAM_LEASH"  # the socket of the leash every launch in this process and below registers with
_READY = b"ready\n"
_REPLY_TIMEOUT_S = 30.0

_held: subprocess.Popen | None = None  # this process's own leash: its stdin is the pipe whose EOF fires it


# -- the owner's side -------------------------------------------------------------------------------
def hold() -> str:
    """Start a leash owned by this process (unless it holds one) and export its address; returns it.

    A test run calls this at its start: what it launches, and what its child processes launch, dies with it."""
    global _held
    if _held is not None and _held.poll() is None:
        return os.environ[ENV]
    folder = tempfile.mkdtemp(prefix="embedstream-leash-")
    address = os.path.join(folder, "sock")
    proc = subprocess.Popen(
        [sys.executable, "-I", __file__, address], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=None, start_new_session=True, close_fds=True,
    )
    ready = proc.stdout.readline()
    proc.stdout.close()
    if ready != _READY:
        proc.kill()
        shutil.rmtree(folder, ignore_errors=True)
        raise OSError(f"the leash did not start (said {ready!r}, exit {proc.wait()})")
    _held = proc  # never closed by us: the pipe closes when this process ends, however it ends
    os.environ[ENV] = address
    return address


def ensure() -> str:
    """The leash in force here (inherited from an owner above, or this process's own), holding one if none is."""
    address = os.environ.get(ENV)
    if address and _answers(address):
        return address
    return hold()


def bind(pid: int) -> bool:
    """Register ``pid`` with the leash in force, if any: it dies with the owner. False when none is in force.

    Returns once the leash has the pid, so an owner killed right after a launch still takes it along."""
    address = os.environ.get(ENV)
    if not address:
        return False
    try:
        _ask(address, f"bind {pid} {start_time(pid) or 0}\n")
    except OSError as exc:
        raise OSError(f"cannot bind pid {pid} to its owner: the leash at {address} ({ENV}) does not answer: {exc}") from exc
    return True


def bound() -> list[int]:
    """The pids bound to the leash in force that still run (empty when none is in force)."""
    address = os.environ.get(ENV)
    return [int(word) for word in _ask(address, "list\n")] if address else []


def _answers(address: str) -> bool:
    try:
        _ask(address, "ping\n")
        return True
    except OSError:
        return False


def _ask(address: str, line: str) -> list[str]:
    """Send one request; the words of the leash's ``ok`` reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(_REPLY_TIMEOUT_S)
        sock.connect(address)
        sock.sendall(line.encode())
        reply = sock.makefile("rb").readline().decode().split()
    if reply[:1] != ["ok"]:
        raise OSError(f"unexpected reply {reply!r}")
    return reply[1:]


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (procfs), None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


# -- the leash process ------------------------------------------------------------------------------
def _same_process(pid: int, started: int) -> bool:
    """Whether ``pid`` is still the process registered with start time ``started`` (0: unknown)."""
    now = start_time(pid)
    if now is not None:
        return not started or now == started
    if Path("/proc/self").is_dir():
        return False  # procfs answers for every live pid: this one is gone
    try:  # no procfs (macOS): signal 0 says whether the pid runs
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _kill(registered: dict[int, tuple[int, bool]]) -> None:
    """SIGKILL each bound process still running (its group where it leads one), then wait until they are gone."""
    for pid, (started, leader) in registered.items():
        if not _same_process(pid, started):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if leader:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and any(_running(pid, s) for pid, (s, _) in registered.items()):
        time.sleep(0.05)


def _running(pid: int, started: int) -> bool:
    """Alive and not a zombie (a killed child of a dead owner is reaped by init)."""
    if not _same_process(pid, started):
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def _serve(address: str) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # only the owner's end of the pipe ends the leash
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(64)
    os.write(1, _READY)
    os.close(1)
    registered: dict[int, tuple[int, bool]] = {}  # pid -> (start time, leads its process group)
    try:
        while True:
            readable, _, _ = select.select([0, server], [], [])
            if 0 in readable and not os.read(0, 4096):
                return  # the owner is gone
            if server in readable:
                conn, _ = server.accept()
                with conn:
                    conn.settimeout(5.0)
                    with contextlib.suppress(OSError, ValueError, IndexError):
                        words = conn.makefile("rb").readline().split()
                        if words[:1] == [b"bind"]:
                            pid, started = int(words[1]), int(words[2])
                            with contextlib.suppress(OSError):
                                registered[pid] = (started, os.getpgid(pid) == pid)
                        registered = {p: v for p, v in registered.items() if _running(p, v[0])}
                        conn.sendall(" ".join(["ok", *map(str, registered)]).encode() + b"\n")
    finally:
        _kill(registered)
        server.close()
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


if __name__ == "__main__":
    _serve(sys.argv[1])
