"""The embed worker's output stage: computed batches are written to the sink in log order, then finished.

Its bounded queue is the model stage's one hand-off: a slow sink fills it and holds back writes, never
replies (a batch that writes nothing is never queued, ``jobs``). Runs of upserts, runs of payload
rewrites and deletes apply exactly in log order, so a payload write never lands over a later text change of
its point, nor an upsert over a later payload write; a write is retried by failure kind
(``WorkerLoop.write_with_retry``); a record is finished only after its write, or dead-lettered when the
sink refuses it for good.
A payload write applies only while its point holds what the lookup read; one that lost that race (a write
of the other lane, under another name, or an old owner's late one came between) is embedded by the model
stage (``EmbedAgain``) and upserted whole before the writes behind it, unless its partition moved on.
``docs`` (documents from their batch's lookup until written, ``DocsInFlight``) lets the unchanged-chunk
lookup wait for a redelivery's first write; ``writing`` lets a revocation wait for the write of its partitions.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from concurrent import futures
from dataclasses import dataclass, field

from embedstream import logs
from embedstream.schemas import DocumentDelete, ErrorInfo
from embedstream.workers.embed_again import EmbedAgain
from embedstream.workers.loop import ABANDONED
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.policy import BULK
from embedstream.workers.sink import EmbeddedChunk, Reuse, ReusedChunk

OUTPUT_QUEUE_BATCHES = 2  # computed batches waiting (more only hold vectors in memory while the sink is slow)
REVOKE_WAIT_S = 2.0  # a revocation waits this long for an in-flight write of those partitions to finish
_WAIT_S = 0.05  # longest the stage waits for a batch before it looks at stop and health again

log = logs.get("embedstream.worker")


@dataclass
class Hold:
    """A batch's documents, in flight from its lookup until its writes are done (``DocsInFlight``)."""

    keys: tuple
    computing: bool = True  # its batch is still on the model stage (its pass may be suspended at a checkpoint)
    released: bool = False


class DocsInFlight:
    """Documents (by id, whatever collection name reached them) whose writes are on their way: held from their
    batch's lookup until its write job is written, or at once when the batch writes nothing."""

    def __init__(self, changed: threading.Condition):
        self.changed = changed
        self._held: Counter = Counter()
        self._computing: Counter = Counter()

    def hold(self, keys) -> Hold:
        hold = Hold(tuple(keys))
        with self.changed:
            self._held.update(hold.keys)
            self._computing.update(hold.keys)
        return hold

    def computed(self, hold: Hold) -> None:
        """The hold's batch has left the model stage (handed on, or nothing to hand on)."""
        with self.changed:
            if hold.computing:
                hold.computing = False
                self._computing.subtract(hold.keys)
                self._computing += Counter()  # drops the zeros

    def release(self, hold: Hold) -> None:
        self.computed(hold)
        with self.changed:
            if not hold.released:
                hold.released = True
                self._held.subtract(hold.keys)
                self._held += Counter()
            self.changed.notify_all()

    def held(self) -> set:
        with self.changed:
            return set(self._held)

    def awaitable(self) -> set:
        """Documents held by a batch that can finish while the caller waits: not by one whose pass is suspended at a
        checkpoint (the caller is what it waits for)."""
        with self.changed:
            return {key for key, n in self._held.items() if n > self._computing[key]}


@dataclass
class WriteJob:
    """A computed batch on its way to the output stage: every item, in log order, the chunks' vectors, what the
    store holds for the chunks written without a forward pass, and the hold on its documents."""

    items: list  # WorkItem
    vectors: dict[int, object]  # id(item) -> vector, for the chunks that were embedded
    reused: dict[int, Reuse] = field(default_factory=dict)  # id(item) -> a payload to rewrite, or vectors lent
    hold: Hold | None = None


class OutputStage:
    """The output stage of an ``EmbedWorker`` (its sink, lanes, metrics, retries and turn policy)."""

    def __init__(self, worker):
        self.worker = worker
        self.queue: queue.Queue[WriteJob] = queue.Queue(maxsize=OUTPUT_QUEUE_BATCHES)
        self.writes = threading.Condition()  # in-flight write state, for revocations and unchanged-chunk lookups
        self.writing: set[tuple[str, int]] = set()  # partitions of the write being made now
        self.docs = DocsInFlight(self.writes)
        self.again = EmbedAgain()  # lost races: embedded on the model stage

    # -- the model stage's side ------------------------------------------------------------------
    def jobs(self, batch: list, vectors: dict[int, object], reused: dict[int, Reuse], hold: Hold) -> list[WriteJob]:
        """What of a computed batch goes to the output stage: nothing when it writes nothing (queries answered,
        chunks found unchanged; its documents are released at once), so reply-only work never waits for room."""
        if vectors or reused or any(isinstance(item.event, DocumentDelete) for item in batch):
            return [WriteJob(batch, vectors, reused, hold)]
        self.docs.release(hold)
        return []

    def offer(self, job: WriteJob) -> bool:
        """Queue the job if there is room now."""
        try:
            self.queue.put_nowait(job)
            return True
        except queue.Full:
            return False

    # -- the stage -------------------------------------------------------------------------------
    def step(self) -> None:
        """Write the next computed batch (busy), or wait for one (idle)."""
        waited = time.perf_counter()
        try:
            job = self.queue.get(timeout=_WAIT_S)
        except queue.Empty:
            self.worker.metrics.stage_idle.labels(stage="output").inc(time.perf_counter() - waited)
            return
        held = self.worker.turns.step_aside() if job.items[0].lane == BULK else 0.0  # a query's pass and reply go first
        self.worker.metrics.stage_blocked.labels(stage="output").inc(held)
        started = time.perf_counter()
        self.worker.metrics.stage_idle.labels(stage="output").inc(started - waited - held)
        try:
            self.write(job)
        finally:
            if job.hold is not None:
                self.docs.release(job.hold)
            self.worker.metrics.stage_busy.labels(stage="output").inc(time.perf_counter() - started)
        self.worker.progressed()

    def write(self, job: WriteJob) -> None:
        """Apply the job's writes exactly in log order: runs of upserts (embedded chunks, lent vectors), runs
        of payload rewrites, and deletes between them."""
        run: list[WorkItem] = []
        kind: str | None = None
        for item in job.items:
            if OffsetTracker.revoked(item.handle):
                continue  # its partition moved: the new owner writes it
            this = _write_kind(item, job)
            if this is None:
                continue
            if run and (this != kind or this == "delete"):
                self._write_run(kind, run, job)
                run = []
            kind = this
            run.append(item)
        if run:
            self._write_run(kind, run, job)

    def _write_run(self, kind: str, run: list[WorkItem], job: WriteJob, limit_s: float | None = None) -> None:
        """One sink write for the run; when the sink rejects it, each item alone finds the ones at fault."""
        sink = self.worker.sink
        if kind == "delete":
            (item,) = run
            self._settle(item, self._sink_write(lambda: sink.delete(item.event), "sink delete", run))
            return
        source = [{"topic": i.topic, "partition": i.partition, "offset": i.offset} for i in run]
        lost: list = []
        if kind == "payload":
            entries = [ReusedChunk(i.event, job.reused[id(i)], s) for i, s in zip(run, source)]

            def write() -> None:
                lost[:] = [id(entry) for entry in sink.write_payloads(entries)]
            what = "sink payload write"
        else:
            entries = [EmbeddedChunk(i.event, job.vectors[id(i)], s) if id(i) in job.vectors
                       else ReusedChunk(i.event, job.reused[id(i)], s) for i, s in zip(run, source)]
            write, what = (lambda: sink.upsert(entries)), "sink upsert"
        started = time.perf_counter()
        reason = self._sink_write(write, what, run, limit_s)
        if reason is not None and reason is not ABANDONED and len(run) > 1:
            for item in run:  # the failure already outlasted its bound: singles are not waited for again
                self._write_run(kind, [item], job, limit_s=0.0)
            return
        self.worker.metrics.observe_stage("upsert", run[0].lane, (time.perf_counter() - started) * 1000)
        raced = [item for item, entry in zip(run, entries) if id(entry) in lost] if reason is None else []
        for item in run:
            if all(item is not r for r in raced):
                self._settle(item, reason)
        if reason is None:
            embedded = sum(1 for i in run if id(i) in job.vectors)
            if embedded:
                self.worker.metrics.texts.labels(lane=run[0].lane, kind="chunk").inc(embedded)
            if kind == "payload":
                self.worker.metrics.payload_updates.labels(lane=run[0].lane).inc(len(run) - len(raced))
        if raced:
            self._write_lost_races(raced)

    def _write_lost_races(self, items: list[WorkItem]) -> None:
        """Payload-only writes whose point changed between the lookup and the write: embedded by the model stage
        and upserted whole (before the writes behind them); a revoked one is the new owner's."""
        self.worker.metrics.payload_races.labels(lane=items[0].lane).inc(len(items))
        owned = [item for item in items if not OffsetTracker.revoked(item.handle)]
        if not owned:
            return
        log.info("payload writes lost a race; embedding them", items=len(owned))
        answer = self.again.ask(owned)
        stage = self.worker.current_stage()
        while not answer.done():
            if self.worker.stopping() and not self.worker._stage_alive("model"):  # noqa: SLF001
                return  # not finished: redelivered to the next owner
            futures.wait([answer], _WAIT_S)
            if stage is not None:
                stage.touch()
        try:
            vectors = answer.result()
        except Exception as exc:  # noqa: BLE001 - the pass failed for these records: dead letters, the worker goes on
            info = ErrorInfo(code="forward_failed",
                             message=f"the forward pass failed: {type(exc).__name__}: {str(exc)[:500]}")
            for item in owned:
                self._settle(item, info)
            return
        vectors = {id(item): vector for item, vector in zip(owned, vectors)}
        owned = [item for item in owned if not OffsetTracker.revoked(item.handle)]
        if owned:
            self._write_run("upsert", owned, WriteJob(owned, vectors))

    def _sink_write(self, write, what: str, items: list[WorkItem], limit_s: float | None = None) -> ErrorInfo | None:
        """One sink write, retried by failure kind; a revocation of the partitions waits for it (``writing``)."""
        partitions = {(item.topic, item.partition) for item in items}
        with self.writes:
            self.writing = partitions
        try:
            return self.worker.write_with_retry(write, what, self.worker.metrics.sink_failures.inc, limit_s,
                                         abandoned=lambda: all(OffsetTracker.revoked(i.handle) for i in items))
        finally:
            with self.writes:
                self.writing = set()
                self.writes.notify_all()

    def finish_writes_of(self, partitions: set[tuple[str, int]]) -> None:
        """On revocation: let a write of those partitions in progress finish (bounded), so it is committed
        now rather than landing after the new owner's writes."""
        with self.writes:
            self.writes.wait_for(lambda: not (self.writing & partitions), REVOKE_WAIT_S)

    def _settle(self, item: WorkItem, reason: ErrorInfo | None) -> None:
        """Written: finished. Refused by the sink for good: dead-lettered with the reason. Revoked: nothing
        (the partition's new owner has the record again)."""
        if OffsetTracker.revoked(item.handle):
            return
        if reason is None:
            OffsetTracker.done(item.handle)
        else:
            self.worker.lanes[item.lane].dead_letter(item.record, reason, item.handle)


def _write_kind(item, job: WriteJob) -> str | None:
    """How an item is written: ``delete``, ``upsert`` (embedded, or vectors lent), ``payload``, or None
    (nothing to write: a query, or a chunk whose point already holds it)."""
    if isinstance(item.event, DocumentDelete):
        return "delete"
    if id(item) in job.vectors:
        return "upsert"
    reuse = job.reused.get(id(item))
    if reuse is None:
        return None
    return "payload" if reuse.kind == "payload" else "upsert"
