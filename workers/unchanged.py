"""Unchanged chunks: which chunks of a batch need no embedding, because their stored point already matches.

The lookup is a store read, so it never runs on the stage that answers queries: it runs on a thread of
its own (``StoreReads``) while the caller waits for it at most ``wait_s``, with a ``wait`` that answers
queries meanwhile. A lookup the store never answers (a hung server) holds nobody; the chunks are then
embedded, and the upsert waits for the store on the output stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from embedstream import logs
from embedstream.schemas import ChunkEvent, DocumentDelete

log = logs.get("embedstream.worker")


class StoreReads:
    """A store read (the unchanged-chunk lookup) on a daemon thread of its own, one at a time. The caller waits
    for the answer as long as it chooses; a read the store never answers holds nobody, and while it is out
    ``start`` refuses the next one (None: go on without it)."""

    def __init__(self, read: Callable):
        self._read = read
        self._last: Future | None = None

    def start(self, *args) -> Future | None:
        if self._last is not None and not self._last.done():
            return None
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(self._read(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the answer
                future.set_exception(exc)

        threading.Thread(target=run, name="embedstream-store-read", daemon=True).start()
        self._last = future
        return future


class UnchangedChunks:
    """``find``: the chunks of a batch whose stored point already holds their content, model and metadata.

    ``wait(done, timeout_s)`` waits for ``done()`` at most ``timeout_s`` and says whether it came true."""

    def __init__(self, unchanged: Callable[[list[ChunkEvent]], list[bool]],
                 wait: Callable[[Callable[[], bool], float], bool], wait_s: float = 2.0):
        self.reads = StoreReads(unchanged)
        self.wait = wait
        self.wait_s = wait_s

    def find(self, items: list, batch: list, in_flight: Callable[[], set]) -> set[int]:
        """Ids of the ``items`` (of ``batch``) found unchanged: one lookup per collection. Never one that a
        delete earlier in the batch may remove, nor one whose document has writes on their way to the sink
        (``in_flight``: waited for first, so a redelivery right behind its first delivery is still found)."""
        deleted = deleted_earlier(batch)
        candidates = [i for i in items if isinstance(i.event, ChunkEvent) and id(i) not in deleted]
        if not candidates:
            return set()
        docs = {i.doc_key for i in candidates}
        self.wait(lambda: docs.isdisjoint(in_flight()), self.wait_s)
        busy = in_flight()
        chunks = [i for i in candidates if i.doc_key not in busy]
        if not chunks:
            return set()
        lookup = self.reads.start([i.event for i in chunks])
        if lookup is None or not self.wait(lookup.done, self.wait_s):
            log.warning("unchanged-chunk lookup unanswered; embedding the batch", waited_s=self.wait_s)
            return set()
        try:
            same = lookup.result()
        except Exception as exc:  # noqa: BLE001 - lookup failed: embed them all; the upsert retries the sink
            log.warning("unchanged-chunk lookup failed; embedding the batch", error=str(exc)[:300])
            return set()
        return {id(item) for item, hit in zip(chunks, same) if hit}


def deleted_earlier(batch: list) -> set[int]:
    """Items (by id) whose point a delete earlier in the batch may remove: the store will change under them.

    A tail delete (``from_chunk``) only reaches chunks at or beyond it, so the chunks of an update
    published again after its own tail delete (a redelivery) can still be skipped."""
    deletes: dict[str, list[DocumentDelete]] = {}
    out: set[int] = set()
    for item in batch:
        event = item.event
        if isinstance(event, DocumentDelete):
            deletes.setdefault(event.doc_id, []).append(event)
        elif isinstance(event, ChunkEvent) and any(_may_remove(d, event.chunk_id) for d in deletes.get(event.doc_id, ())):
            out.add(id(item))
    return out


def _may_remove(delete: DocumentDelete, chunk_id: int) -> bool:
    """Whether the delete reaches this chunk (the sink's rule: chunk_ids, else from_chunk, else everything)."""
    if delete.chunk_ids is not None:
        return chunk_id in delete.chunk_ids
    if delete.from_chunk is not None:
        return chunk_id >= delete.from_chunk
    return True
