"""Which offsets may be committed: only a contiguous run of finished records per partition.

A record is finished when its vector is durably in Qdrant, its reply was sent, or it went to the
dead-letter topic. Committing the contiguous prefix means a crash can only cause redelivery (which
the idempotent sink absorbs), never loss.

A handle is ``[offset, done, revoked]``. Only the thread that owns the consumer tracks, drains and
forgets; other threads (the embed worker's output stage, the producer's acknowledgement callbacks)
only set ``done`` on a handle, or read ``revoked`` to abandon work whose partition moved away.
"""

from __future__ import annotations

from collections import deque


class OffsetTracker:
    """Per (topic, partition): offsets in intake order and whether each is finished."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, int], deque[list]] = {}
        self._committable: dict[tuple[str, int], int] = {}
        self._drained: dict[tuple[str, int], int] = {}  # the last offset each partition's drain returned

    def track(self, topic: str, partition: int, offset: int) -> list:
        """Register a record at intake; returns its handle for ``done``."""
        handle = [offset, False, False]
        self._pending.setdefault((topic, partition), deque()).append(handle)
        return handle

    @staticmethod
    def done(handle: list) -> None:
        handle[1] = True

    @staticmethod
    def revoked(handle: list) -> bool:
        """Whether the record's partition was taken away (its work is redelivered to the new owner)."""
        return handle[2]

    def drain(self) -> dict[tuple[str, int], int]:
        """Next offsets to commit (last finished contiguous offset + 1), cleared once returned."""
        for tp, queue in self._pending.items():
            while queue and queue[0][1]:
                self._committable[tp] = queue.popleft()[0] + 1
        out, self._committable = self._committable, {}
        self._drained.update(out)
        return out

    def in_flight(self, tp: tuple[str, int]) -> bool:
        """Some record of ``tp`` was handed out and not yet drained."""
        return bool(self._pending.get(tp))

    def window(self) -> int:
        """Records handed out and not yet drained, over all partitions: what a failure now could deliver again."""
        return sum(len(queue) for queue in list(self._pending.values()))

    def past_skipped(self, tp: tuple[str, int], position: int | None) -> int | None:
        """The consumer's ``position`` as the offset to commit, when it is past everything this tracker gave
        out for ``tp`` and nothing of the partition is in flight: the offsets between were never delivered
        (transaction markers, aborted records the client filtered out). Without it a partition whose log
        ends in a commit marker never reaches lag 0. None otherwise."""
        if position is None or self._pending.get(tp) or position <= self._drained.get(tp, -1):
            return None
        self._drained[tp] = position
        return position

    def retry(self, offsets: dict[tuple[str, int], int]) -> None:
        """Put back drained offsets whose commit failed; the next drain returns them (or later ones)."""
        for tp, offset in offsets.items():
            self._committable[tp] = max(offset, self._committable.get(tp, offset))

    def forget(self, partitions: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Drop state for partitions this worker no longer owns (after a rebalance); their handles read revoked.

        Returns, per partition, the first offset not finished: where consumption must start again
        should the partition come back to this worker."""
        unfinished: dict[tuple[str, int], int] = {}
        for tp in partitions:
            for handle in self._pending.pop(tp, ()):
                if not handle[1] and tp not in unfinished:
                    unfinished[tp] = handle[0]
                handle[2] = True
            self._committable.pop(tp, None)
            self._drained.pop(tp, None)
        return unfinished

    def outstanding(self) -> int:
        return sum(1 for q in self._pending.values() for h in q if not h[1])
