"""Who goes first: every decision of the form "which request runs next, waits, or is refused".

Both workers (embed, rerank) ask one ``TurnPolicy`` per online lane; it reads top to bottom in the
order a request meets it:

1. **arrival** (``on_arrival``): admitted, with its effective deadline and predicted finish, or shed at
   once (its deadline already gone, or it cannot finish by it behind the work queued ahead and the
   passes running now);
2. **gathering** (``arrived``, ``gather``): how long a fresh batch waits for company (the window);
3. **its turn** (``at_turn``): run, or shed because its deadline is gone or its own pass's predicted
   compute ends after it (asked at the pass's door, after any retrieval);
4. **passes** (``running_pass``): a pass starts and ends; each kind (online, bulk) has its own stack,
   so a query pass run at a bulk pass's checkpoint ends only itself: the bulk pass it ran inside is
   still judged as running (what ``running_ms`` tells an arrival);
5. **replies** (``replied``): what the estimators learn from each answer;
6. **online first?** (``online_first``, ``step_aside``): the embed worker's one question, asked by
   intake (fetch queries before decoding more bulk), at a bulk pass's checkpoints (serve queries
   now) and by the output stage (a bulk write steps aside while a query's pass and reply go first).

The estimators it consults (compute model, latency tracker, deadlines: ``workers/admission.py``) stay
apart and transport-free; batch formation stays in ``workers/scheduler.py``. No Kafka types here:
items are anything with ``received`` (perf_counter seconds) and ``deadline_ms`` (epoch ms).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from embedstream.workers.admission import LaneController

ONLINE, BULK = "online", "bulk"


@dataclass(frozen=True)
class Arrival:
    """What ``on_arrival`` decided: ``shed`` (the reason) or admitted with its deadline and predicted finish."""

    shed: str | None
    deadline_ms: int = 0
    predicted_finish_ms: float = 0.0


class TurnPolicy:
    """One online lane's turn-taking over one engine (see the module doc).

    ``queued_online``: whether online work waits in its queue (the embed worker's online lane).
    ``max_aside_s``: the longest one ``step_aside`` delays a bulk step, so bulk progresses under any load."""

    def __init__(self, controller: LaneController, queued_online: Callable[[], bool] = lambda: False,
                 max_aside_s: float = 0.05, clock: Callable[[], float] = time.perf_counter):
        self.controller = controller
        self.queued_online = queued_online
        self.max_aside_s = max_aside_s
        self.clock = clock
        self._running: dict[str, list[float]] = defaultdict(list)  # per kind: until when an arrival waits for it
        self.aside_s = 0.0  # time bulk steps stood aside for online work, in total

    # -- 1. arrival ------------------------------------------------------------------------------
    def on_arrival(self, deadline_ms: int | None, now_ms: int, ahead: int, tokens: int,
                   max_pass_tokens: int | None = None, extra_ms: float = 0.0,
                   lane: LaneController | None = None) -> Arrival:
        """Admit or shed a request on arrival. ``ahead``: tokens (or pairs) queued before it; ``extra_ms``:
        predicted time outside the passes (a search's retrieval); ``lane``: the controller whose p95 counts
        a refusal of an expired request (default: this policy's)."""
        reason = (lane or self.controller).refuse_on_arrival(deadline_ms, now_ms)
        if reason is not None:
            return Arrival(reason)
        deadline = self.controller.deadlines.effective(deadline_ms, now_ms)
        running = self.running_ms()
        reason = self.controller.late(deadline, now_ms, ahead, tokens, max_pass_tokens, extra_ms, running_ms=running)
        finish = self.controller.predicted_finish(now_ms, ahead, tokens, max_pass_tokens, extra_ms + running)
        return Arrival(reason, deadline, finish)

    # -- 2. gathering ----------------------------------------------------------------------------
    def arrived(self, when: float, count: int) -> None:
        """A poll brought ``count`` requests at ``when`` (perf_counter seconds)."""
        self.controller.arrived(when, count)

    def gather(self, oldest, now_ms: int, poll: Callable[[], int], full: Callable[[], bool],
               queued_tokens: Callable[[], int]) -> None:
        """Let a fresh batch whose oldest request is ``oldest`` gather company while it is likely, never past
        that request's deadline budget; ``poll`` brings more and says how many."""
        if oldest is None:
            return
        deadline_s = self.controller.deadline_on_clock(oldest.deadline_ms, now_ms) if oldest.deadline_ms else None
        self.controller.gather(oldest.received, poll, full, deadline_s, queued_tokens)

    # -- 3. its turn -----------------------------------------------------------------------------
    def at_turn(self, deadline_ms: int, now_ms: int, ahead: int, tokens: int, max_pass_tokens: int | None = None,
                extra_ms: float = 0.0) -> str | None:
        """Why a request about to run would still miss its deadline (its own pass's compute), or None: run it."""
        return self.controller.late(deadline_ms, now_ms, ahead, tokens, max_pass_tokens, extra_ms, queued=False)

    # -- 4. passes -------------------------------------------------------------------------------
    @contextmanager
    def running_pass(self, kind: str, wait_ms: float) -> Iterator[None]:
        """A pass of ``kind`` runs inside the block; an arrival meanwhile waits ``wait_ms`` for it (all of it,
        or one step where it yields). Only this pass's own entry is removed when it ends."""
        runs = self._running[kind]
        runs.append(self.clock() + wait_ms / 1000)
        try:
            yield
        finally:
            runs.pop()

    def running_ms(self) -> float:
        """How long a request arriving now waits for the passes running (0 when none)."""
        now = self.clock()
        return max([0.0] + [(runs[-1] - now) * 1000 for runs in self._running.values() if runs])

    def computing(self, kind: str) -> bool:
        return bool(self._running[kind])

    def observed_pass(self, tokens: int, ms: float, kind: str = ONLINE) -> None:
        """A pass of ``tokens`` took ``ms`` (every kind refits the shared cost model; the lane's own passes
        also predict its requests' passes at their turn)."""
        self.controller.observed_pass(tokens, ms, own=kind == ONLINE)

    # -- 5. replies ------------------------------------------------------------------------------
    def replied(self, predicted_finish_ms: float, in_worker_ms: float, sent_at_ms: int | None, now_ms: int,
                lane: LaneController | None = None) -> None:
        """A request was answered: its latency (for ``lane``'s p95) and how wrong its predicted finish was."""
        (lane or self.controller).observed_reply(in_worker_ms, sent_at_ms, now_ms)
        self.controller.observed_finish(predicted_finish_ms, now_ms)

    # -- 6. online first? ------------------------------------------------------------------------
    def online_first(self) -> bool:
        """Online work is queued or in a pass: bulk host work steps aside, a bulk checkpoint serves it."""
        return self.computing(ONLINE) or self.queued_online()

    def step_aside(self, wait: Callable[[float], object] = time.sleep, step_s: float = 0.0005) -> float:
        """Before a bulk step: wait in steps of ``step_s`` while online work goes first, at most ``max_aside_s``
        (``wait`` may do useful work meanwhile, e.g. fetch queries); returns the seconds it stood aside."""
        if self.max_aside_s <= 0 or not self.online_first():
            return 0.0
        start = self.clock()
        while self.online_first() and self.clock() - start < self.max_aside_s:
            wait(step_s)
        aside = self.clock() - start
        self.aside_s += aside
        return aside
