"""Bulk-side host work steps aside while online work is queued or computing.

One worker process runs intake, model and output on threads that share the GIL and, here, 2 cores
with the broker and the clients. Under a bulk backlog the bulk side's Python work (decoding a slice of
256 chunk events, building and upserting a batch of points) ran beside the pass a query waited on:
measured with a 400-document backlog, a query's forward went from 7.7 to 13 ms at p95 and its trips
in and out of Kafka from ~3.5 to ~6 ms each. ``OnlineFirst.hold`` makes a bulk step wait while online
work is pending, at most ``max_hold_s`` at a time, so bulk still progresses under any online load.
Transport-free: ``pending`` and ``wait`` are injected (unit-tested with a fake clock).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class OnlineFirst:
    """``hold()`` before a bulk step: returns once no online work is pending, or after ``max_hold_s``."""

    def __init__(self, pending: Callable[[], bool], max_hold_s: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter):
        self.pending = pending
        self.max_hold_s = max_hold_s
        self.clock = clock
        self.held_s = 0.0  # in total

    def hold(self, wait: Callable[[float], object] = time.sleep, step_s: float = 0.0005) -> float:
        """Wait in steps of ``step_s`` (``wait`` may do useful work meanwhile, e.g. fetch online records);
        returns the seconds held."""
        if self.max_hold_s <= 0 or not self.pending():
            return 0.0
        start = self.clock()
        while self.pending() and self.clock() - start < self.max_hold_s:
            wait(step_s)
        held = self.clock() - start
        self.held_s += held
        return held
