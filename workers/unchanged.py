"""Chunks that need no forward pass, because the store already holds what they would write.

Per chunk (:class:`StoredChunks`): its point holds its text (the worker's own hash) and model ->
``same`` when the metadata is the same too (nothing to write), else ``payload`` (its payload alone is
rewritten); another point of its document holds its text and model (a chunk moved by an edit before
it) -> ``vectors`` (those vectors are written under its id); otherwise it is embedded. One mechanism
serves every path that sends a document again: CDC changes, ``produce --replace`` and re-index replays.

The lookup is a store read, so it never runs on the stage that answers queries: it runs on a thread of
its own (``StoreReads``) while the caller waits for it at most ``wait_s``, with a ``wait`` that answers
queries meanwhile. A lookup the store never answers (a hung server) holds nobody; the chunks are then
embedded, and the upsert waits for the store on the output stage.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from embedstream import logs
from embedstream.schemas import ChunkEvent, DocumentDelete
from embedstream.vectorstore.base import Point, VectorSpec
from embedstream.workers.sink import SAME, QdrantSink, Reuse, layout_keys, point_id, user_metadata
from embedstream.workers.trust import content_hash

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


@dataclass(frozen=True)
class _Indexed:
    """An event with its place in the lookup's list."""

    index: int
    event: ChunkEvent


class StoredChunks:
    """``lookup``: per chunk event, what the sink's store holds that spares its forward pass."""

    def __init__(self, sink: QdrantSink):
        self.sink = sink

    def lookup(self, events: list[ChunkEvent]) -> list[Reuse | None]:
        """Per event a :class:`Reuse`, or None: embed it.

        One payload read per target collection, and one read of the stored points (with vectors) of the
        documents with chunks missed there. Events are taken in order: an earlier event of
        the list writes its point first, so a later one of the same point is ``same`` when it wants what
        that one writes, and otherwise can only reuse vectors (they do not depend on what the point holds).
        """
        model = self.sink.spec.name
        out: list[Reuse | None] = [None] * len(events)
        for collection, members in self.sink.by_collection([_Indexed(i, e) for i, e in enumerate(events)]).items():
            ids = [point_id(m.event.doc_id, m.event.chunk_id) for m in members]
            stored = self.sink.store.get_payloads(collection, ids)
            written: dict[str, tuple] = {}  # point id -> what an earlier event of the list writes there
            missed: list[_Indexed] = []
            for m, pid in zip(members, ids):
                wanted = (content_hash(m.event.text), user_metadata(m.event.metadata))
                payload = None if pid in written else stored.get(pid)
                if pid in written and written[pid] == wanted:
                    out[m.index] = SAME
                elif payload is not None and (payload.get("content_hash"), payload.get("model")) == (wanted[0], model):
                    out[m.index] = SAME if user_metadata(payload) == wanted[1] else Reuse("payload", layout_keys(payload))
                else:
                    missed.append(m)
                written[pid] = wanted
            if missed:
                self._lend_vectors(collection, missed, out)
        return out

    def _lend_vectors(self, collection: str, missed: list[_Indexed], out: list) -> None:
        """A missed chunk: another point of its document with the same text and model lends its vectors, if
        they can be written as they are read. One read for every document of the missed chunks."""
        docs = sorted({m.event.doc_id for m in missed})
        by_text: dict[tuple, Point] = {}
        for point in self.sink.store.scroll(collection, "doc_id", docs, with_vectors=True):
            if point.payload.get("model") == self.sink.spec.name and self._restorable(point.vectors):
                by_text.setdefault((point.payload.get("doc_id"), point.payload.get("content_hash")), point)
        for m in missed:
            point = by_text.get((m.event.doc_id, content_hash(m.event.text)))
            if point is not None:
                out[m.index] = Reuse("vectors", layout_keys(point.payload), point.vectors)

    def _restorable(self, vectors: dict) -> bool:
        """Whether vectors read back can be written again as they are: every named vector the sink writes,
        uint8 ones as integers 0..255 (qdrant-client's local mode reads them back normalised: embedded again)."""
        if set(vectors) != set(self.sink.vectors):
            return False
        for name, spec in self.sink.vectors.items():
            if isinstance(spec, VectorSpec) and spec.datatype == "uint8":
                values = np.asarray(vectors[name], dtype=np.float64)
                if values.size and (values.min() < 0 or values.max() > 255 or not np.array_equal(values, np.round(values))):
                    return False
        return True


class UnchangedChunks:
    """``find``: the chunks of a batch that need no forward pass, with what the store holds for each.

    ``wait(done, timeout_s)`` waits for ``done()`` at most ``timeout_s`` and says whether it came true."""

    def __init__(self, lookup: Callable[[list[ChunkEvent]], list[Reuse | None]],
                 wait: Callable[[Callable[[], bool], float], bool], wait_s: float = 2.0):
        self.reads = StoreReads(lookup)
        self.wait = wait
        self.wait_s = wait_s

    def find(self, items: list, batch: list, in_flight: Callable[[], set]) -> dict[int, Reuse]:
        """id(item) -> its :class:`Reuse`, for the ``items`` (of ``batch``) that need no forward pass: one
        lookup for all. Never one that a delete earlier in the batch may remove, nor one whose document has
        writes on their way to the sink (``in_flight``: waited for first, so a redelivery right behind its
        first delivery is still found, and a payload write never lands under a text change still on its way)."""
        deleted = deleted_earlier(batch)
        candidates = [i for i in items if isinstance(i.event, ChunkEvent) and id(i) not in deleted]
        if not candidates:
            return {}
        docs = {i.doc_key for i in candidates}
        self.wait(lambda: docs.isdisjoint(in_flight()), self.wait_s)
        busy = in_flight()
        chunks = [i for i in candidates if i.doc_key not in busy]
        if not chunks:
            return {}
        lookup = self.reads.start([i.event for i in chunks])
        if lookup is None or not self.wait(lookup.done, self.wait_s):
            log.warning("unchanged-chunk lookup unanswered; embedding the batch", waited_s=self.wait_s)
            return {}
        try:
            found = lookup.result()
        except Exception as exc:  # noqa: BLE001 - lookup failed: embed them all; the upsert retries the sink
            log.warning("unchanged-chunk lookup failed; embedding the batch", error=str(exc)[:300])
            return {}
        return {id(item): reuse for item, reuse in zip(chunks, found) if reuse is not None}


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
