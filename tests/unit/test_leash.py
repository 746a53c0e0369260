"""The leash (embedstream/devkafka/leash.py): what an owner and its children bind dies with the owner, however
the owner ends; what nobody bound is left alone. Plain processes here (``sleep``); the dev services on the real
broker: tests/kafka/test_bound_to_owner.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import wait_for

from embedstream.devkafka import leash

OWNER = """
import subprocess, sys, time
from embedstream.devkafka import leash
leash.hold()
mine = subprocess.Popen(["sleep", "600"], start_new_session=True)  # a service in a session of its own
leash.bind(mine.pid)
child = subprocess.Popen([sys.executable, "-c",
    "import subprocess, time; from embedstream.devkafka import leash; "
    "p = subprocess.Popen(['sleep', '601']); leash.bind(p.pid); print(p.pid, flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True)
grandchild = int(child.stdout.readline())
free = subprocess.Popen(["sleep", "602"], start_new_session=True)  # started, never bound
print(mine.pid, grandchild, free.pid, child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_what_an_owner_and_its_children_bind_dies_when_the_owner_is_killed_minus_9():
    env = {k: v for k, v in os.environ.items() if k != leash.ENV}
    owner = subprocess.Popen([sys.executable, "-c", OWNER], env=env, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        mine, grandchild, free, child = map(int, owner.stdout.readline().split())
        assert all(_alive(pid) for pid in (mine, grandchild, free))
        os.killpg(owner.pid, signal.SIGKILL)  # the owner's whole group: the leash is not in it
        owner.wait(10)
        wait_for(lambda: not _alive(mine) and not _alive(grandchild), 30, "the bound processes to die")
        assert _alive(free), "a process nobody bound was killed"
    finally:
        for pid in (free, child):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        owner.stdout.close()


def test_without_an_owner_nothing_is_bound():
    """``embedstream dev kafka start`` outside a test run or a borrowed broker: the service outlives the command."""
    saved = os.environ.pop(leash.ENV, None)
    try:
        assert leash.bind(os.getpid()) is False
        assert leash.bound() == []
    finally:
        if saved is not None:
            os.environ[leash.ENV] = saved


def test_a_reused_pid_is_not_killed():
    """A bound pid that exited and came back as another process (another start time) is not the bound one."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        started = leash.start_time(proc.pid)
        assert leash._same_process(proc.pid, started)
        assert not leash._same_process(proc.pid, started + 1)
    finally:
        proc.kill()
        proc.wait()
    time.sleep(0.1)
    assert not leash._same_process(proc.pid, started)
