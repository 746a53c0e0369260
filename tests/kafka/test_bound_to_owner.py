"""Nothing a run starts outlives it (issue #33): a runner killed -9 mid-session takes its services along.

A child process plays a test run: it holds its own leash (as ``conftest.py`` does), starts a dev broker,
PostgreSQL and an embed worker process, says so and waits. The test kills the child's whole process
group with SIGKILL (no handler, no ``finally``, no fixture teardown runs), then checks that no process
carrying the child's marker is left, and that a broker and PostgreSQL start again at once on the same
ports and data dirs. Before the leash the broker and PostgreSQL (each in a session of its own) survived,
holding the ports, and the next run failed with "port already in use".
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import ports
import pytest
from process_rig import command_env, command_line, leftovers, popen, wait_until

from embedstream import devkafka
from embedstream.devcdc import postgres
from embedstream.devkafka import leash

pytestmark = pytest.mark.kafka

PORT = ports.port(ports.BOUND_TO_OWNER)  # the broker takes PORT + 1 too
PG_PORT = PORT + 2

CHILD = """
import subprocess, sys, time
sys.path.insert(0, {tests!r})
from process_rig import popen
from embedstream import devkafka
from embedstream.devcdc import postgres
from embedstream.devkafka import leash

port, pg_port, folder = {port}, {pg_port}, {folder!r}
leash.hold()
info = devkafka.start(port=port, data_dir=folder + "/kafka")
postgres.start(pg_port, folder + "/pg")
popen([sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", "bulk", "--metrics-port", "0"],
      stdin=open("/dev/null"), stdout=open(folder + "/worker.log", "wb"), stderr=subprocess.STDOUT)
print("running", flush=True)
time.sleep(900)
"""


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline() if ready else ""


def _names(pids: list[int]) -> list[str]:
    return [line for line in map(command_line, pids) if line]


@pytest.fixture
def folder():
    """PostgreSQL runs as 'postgres' when the tests run as root: its folder must be reachable (not under tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix="embedstream-test-owner-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(600)
def test_a_runner_killed_minus_9_leaves_nothing_running_and_its_ports_free(folder):
    env = command_env(folder)
    env.pop(leash.ENV, None)  # the child holds its own leash, as a test run does
    env.pop("EMBEDSTREAM_KAFKA_DATA_DIR", None)
    code = CHILD.format(tests=str(Path(__file__).parents[1]), port=PORT, pg_port=PG_PORT, folder=str(folder))
    child = popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                  start_new_session=True)
    try:
        line = _read_line(child, 300)
        if line.strip() != "running":
            child.kill()
            pytest.fail(f"the child runner did not start its services:\n{line}{child.stdout.read()[-5000:]}")
        started = _names(leftovers(env["EMBEDSTREAM_TEST_MARK"]))
        assert any("kafka.Kafka" in s for s in started), started
        assert any("postgres -D" in s for s in started), started
        assert any("worker embed" in s for s in started), started
        os.killpg(child.pid, signal.SIGKILL)  # the runner and its process group, with no chance to clean up
        child.wait(30)
        wait_until(lambda: not leftovers(env["EMBEDSTREAM_TEST_MARK"]), 30, "every process the runner started to end")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait(30)
        child.stdout.close()
        for pid in leftovers(env["EMBEDSTREAM_TEST_MARK"]):  # only when the test fails: leave nothing behind
            os.kill(pid, signal.SIGKILL)
    # the next run: its services start at once on the same ports and data dirs
    info = devkafka.start(port=PORT, data_dir=folder / "kafka")
    try:
        pg = postgres.start(PG_PORT, folder / "pg")
        try:
            assert postgres.psql(pg, "SELECT 1").strip() == "1"
        finally:
            postgres.stop(PG_PORT, folder / "pg", mode="immediate")
    finally:
        devkafka.stop(port=PORT, data_dir=folder / "kafka")
    assert info.port == PORT
