"""Chunks that need no forward pass, because the store already holds what they would write.

Per chunk (:class:`StoredChunks`): its point holds its text (the worker's own hash) and embedding
identity -> ``same`` when the metadata is the same too (typed canonical JSON: nothing to write), else
``payload`` (its payload alone is rewritten, while the point still holds what was read); another point of
its document holds its text and identity (a chunk moved by an edit before it) -> ``vectors`` (those
vectors are written under its id); otherwise it is embedded. One mechanism serves every path that sends a
document again: CDC changes, ``produce --replace`` and re-index replays.

A lookup reads what its batch needs and no more, whatever the document's size: the payloads of the
batch's own points by id, and for the chunks missed there the points of their documents that hold their
texts (a filter on the document, the text's hash and the identity; both are keyword-indexed).

The lookup is a store read, so it never runs on the stage that answers queries: it runs on a thread of
its own (``StoreReads``) while the caller waits for it at most ``wait_s``, with a ``wait`` that answers
queries meanwhile. A lookup the store never answers (a hung server) holds nobody; the chunks are then
embedded, and the upsert waits for the store on the output stage.

A document counts as in flight from its batch's lookup until that batch is written (``DocsInFlight``),
under its id alone, whatever collection name or alias reached it: a later lookup of it waits for those
writes (at most ``wait_s``; then its chunks are embedded).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from embedstream import logs
from embedstream.schemas import ChunkEvent, DocumentDelete
from embedstream.vectorstore.base import VectorSpec
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.output_stage import DocsInFlight, Hold
from embedstream.workers.sink import IDENTITY, SAME, QdrantSink, Reuse, expectation, layout_keys, metadata_key, point_id
from embedstream.workers.trust import content_hash

log = logs.get("embedstream.worker")
AVOIDED = {"same": "unchanged", "payload": "metadata", "vectors": "moved"}  # Reuse kind -> the metric's reason


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

        Events are grouped by the collection their name reaches now (unset, a collection and its alias are
        one). Per collection one payload read of the events' points, and one read of the points of their
        documents that hold the texts missed there. Events are taken in order: an earlier event of the list
        writes its point first, so a later one of the same point is ``same`` when it wants what that one
        writes, and otherwise can only reuse vectors (they do not depend on what the point holds).
        """
        identity = self.sink.identity.digest
        out: list[Reuse | None] = [None] * len(events)
        reached: dict[str | None, str] = {}
        groups: dict[str, list[_Indexed]] = {}
        for i, event in enumerate(events):
            if event.collection not in reached:
                reached[event.collection] = self.sink.resolve(event.collection)
            groups.setdefault(reached[event.collection], []).append(_Indexed(i, event))
        for collection, members in groups.items():
            ids = [point_id(m.event.doc_id, m.event.chunk_id) for m in members]
            stored = self.sink.store.get_payloads(collection, ids)
            written: dict[str, tuple] = {}  # point id -> what an earlier event of the list writes there
            missed: list[_Indexed] = []
            for m, pid in zip(members, ids):
                wanted = (content_hash(m.event.text), metadata_key(m.event.metadata))
                payload = None if pid in written else stored.get(pid)
                if pid in written and written[pid] == wanted:
                    out[m.index] = SAME
                elif payload is not None and (payload.get("content_hash"), payload.get(IDENTITY)) == (wanted[0], identity):
                    out[m.index] = SAME if metadata_key(payload) == wanted[1] else \
                        Reuse("payload", layout_keys(payload), expect=expectation(payload))
                else:
                    missed.append(m)
                written[pid] = wanted
            if missed:
                self._lend_vectors(collection, missed, out)
        return out

    def _lend_vectors(self, collection: str, missed: list[_Indexed], out: list) -> None:
        """A missed chunk: another point of its document with the same text and identity lends its vectors, if
        they can be written as they are read. One read of exactly those points (never a whole document)."""
        docs = sorted({m.event.doc_id for m in missed})
        texts = sorted({content_hash(m.event.text) for m in missed})
        by_text: dict[tuple, object] = {}
        points = self.sink.store.scroll(collection, with_vectors=True, filter={
            "doc_id": docs, "content_hash": texts, IDENTITY: self.sink.identity.digest})
        for point in points:
            if self._restorable(point.vectors):
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
    """``skip``: the chunks of a batch that need no forward pass, with what the store holds for each; it also
    holds the batch's documents in flight (``DocsInFlight``) from its lookup on.

    ``wait(done, timeout_s)`` waits for ``done()`` at most ``timeout_s`` and says whether it came true."""

    def __init__(self, lookup: Callable[[list[ChunkEvent]], list[Reuse | None]],
                 wait: Callable[[Callable[[], bool], float], bool], docs: DocsInFlight, metrics,
                 enabled: Callable[[], bool] = lambda: True, wait_s: float = 2.0):
        self.reads = StoreReads(lookup)
        self.wait = wait
        self.docs = docs
        self.metrics = metrics
        self.enabled = enabled
        self.wait_s = wait_s

    def skip(self, items: list, batch: list) -> tuple[list, dict[int, Reuse], Hold]:
        """The items that still need a forward pass, what the store holds for those that do not (a chunk
        whose point already holds it is finished at once; a payload rewrite or lent vectors go on to the
        output stage as writes), and the hold on the batch's documents (released once it is written)."""
        found, hold = self.find(items, batch)
        for item in items:
            reuse = found.get(id(item))
            if reuse is None:
                continue
            self.metrics.forward_passes_avoided.labels(lane=item.lane, reason=AVOIDED[reuse.kind]).inc()
            if reuse.kind == "same":
                OffsetTracker.done(item.handle)
        live = [i for i in items if id(i) not in found]
        changed = {i.doc_key: i.lane for i in batch if isinstance(i.event, ChunkEvent)}
        forwarded = Counter(i.doc_key for i in live if isinstance(i.event, ChunkEvent))
        for key, lane in changed.items():  # per document with chunk events, how many go through the model
            self.metrics.change_chunks_embedded.labels(lane=lane).observe(forwarded[key])
        return live, {k: r for k, r in found.items() if r.kind != "same"}, hold

    def find(self, items: list, batch: list) -> tuple[dict[int, Reuse], Hold]:
        """id(item) -> its :class:`Reuse`, for the ``items`` (of ``batch``) that need no forward pass: one
        lookup for all; and the hold on the batch's documents, taken before the lookup reads. Never one that
        a delete earlier in the batch may remove, nor one whose document has writes on their way to the sink
        (waited for first, so a redelivery right behind its first delivery is still found, and a payload
        write is never decided on what an earlier write is about to change). A batch whose pass is suspended
        at a checkpoint cannot be waited for: its documents are embedded."""
        keys = [i.doc_key for i in batch if i.doc_key is not None]
        deleted = deleted_earlier(batch)
        enabled = self.enabled()
        candidates = [i for i in items if enabled and isinstance(i.event, ChunkEvent) and id(i) not in deleted]
        docs = {i.doc_key for i in candidates}
        if docs:
            self.wait(lambda: docs.isdisjoint(self.docs.awaitable()), self.wait_s)
        busy = self.docs.held()
        hold = self.docs.hold(keys)
        chunks = [i for i in candidates if i.doc_key not in busy]
        if not chunks:
            return {}, hold
        lookup = self.reads.start([i.event for i in chunks])
        if lookup is None or not self.wait(lookup.done, self.wait_s):
            log.warning("unchanged-chunk lookup unanswered; embedding the batch", waited_s=self.wait_s)
            return {}, hold
        try:
            found = lookup.result()
        except Exception as exc:  # noqa: BLE001 - lookup failed: embed them all; the upsert retries the sink
            log.warning("unchanged-chunk lookup failed; embedding the batch", error=str(exc)[:300])
            return {}, hold
        return {id(item): reuse for item, reuse in zip(chunks, found) if reuse is not None}, hold


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
