"""Batch formation for the embed worker, without Kafka: which queued work runs in the next pass.

The policy, in the spirit of text-embeddings-inference's transport-free queue:
* online work is taken first, a FIFO prefix up to the engine's token and sequence budget;
* bulk work only fills the token budget online work leaves (or runs alone when online is idle);
* while online traffic is recent (its last record less than ``online_quiet_s`` ago), a bulk-only
  batch is capped at ``bulk_slice_tokens``, so a query that arrives during a bulk forward pass
  waits for at most one short slice (a full 8,192-token CPU pass takes seconds);
* items are taken as a FIFO prefix, so deletes (they cost no tokens) keep their log position
  relative to the chunks around them and are applied in that order when the batch is written.

Items are anything with a ``tokens`` count; the queues know nothing of consumers or offsets.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, Protocol, TypeVar

from embedstream.engine.batcher import BatchLimits, take_prefix


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
    """Online first; bulk fills what is left; bulk sliced while online traffic is recent."""

    def __init__(self, limits: BatchLimits, bulk_slice_tokens: int, online_quiet_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.bulk_slice_tokens = bulk_slice_tokens
        self.online_quiet_s = online_quiet_s
        self.clock = clock
        self._last_online: float | None = None

    def online_arrived(self) -> None:
        """Online records just arrived: bulk stays sliced for the next ``online_quiet_s``."""
        self._last_online = self.clock()

    def online_recent(self) -> bool:
        return self._last_online is not None and self.clock() - self._last_online < self.online_quiet_s

    def next_batch(self, online: WorkQueue | None, bulk: WorkQueue | None) -> list:
        """The next pass: a prefix of online, topped up with a prefix of bulk (either lane may be absent)."""
        batch = self._take(online, 0, 0, self.limits.max_batch_tokens) if online is not None else []
        if bulk is not None:
            sliced = not batch and online is not None and self.online_recent()
            cap = self.bulk_slice_tokens if sliced else self.limits.max_batch_tokens
            batch += self._take(bulk, sum(item.tokens for item in batch), len(batch), cap)
        return batch

    def _take(self, queue: WorkQueue, used_tokens: int, used_requests: int, max_tokens: int) -> list:
        if not queue:
            return []
        budget = BatchLimits(min(max_tokens, self.limits.max_batch_tokens), self.limits.max_batch_requests)
        count = take_prefix(queue.lengths(), budget, used_tokens, used_requests)
        if count == 0 and used_requests == 0:
            count = 1  # an item larger than the slice still runs, alone
        return queue.take(count)
