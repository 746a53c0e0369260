"""Chunks that must go through the model after all: asked for by the output stage, embedded on the model stage.

A payload-only write that lost a race (its point changed between the lookup and the write: a write from the
other lane, under another name of the collection, or an old owner's late one) falls back to a full embed,
never to a torn point. Only the model stage runs the model, so the output stage asks (``ask``) and waits,
holding the writes behind it in log order; the model stage answers (``serve``) between its batches, while it
waits (for room in the output queue, for a lookup) and at a bulk pass's checkpoints.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from concurrent.futures import Future


class EmbedAgain:
    """Requests of the output stage (items to embed) and their answers (one vector per item, in order)."""

    def __init__(self):
        self._asked: queue.SimpleQueue[tuple[list, Future]] = queue.SimpleQueue()

    def ask(self, items: list) -> Future:
        future: Future = Future()
        self._asked.put((items, future))
        return future

    def serve(self, forward: Callable[[list], list]) -> None:
        """On the model stage: embed what was asked (``forward(items)`` -> vectors); a failure goes to the asker."""
        while True:
            try:
                items, future = self._asked.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(forward(items))
            except Exception as exc:  # noqa: BLE001 - the asker dead-letters the items with the reason
                future.set_exception(exc)
