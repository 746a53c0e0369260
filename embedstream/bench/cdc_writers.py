"""The writers of ``bench cdc``: processes, each with its own PostgreSQL connection, committing the UPDATEs handed
to them one transaction each, as many applications' connections do.

Processes, not threads: the bench's own process runs the bridge, the embed worker and the readers, and the one
writer it had there competed with them for the GIL and the CPU (it reached ~150 commits/s of the 200 asked at load
27-44). Each writer takes the next change from one shared queue (whichever is free), commits it, and reports the
wall time right after its COMMIT returned and how long the UPDATE took.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time

_POLL_S = 0.5  # a writer looks this often whether the bench is still there (it exits when its parent is gone)


def _write(dsn: str, todo, done, parent: int, session: dict) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for name, value in session.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        done.put(("ready", os.getpid(), 0.0))
        while True:
            try:
                job = todo.get(timeout=_POLL_S)
            except queue.Empty:
                if os.getppid() != parent:
                    return
                continue
            if job is None:
                return
            key, sql, params = job
            began = time.perf_counter()
            conn.execute(sql, params)  # autocommit: one UPDATE, one transaction
            done.put((key, time.time(), time.perf_counter() - began))


class Writers:
    """``count`` writer processes; ``submit`` hands a change to the next free one, ``commits`` collects when
    each was committed (key -> epoch seconds) and ``round_trips`` how long its UPDATE took (key -> seconds).
    ``session``: settings each writer's connection sets first (e.g. ``synchronous_commit``)."""

    def __init__(self, dsn: str, count: int, start_s: float = 120.0, session: dict[str, str] | None = None):
        if count < 1:
            raise ValueError("at least one writer")
        ctx = mp.get_context("spawn")  # the bench process runs torch and Kafka threads: never fork it
        self.todo, self.done = ctx.Queue(), ctx.Queue()
        self.count = count
        self.procs = [ctx.Process(target=_write, args=(dsn, self.todo, self.done, os.getpid(), dict(session or {})),
                                  daemon=True,
                                  name=f"embedstream-bench-writer-{i}") for i in range(count)]
        for proc in self.procs:
            proc.start()
        self.submitted = 0
        self.committed: dict = {}
        self.round_trips: dict = {}
        ready, deadline = 0, time.monotonic() + start_s
        while ready < count:
            try:
                key, _, _ = self.done.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                self.close()
                raise RuntimeError(f"{count - ready} of {count} bench writers did not connect within {start_s:.0f} s")
            ready += key == "ready"

    def submit(self, key, sql: str, params: tuple) -> None:
        self.todo.put((key, sql, params))
        self.submitted += 1

    def commits(self) -> dict:
        """Every commit reported so far (key -> time.time() after its COMMIT returned)."""
        while True:
            try:
                key, when, took = self.done.get_nowait()
            except queue.Empty:
                return self.committed
            self.committed[key] = when
            self.round_trips[key] = took

    def outstanding(self) -> int:
        """Changes handed on and not yet reported committed."""
        return self.submitted - len(self.commits())

    def drain(self, timeout_s: float = 30.0) -> dict:
        """Wait until every submitted change is reported (at most ``timeout_s``); every commit so far."""
        deadline = time.monotonic() + timeout_s
        while self.outstanding() > 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.committed

    def close(self) -> None:
        for _ in self.procs:
            self.todo.put(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for q in (self.todo, self.done):
            q.close()
            q.cancel_join_thread()
