"""Run `embedstream` commands as a user does, in their own processes, and find what they leave behind.

Every process started here carries a marker in its environment (``EMBEDSTREAM_TEST_MARK``); processes
inherit it (the dev broker's JVM too), so ``leftovers(mark)`` lists exactly what a command started and
did not stop, whoever else runs on the machine. Every process a test starts goes through ``popen``: it is
bound to the test run (``embedstream.devkafka.leash``), so it dies with the run however the run ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from embedstream.devkafka import leash

CLI = [sys.executable, "-m", "embedstream.cli"]


def popen(cmd: list[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` bound to the test run: the process dies with the run, even if the run is killed -9."""
    proc = subprocess.Popen(cmd, **kwargs)
    try:
        leash.bind(proc.pid)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc


def command_env(tmp: Path, bootstrap: str | None = None, **extra: str) -> dict[str, str]:
    """The environment of a command run in a test: offline, its own store folder and a fresh marker."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               EMBEDSTREAM_QDRANT__PATH=str(tmp / "qdrant"), EMBEDSTREAM_TEST_MARK=uuid.uuid4().hex,
               EMBEDSTREAM_ENGINE__THREADS="1", EMBEDSTREAM_KAFKA_DATA_DIR=str(tmp / "kafka-data"))
    if bootstrap:
        env["EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS"] = bootstrap
    env.update(extra)
    return env


def leftovers(mark: str) -> list[int]:
    """Pids of live processes whose environment carries ``mark`` (zombies excluded)."""
    found = []
    needle = f"EMBEDSTREAM_TEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def command_line(pid: int) -> str:
    """The process's argv joined by spaces ("" once it is gone)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return ""
    return " ".join(a.decode(errors="replace") for a in argv if a)


def run(args: list[str], env: dict[str, str], timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    if check and done.returncode != 0:
        raise AssertionError(f"embedstream {' '.join(args)} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return done


class Service:
    """A long-running command (a worker, the gateway) in the background; SIGTERM (then SIGKILL) on exit."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.args, self.env, self.log_path = args, env, log
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Service:
        self.log = open(self.log_path, "wb")
        self.proc = popen([*CLI, *self.args], env=self.env, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __exit__(self, *exc) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


def http_status(url: str, data: bytes | None = None, timeout_s: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def wait_until(predicate, timeout_s: float, what: str, services: tuple[Service, ...] = ()) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return
        for service in services:
            if not service.alive():
                raise AssertionError(f"{' '.join(service.args)} ended while waiting for {what}:\n{service.output()[-5000:]}")
        time.sleep(0.5)
    logs = "\n".join(f"--- {' '.join(s.args)}\n{s.output()[-3000:]}" for s in services)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{logs}")
