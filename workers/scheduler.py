"""Batch formation for the embed worker, without Kafka: which queued work runs in the next pass.

In the spirit of text-embeddings-inference's transport-free queue:
* online work is taken first, a FIFO prefix up to the engine's token and sequence budget;
* bulk only fills the token budget online work leaves (or runs alone when online is idle);
* while online traffic is recent (``online_quiet_s``), a bulk-only pass is capped at
  ``bulk_slice_tokens``, smaller still while online is at risk (what the compute model says still
  fits before a query inside its target, at least ``min_slice_tokens``, times the pass's yield points);
* bulk tops an online pass up only with tokens whose marginal cost stays within ``TOP_UP_SHARE`` of the
  target, and ``bulk_paused`` is raised while the online p95 is over its target even with shrunk slices
  (the bulk lane pauses its partitions on it);
* items are taken as FIFO prefixes, so deletes (no tokens) keep their log position.

Items are anything with a ``tokens`` count; the queues know nothing of consumers or offsets.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from embedstream.engine.batcher import BatchLimits, take_prefix
from embedstream.workers.admission import LaneController


class Costed(Protocol):
    @property
    def tokens(self) -> int: ...


T = TypeVar("T", bound=Costed)


class WorkQueue(Generic[T]):
    """A lane's decoded work in log order, with the running token count backpressure looks at."""

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self.tokens = 0

    def push(self, item: T) -> None:
        self._items.append(item)
        self.tokens += item.tokens

    def take(self, count: int) -> list[T]:
        taken = [self._items.popleft() for _ in range(min(count, len(self._items)))]
        self.tokens -= sum(item.tokens for item in taken)
        return taken

    def keep(self, wanted: Callable[[T], bool]) -> None:
        """Drop every item ``wanted`` refuses (e.g. work of partitions another worker now owns)."""
        self._items = deque(item for item in self._items if wanted(item))
        self.tokens = sum(item.tokens for item in self._items)

    def lengths(self) -> list[int]:
        return [item.tokens for item in self._items]

    def take_where(self, wanted: Callable[[T], bool], limits: BatchLimits) -> list[T]:
        """A FIFO prefix, within ``limits``, of the items ``wanted`` picks (at least one when any); the others
        keep their places (e.g. the queries of an online queue, while its chunks wait for the sink)."""
        picked = [item for item in self._items if wanted(item)]
        count = take_prefix([item.tokens for item in picked], limits) or min(1, len(picked))
        chosen = {id(item) for item in picked[:count]}
        if chosen:
            self.keep(lambda item: id(item) not in chosen)
        return picked[:count]

    @property
    def oldest(self) -> T | None:
        return self._items[0] if self._items else None

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)


class Scheduler:
    """Online first; bulk fills what is left; bulk sliced while online traffic is recent, smaller while at risk."""

    TOP_UP_SHARE = 0.1  # of the online target: the most bulk top-up may add to an online pass
    PAUSE_MAX_S = 2.0  # longest bulk pause, and the least time between two

    def __init__(self, limits: BatchLimits, bulk_slice_tokens: int, online_quiet_s: float,
                 clock: Callable[[], float] = time.monotonic, admission: LaneController | None = None,
                 min_slice_tokens: int = 32):
        self.limits = limits
        self.bulk_slice_tokens = bulk_slice_tokens
        self.online_quiet_s = online_quiet_s
        self.clock = clock
        self.admission = admission
        self.min_slice_tokens = min(min_slice_tokens, bulk_slice_tokens)
        self.yield_points = 1  # checkpoints per pass where online work may run (engine/yield_points.py)
        self.bulk_paused = False  # read by the intake: pause the bulk partitions while set
        self._paused_at = self._resumed_at = -1e9
        self._last_online: float | None = None
        self._online_tokens = 0.0  # smoothed tokens of an online request (what a bulk slice must leave room for)

    def online_arrived(self) -> None:
        """Online records just arrived: bulk stays sliced for the next ``online_quiet_s``."""
        self._last_online = self.clock()

    def online_recent(self) -> bool:
        return self._last_online is not None and self.clock() - self._last_online < self.online_quiet_s

    def next_batch(self, online: WorkQueue | None, bulk: WorkQueue | None) -> list:
        """The next pass: a prefix of online, topped up with a prefix of bulk (either lane may be absent)."""
        batch = self._take(online, 0, 0, self.limits.max_batch_tokens) if online is not None else []
        for item in batch:
            if item.tokens:
                self._online_tokens = item.tokens if not self._online_tokens else 0.9 * self._online_tokens + 0.1 * item.tokens
        if bulk is not None:
            self.update_pause()
            used = sum(item.tokens for item in batch)
            if batch:
                cap = self.limits.max_batch_tokens if self.admission is None else self._top_up_cap(used)
            elif online is not None and self.online_recent():
                cap = self.bulk_cap()
            else:
                cap = self.limits.max_batch_tokens
            if not batch or cap > used:
                batch += self._take(bulk, used, len(batch), cap)
        return batch

    def bulk_cap(self) -> int:
        """Tokens of a bulk-only pass while online traffic is recent: the slice, or while online is at
        risk, what still fits before an online request inside its target (never under ``min_slice_tokens``);
        a pass with ``yield_points`` checkpoints makes a query wait for one step of it, not all of it."""
        if self.admission is None or not self.admission.at_risk():
            return self.bulk_slice_tokens
        fit = self.admission.pass_tokens_beside(round(self._online_tokens)) * self.yield_points
        return max(self.min_slice_tokens, min(self.bulk_slice_tokens, fit))

    def _top_up_cap(self, used: int) -> int:
        """Tokens an online pass may hold with bulk in it: its own, plus bulk whose marginal compute (the
        cost model's per-token slope) stays within ``TOP_UP_SHARE`` of the target; none before any pass."""
        assert self.admission is not None
        if self.admission.model.passes == 0:
            return used
        extra = self.admission.model.marginal_tokens_within(self.TOP_UP_SHARE * self.admission.config.target_ms)
        return min(self.limits.max_batch_tokens, used + extra)

    def update_pause(self) -> bool:
        """Raise or clear ``bulk_paused`` from the online p95 now (also called by the bulk lane before each
        poll: with nothing queued no batch is formed, and a pause must still end once online is calm).

        Raised while the p95 is over the target even with shrunk slices; cleared once it is under
        ``NEAR`` x the target, or after ``PAUSE_MAX_S``, and not raised again for as long: the trip
        through Kafka alone can hold a p95 near the target, and bulk must still progress then."""
        if self.admission is None:
            return self.bulk_paused
        now = self.clock()
        p95 = self.admission.latency.p95()
        target = self.admission.config.target_ms
        if self.bulk_paused:
            if p95 is None or p95 < self.admission.NEAR * target or now - self._paused_at >= self.PAUSE_MAX_S:
                self.bulk_paused = False
                self._resumed_at = now
        elif (p95 is not None and p95 > target and self.bulk_cap() < self.bulk_slice_tokens
              and now - self._resumed_at >= self.PAUSE_MAX_S):
            self.bulk_paused = True
            self._paused_at = now
        return self.bulk_paused

    def _take(self, queue: WorkQueue, used_tokens: int, used_requests: int, max_tokens: int) -> list:
        if not queue:
            return []
        budget = BatchLimits(min(max_tokens, self.limits.max_batch_tokens), self.limits.max_batch_requests)
        count = take_prefix(queue.lengths(), budget, used_tokens, used_requests)
        if count == 0 and used_requests == 0:
            count = 1  # an item larger than the slice still runs, alone
        return queue.take(count)
