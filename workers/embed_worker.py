"""The embed worker: lanes -> token-budget batch -> engine -> Qdrant / reply -> commit.

Two lanes (``workers/lane.py``), each its own consumer group so they can also run as separate
deployments: online (online chunks and query requests, batched first, with a short batching
window) and bulk (bulk chunks). Which queued work forms the next forward pass is the
``Scheduler``'s decision (online first, bulk fills the leftover budget, bulk sliced while online
traffic is recent). Offsets are committed only after the sink write (or reply / dead letter) for
every earlier record of the partition succeeded. Undecodable or invalid records, and records the
sink rejects for good, go to the dead-letter topic with the reason and the loop carries on. Queues
are bounded: a slow sink pauses consumption.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pydantic import Field

from embedstream import logs
from embedstream.config import Settings, WorkerSettings
from embedstream.engine.engine import EmbedRequest, Engine, Prepared, StageTimings
from embedstream.engine.errors import EngineError
from embedstream.schemas import ChunkEvent, DocumentDelete, ErrorInfo, QueryReply, QueryRequest
from embedstream.schemas.codec import DecodeError, decode
from embedstream.schemas.events import CHUNK_TOPIC_ADAPTER, now_ms
from embedstream.workers.batching_window import BatchingWindow
from embedstream.workers.lane import Lane, Taken
from embedstream.workers.loop import WorkerLoop, new_worker_id
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.offsets import OffsetTracker
from embedstream.workers.scheduler import Scheduler
from embedstream.workers.sink import EmbeddedChunk, QdrantSink
from embedstream.workers.trust import TrustError, TrustPolicy, admit

log = logs.get("embedstream.worker")

LANES = ("online", "bulk")
_MAX_POLL_RECORDS = {"online": 256, "bulk": 2048}


@dataclass
class WorkItem(Taken):
    """One decoded record waiting in a lane queue."""

    event: ChunkEvent | DocumentDelete | QueryRequest | None = None
    prepared: Prepared | None = None
    received: float = field(default_factory=time.perf_counter)

    @property
    def tokens(self) -> int:
        return len(self.prepared.tokens) if self.prepared else 0


class WorkerOptions(WorkerSettings):
    """The worker knobs (``EMBEDSTREAM_WORKER__*``) plus what a deployment picks per process."""

    lanes: tuple[str, ...] = LANES
    worker_id: str = Field(default_factory=lambda: new_worker_id("embed"))

    @classmethod
    def from_settings(cls, settings: Settings, lanes: tuple[str, ...] = LANES) -> "WorkerOptions":
        return cls(lanes=lanes, **settings.worker.model_dump())


class EmbedWorker(WorkerLoop):
    """Drains the chunk and query topics through one Engine into one sink."""

    name = "embed worker"

    def __init__(self, settings: Settings, engine: Engine, sink: QdrantSink, options: WorkerOptions | None = None,
                 metrics: WorkerMetrics | None = None):
        self.settings = settings
        self.engine = engine
        self.sink = sink
        self.options = options or WorkerOptions.from_settings(settings)
        super().__init__(settings.kafka, self.options, metrics or WorkerMetrics(), self.options.worker_id)
        self.scheduler = Scheduler(engine.limits, self.options.bulk_slice_tokens, self.options.online_quiet_s)
        self.window = BatchingWindow(self.options.batch_window_ms)
        self.last_commit = 0.0
        self.policy = TrustPolicy.from_settings(settings)
        kafka = settings.kafka
        topics = {"online": [kafka.topic_chunks_online, kafka.topic_queries], "bulk": [kafka.topic_chunks_bulk]}
        groups = {"online": kafka.group_online, "bulk": kafka.group_bulk}
        for lane in self.options.lanes:
            self.add_lane(lane, topics[lane], groups[lane], _MAX_POLL_RECORDS[lane],
                          full=lambda queue: queue.tokens >= self.options.max_queue_tokens)

    # -- intake ---------------------------------------------------------------------------------
    def intake(self, name: str, timeout_ms: int) -> int:
        """Fetch, decode, validate and tokenise a lane's records; bad ones are dead-lettered at once."""
        lane = self.lanes.get(name)
        if lane is None:
            return 0
        records = lane.poll(timeout_ms)
        if not records:
            return 0
        received = time.perf_counter()
        staged: list[tuple] = []
        for record in records:
            handle = lane.track(record)
            try:
                if record.topic == self.kafka.topic_queries:
                    event = decode(record.value, QueryRequest, self.kafka.max_record_bytes)
                else:
                    event = decode(record.value, CHUNK_TOPIC_ADAPTER, self.kafka.max_record_bytes)
                event = admit(event, self.policy)
            except (DecodeError, TrustError) as err:  # a refused reply_to is never answered: dead letter
                lane.dead_letter(record, err.to_error_info(), handle)
                continue
            try:
                self._check_model(event)
            except EngineError as err:
                self._reject(lane, record, handle, event, err)
                continue
            staged.append((record, handle, event))
        to_embed = [e for _, _, e in staged if not isinstance(e, DocumentDelete)]
        timings = StageTimings()
        prepared = iter(self.engine.prepare([self._request(e) for e in to_embed], timings) if to_embed else [])
        self.metrics.observe_stage("tokenize", name, timings.tokenize_ms)
        for record, handle, event in staged:
            prep = None if isinstance(event, DocumentDelete) else next(prepared)
            if isinstance(prep, EngineError):
                self._reject(lane, record, handle, event, prep)
                continue
            lane.queue.push(WorkItem(name, record, handle, event, prep, received))
        if name == "online":
            self.scheduler.online_arrived()
            self.window.arrived(received, len(records))
        self.metrics.queue_depth(name, len(lane.queue), lane.queue.tokens)
        return len(records)

    def _check_model(self, event) -> None:
        model = getattr(event, "model", None)
        if model and model != self.engine.spec.name:
            raise EngineError("unknown_model", f"model {model!r} is not served by this worker (it serves {self.engine.spec.name!r})")

    @staticmethod
    def _request(event) -> EmbedRequest:
        if isinstance(event, QueryRequest):
            return EmbedRequest(event.request_id, event.text, event.dimensions, event.dtype, normalize=event.normalize,
                                truncate=event.truncate, prompt=event.prompt)
        return EmbedRequest(f"{event.doc_id}/{event.chunk_id}", event.text, prompt="document",
                            token_ids=event.token_id_array(), tokenizer=event.tokenizer)

    def _reject(self, lane: Lane, record, handle, event, err: EngineError) -> None:
        info = ErrorInfo(code=err.code, message=err.message)
        if isinstance(event, QueryRequest):
            self._reply_error(lane.name, record, event, handle, info)
        else:
            lane.dead_letter(record, info, handle)

    def _reply_error(self, lane: str, record, request: QueryRequest, handle, info: ErrorInfo) -> None:
        reply = QueryReply(request_id=request.request_id, model=self.engine.spec.name, error=info)
        self.lanes[lane].reply(record, request, reply, handle)
        self.metrics.errors.labels(lane=lane, code=info.code).inc()

    # -- batch formation -----------------------------------------------------------------------
    def next_batch(self) -> list[WorkItem]:
        """Online first, bulk fills the rest (``Scheduler``), after the online batching window."""
        online, bulk = self.lanes.get("online"), self.lanes.get("bulk")
        if online is not None:
            self._await_online_window(online)
        return self.scheduler.next_batch(online.queue if online else None, bulk.queue if bulk else None)

    def _await_online_window(self, online: Lane) -> None:
        """Give a fresh online batch up to ``batch_window_ms`` to grow, while traffic is dense."""
        oldest = online.queue.oldest
        if oldest is not None:
            self.window.gather(oldest.received, lambda: self.intake("online", 1),
                               lambda: online.queue.tokens >= self.engine.limits.max_batch_tokens)

    # -- processing ----------------------------------------------------------------------------
    def process(self, batch: list[WorkItem]) -> None:
        """Embed what needs embedding in one forward pass, answer queries, then write chunks and
        deletes to the sink in log order; offsets become committable only after their write."""
        start = time.perf_counter()
        now = now_ms()
        live = []
        for item in batch:
            if isinstance(item.event, DocumentDelete):
                continue
            self.metrics.observe_stage("queue_wait", item.lane, (start - item.received) * 1000)
            if isinstance(item.event, QueryRequest) and item.event.deadline_ms and item.event.deadline_ms < now:
                self._reply_error(item.lane, item.record, item.event, item.handle, ErrorInfo(
                    code="deadline_exceeded", message="the request's deadline passed before it was embedded"))
                continue
            live.append(item)
        if self.options.skip_unchanged:
            live = self._skip_unchanged(live, _deleted_earlier(batch))
        if not live:
            self._write(batch, {})
            return
        timings = StageTimings()
        try:
            vectors = self.engine.forward([i.prepared for i in live], timings)
        except Exception as exc:  # noqa: BLE001 - a failed pass fails its records, never the worker
            self._forward_failed(batch, live, exc)
            return
        self.metrics.observe_batch(live[0].lane, timings, len(live))
        chunks = {}
        for item, vector in zip(live, vectors):
            if isinstance(item.event, QueryRequest):
                self._answer(item, vector, start, timings)
            else:
                chunks[id(item)] = vector
        self._write(batch, chunks)

    def _forward_failed(self, batch: list[WorkItem], live: list[WorkItem], exc: Exception) -> None:
        """Several items: run the batch again one item at a time, in log order, to find the one at fault.
        One item: it is answered with the error (a query) or dead-lettered (a chunk); deletes are written."""
        log.error("forward pass failed", items=len(live), error=f"{type(exc).__name__}: {str(exc)[:300]}")
        if len(live) > 1:
            for item in batch:
                self.process([item])
            return
        (item,) = live
        info = ErrorInfo(code="forward_failed", message=f"the forward pass failed: {type(exc).__name__}: {str(exc)[:500]}")
        if isinstance(item.event, QueryRequest):
            self._reply_error(item.lane, item.record, item.event, item.handle, info)
        else:
            self.lanes[item.lane].dead_letter(item.record, info, item.handle)
        self._write(batch, {})

    def _answer(self, item: WorkItem, vector, start: float, timings: StageTimings) -> None:
        result = self.engine.finish(item.prepared, vector)
        values = result.vector.values
        reply = QueryReply(
            request_id=item.event.request_id, embedding=result.vector.to_list(),
            dims=int(values.shape[0]) * (8 if result.vector.dtype == "binary" else 1),
            dtype=result.vector.dtype, scale=result.vector.scale, tokens=result.tokens, truncated=result.truncated,
            model=self.engine.spec.name,
            timings_ms={"queue_wait": (start - item.received) * 1000, **timings.as_dict(),
                        "total": (time.perf_counter() - item.received) * 1000},
        )
        self.lanes[item.lane].reply(item.record, item.event, reply, item.handle)
        self.metrics.texts.labels(lane=item.lane, kind="query").inc()

    def _write(self, batch: list[WorkItem], vectors: dict[int, object]) -> None:
        """Upsert runs of embedded chunks and apply deletes between them, exactly in batch order."""
        run: list[WorkItem] = []
        for item in batch:
            if isinstance(item.event, DocumentDelete):
                if run:
                    self._upsert(run, vectors)
                    run = []
                reason = self.write_with_retry(lambda event=item.event: self.sink.delete(event), "sink delete",
                                               self.metrics.sink_failures.inc)
                self._settle(item, reason)
            elif id(item) in vectors:
                run.append(item)
        if run:
            self._upsert(run, vectors)

    def _upsert(self, run: list[WorkItem], vectors: dict[int, object], limit_s: float | None = None) -> None:
        """One upsert for the run; when the sink rejects it, each chunk alone finds the ones at fault."""
        embedded = [EmbeddedChunk(i.event, vectors[id(i)], {"topic": i.topic, "partition": i.partition,
                                                            "offset": i.offset}) for i in run]
        upsert_start = time.perf_counter()
        reason = self.write_with_retry(lambda: self.sink.upsert(embedded), "sink upsert", self.metrics.sink_failures.inc,
                                       limit_s)
        if reason is not None and len(run) > 1:
            for item in run:  # the failure already outlasted its bound: singles are not waited for again
                self._upsert([item], vectors, limit_s=0.0)
            return
        self.metrics.observe_stage("upsert", run[0].lane, (time.perf_counter() - upsert_start) * 1000)
        for item in run:
            self._settle(item, reason)
        if reason is None:
            self.metrics.texts.labels(lane=run[0].lane, kind="chunk").inc(len(run))

    def _settle(self, item: WorkItem, reason: ErrorInfo | None) -> None:
        """Written: finished. Refused by the sink for good: dead-lettered with the reason."""
        if reason is None:
            OffsetTracker.done(item.handle)
        else:
            self.lanes[item.lane].dead_letter(item.record, reason, item.handle)

    def _skip_unchanged(self, items: list[WorkItem], deleted_earlier: set[int]) -> list[WorkItem]:
        """Finish, without embedding, the chunks whose stored point already matches (one lookup per collection).

        A chunk that a delete earlier in the same batch may remove is never skipped."""
        chunks = [i for i in items if isinstance(i.event, ChunkEvent) and id(i) not in deleted_earlier]
        if not chunks:
            return items
        try:
            same = self.sink.unchanged([i.event for i in chunks])
        except Exception as exc:  # noqa: BLE001 - lookup failed: embed them all; the upsert retries the sink
            log.warning("unchanged-chunk lookup failed; embedding the batch", error=str(exc)[:300])
            return items
        skipped = {id(item) for item, hit in zip(chunks, same) if hit}
        for item in chunks:
            if id(item) in skipped:
                OffsetTracker.done(item.handle)
                self.metrics.chunks_unchanged.labels(lane=item.lane).inc()
        return [i for i in items if id(i) not in skipped] if skipped else items

    # -- main loop -----------------------------------------------------------------------------
    def run_once(self) -> int:
        """One iteration: poll, form a batch, process it, commit. Returns items processed."""
        busy = any(lane.queue for lane in self.lanes.values())
        online, bulk = self.lanes.get("online"), self.lanes.get("bulk")
        if online is not None:
            self.intake("online", online.joining_timeout(0 if busy else 20))
        if bulk is not None and bulk.queue.tokens < self.options.max_queue_tokens:
            self.intake("bulk", bulk.joining_timeout(0 if (busy or online is not None) else 50))
        batch = self.next_batch()
        if batch:
            self.process(batch)
        now = time.monotonic()
        # A synchronous commit is a broker round trip: under load, commit every commit_interval_s
        # (a crash redoes at most that much, harmlessly: upserts are idempotent); when idle, at once.
        if not batch or now - self.last_commit >= self.options.commit_interval_s:
            for name, lane in self.lanes.items():
                lane.commit()
                lane.record_lag(self.metrics)
            self.last_commit = now
        return len(batch)

    def warm_up(self) -> None:
        if "online" in self.lanes and self.options.warm_up_tokens > 0:
            start = time.perf_counter()
            lengths = self.engine.warm_up(self.options.warm_up_tokens)
            log.info("query shapes warmed up", lengths=lengths, ms=round((time.perf_counter() - start) * 1000))

    def started_fields(self) -> dict:
        return {"lanes": list(self.options.lanes), "model": self.engine.spec.name,
                "path": self.engine.runner.describe(), "max_batch_tokens": self.engine.limits.max_batch_tokens}

    def readiness_checks(self) -> dict:
        return {**super().readiness_checks(), "qdrant": lambda: self.sink.store.list_collections() is not None}


def _deleted_earlier(batch: list[WorkItem]) -> set[int]:
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
