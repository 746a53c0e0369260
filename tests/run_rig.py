"""What every test run does around its tests: evidence of a native crash or a hang, and the leak guard.

Evidence goes to the run folder (``EMBEDSTREAM_TEST_RUN_DIR``, else ``<tmp>/embedstream-test-run-<broker
port>``), in files named by the test process's pid, written outside pytest's output capture so they
survive a process that dies:

* ``faults-<pid>.log``: Python's faulthandler, every thread's stack on SIGSEGV, SIGFPE, SIGABRT, SIGBUS,
  SIGILL, and on ``kill -USR1 <pid>`` (a look at a run that seems stuck);
* ``progress-<pid>.log``: one line as each test starts and ends (time, load average, test id, outcome),
  so the test a crashed run was in is known;
* ``hang-<pid>-<n>.txt``: ``py-spy dump --native`` (every thread, Python and native frames) of a test
  still running after ``EMBEDSTREAM_TEST_HANG_DUMP_S`` seconds (default 300), before pytest-timeout ends it;
* core dumps: the soft core-size limit is raised to the hard one; where the kernel writes them is its
  ``core_pattern`` (``core`` alone: the run's working directory).

``scripts/test.sh`` prints these files when the run fails. The leak guard fails the test that leaves a
worker thread, a non-daemon thread, a child process or a bound service (``leash``) running when it ends.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path

import pytest

from embedstream.devkafka import leash

HANG_DUMP_S = float(os.environ.get("EMBEDSTREAM_TEST_HANG_DUMP_S", "300"))
LEAK_GRACE_S = 15.0  # how long a test's threads and processes get to end after it
_THREAD_MODULES = ("embedstream", "workers", "http.server", "socketserver")  # whose threads are workers' threads


def run_dir() -> Path:
    env = os.environ.get("EMBEDSTREAM_TEST_RUN_DIR")
    port = os.environ.get("EMBEDSTREAM_TEST_KAFKA_PORT", "19092")
    folder = Path(env) if env else Path(tempfile.gettempdir()) / f"embedstream-test-run-{port}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


class Evidence:
    """The run's evidence files and the hang watchdog (one per test process: ``Evidence.current``)."""

    current: Evidence

    @classmethod
    def begin(cls) -> None:
        cls.current = cls(run_dir())

    @classmethod
    def end(cls) -> None:
        text = cls.current.close()
        if text:
            sys.stderr.write(f"\n---- {cls.current.faults_path} ----\n{text}\n")

    def __init__(self, folder: Path):
        pid = os.getpid()
        self.folder = folder
        self.faults_path = folder / f"faults-{pid}.log"
        self.faults = open(self.faults_path, "w")  # noqa: SIM115 - open for the life of the process
        self.progress = open(folder / f"progress-{pid}.log", "a", buffering=1)  # noqa: SIM115
        self.running: tuple[str, float] | None = None
        self.outcomes: list[str] = []
        self.dumps = 0
        faulthandler.enable(file=self.faults, all_threads=True)
        faulthandler.register(signal.SIGUSR1, file=self.faults, all_threads=True, chain=False)
        with contextlib.suppress(ValueError, OSError):
            _soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
            resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
        threading.Thread(target=self._watch, name="test-hang-watchdog", daemon=True).start()

    def started(self, nodeid: str) -> None:
        self.running = (nodeid, time.monotonic())
        self.outcomes = []
        self._line(f"start {nodeid}")

    def outcome(self, what: str) -> None:
        self.outcomes.append(what)

    def finished(self, nodeid: str) -> None:
        took = time.monotonic() - self.running[1] if self.running else 0.0
        self.running = None
        self._line(f"end   {nodeid} {' '.join(self.outcomes)} {took:.1f}s")

    def hang_dumps(self) -> list[Path]:
        return sorted(self.folder.glob(f"hang-{os.getpid()}-*.txt"))

    def _line(self, text: str) -> None:
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else -1
        self.progress.write(f"{time.strftime('%H:%M:%S')} load {load:5.2f} {text}\n")

    def _watch(self) -> None:
        dumped = None
        while True:
            time.sleep(5)
            current = self.running
            if current is None or current[0] == dumped or time.monotonic() - current[1] < HANG_DUMP_S:
                continue
            dumped = current[0]
            self.dump(f"{current[0]} still running after {HANG_DUMP_S:.0f} s")

    def dump(self, why: str) -> Path:
        """Every thread's stack, native frames too (py-spy), else Python's (faulthandler)."""
        self.dumps += 1
        path = self.folder / f"hang-{os.getpid()}-{self.dumps}.txt"
        with open(path, "w") as out:
            out.write(f"{time.strftime('%H:%M:%S')} {why}\n")
            out.flush()
            spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            try:
                subprocess.run([spy, "dump", "--native", "--pid", str(os.getpid())], stdout=out,
                               stderr=subprocess.STDOUT, timeout=120, check=True)
            except (OSError, subprocess.SubprocessError) as exc:
                out.write(f"py-spy dump failed ({exc}); Python stacks instead:\n")
                out.flush()
                faulthandler.dump_traceback(file=out, all_threads=True)
        self._line(f"hang dump {path.name}: {why}")
        return path

    def close(self) -> str:
        """The faults file's text (a fault the process survived, a SIGUSR1 dump); empty files are removed."""
        faulthandler.disable()
        faulthandler.unregister(signal.SIGUSR1)
        self.faults.close()
        text = self.faults_path.read_text()
        if not text:
            self.faults_path.unlink(missing_ok=True)
        return text


# -- the leak guard ---------------------------------------------------------------------------------------
def _counts(thread: threading.Thread) -> bool:
    """A thread that must not outlive its test: one of ours (a worker, a stage, a server), or a non-daemon one
    (it would hold the interpreter at exit), except a library's idle executor worker (transformers loads
    weights on a pool it shuts down without waiting; Python stops such workers at exit)."""
    target = getattr(thread, "_target", None)
    module = getattr(target, "__module__", None) or type(thread).__module__
    if thread.name.startswith("embedstream") or module.split(".")[0] in _THREAD_MODULES:
        return _stopped(getattr(target, "__self__", None))
    return not thread.daemon and module != "concurrent.futures.thread"


def _stopped(owner) -> bool:
    """Whether the worker a thread serves was asked to stop (its loop, or a stage of it). A worker not asked
    to stop belongs to a fixture that outlives the test (a module's gateway stack starts its stages after
    the test began); threads with no worker to ask count as soon as they outlive their test."""
    from embedstream.workers.stages import Stage

    if isinstance(owner, Stage):
        return bool(owner._halted())
    stop = getattr(owner, "stop_event", None)
    return stop.is_set() if stop is not None else True


def _children() -> set[int]:
    import psutil

    out = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.status() != psutil.STATUS_ZOMBIE:
                out.add(child.pid)
    return out


def _running_services() -> dict[int, str]:
    """Pid -> command line of the processes below this one and of those bound to the run."""
    out = {}
    for pid in set(leash.bound()) | _children():
        with contextlib.suppress(OSError):
            out[pid] = Path(f"/proc/{pid}/cmdline").read_text()
    return out


SHARED: set[int] = set()  # processes of module- or session-scoped fixtures: theirs to stop, not a test's


def shared(pid: int) -> None:
    """Declare a process that a fixture of a wider scope started (maybe inside a test, through
    ``request.getfixturevalue``) and will stop itself: no test is blamed for it running on."""
    SHARED.add(pid)


def _new_services(before: dict[int, str]) -> list[int]:
    """Processes started since ``before`` that are not a restart of one of them (same command line: a test
    that restarts the session's broker or PostgreSQL leaves its replacement running, on purpose)."""
    now = _running_services()
    gone = Counter(cmd for pid, cmd in before.items() if pid not in now)
    new = []
    for pid, cmd in sorted(now.items()):
        if pid in before or pid == os.getpid() or pid in SHARED:
            continue
        if gone[cmd] > 0:
            gone[cmd] -= 1
        else:
            new.append(pid)
    return new


def _describe(pid: int) -> str:
    from process_rig import command_line

    return f"{pid} ({command_line(pid)[:200]})"


@contextlib.contextmanager
def nothing_left_running():
    """Fails the test that leaves threads of ours, non-daemon threads or processes running (after a grace);
    leftover processes are killed so they cannot disturb the next test."""
    threads = set(threading.enumerate())
    pids = _running_services()
    yield
    deadline = time.monotonic() + LEAK_GRACE_S
    while True:
        stray = [t for t in threading.enumerate() if t not in threads and t.is_alive() and _counts(t)]
        strays = _new_services(pids)
        if not (stray or strays) or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    if stray or strays:
        frames = sys._current_frames()
        what = [f"thread {t.name!r} (daemon={t.daemon}, target={getattr(t, '_target', None)!r}), now in:\n"
                + "".join(traceback.format_stack(frames[t.ident], limit=12)) if t.ident in frames else
                f"thread {t.name!r} (daemon={t.daemon})" for t in stray]
        what += [f"process {_describe(pid)}" for pid in sorted(strays)]
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL) if os.getpgid(pid) == pid else os.kill(pid, signal.SIGKILL)
        pytest.fail("the test left running after it ended:\n  " + "\n  ".join(what), pytrace=False)
