"""The embed worker: lanes -> token-budget batch -> engine -> Qdrant / reply -> commit.

Two lanes (``workers/lane.py``), each its own consumer group so they can also run as separate
deployments: online (online chunks and query requests, batched first, with a short batching
window) and bulk (bulk chunks). Which queued work forms the next forward pass is the
``Scheduler``'s decision (online first, bulk fills the leftover budget, bulk sliced while online
traffic is recent). Offsets are committed only after the sink write (or reply / dead letter) for
every earlier record of the partition succeeded. Undecodable or invalid records, and records the
sink rejects for good, go to the dead-letter topic with the reason and the worker carries on.

It runs as three overlapped stages (``workers/stages.py``): intake (poll, decode, validate,
tokenise: the next batch is prepared while the current forward pass runs), the model stage (batch,
forward, answer queries) and the output stage (sink writes in log order, then the records are
finished). The lane queues and the output queue are bounded: a slow sink pauses consumption.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field

from pydantic import Field

from embedstream import logs
from embedstream.config import Settings, WorkerSettings
from embedstream.engine.engine import EmbedRequest, Engine, Prepared, StageTimings
from embedstream.engine.errors import EngineError
from embedstream.engine.yield_points import yielding_to
from embedstream.schemas import ChunkEvent, DocumentDelete, ErrorInfo, QueryReply, QueryRequest
from embedstream.schemas.codec import DecodeError, decode
from embedstream.schemas.events import CHUNK_TOPIC_ADAPTER, now_ms
from embedstream.workers.admission import SHED_MESSAGES
from embedstream.workers.batching_window import BatchingWindow
from embedstream.workers.lane import Lane, SyncQueue, Taken
from embedstream.workers.loop import ABANDONED, new_worker_id
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.offsets import OffsetTracker
from embedstream.workers.online_first import OnlineFirst
from embedstream.workers.scheduler import Scheduler
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, StoreReads
from embedstream.workers.stages import Stage, StagedWorkerLoop
from embedstream.workers.trust import TrustError, TrustPolicy, admit

log = logs.get("embedstream.worker")

LANES = ("online", "bulk")
_MAX_POLL_RECORDS = {"online": 256, "bulk": 2048}
# Computed batches waiting for the output stage. Two keep the model busy while one batch is written
# and the next waits; more only hold vectors in memory while the sink is slow (the lane queues, not
# this one, bound what the worker has fetched).
OUTPUT_QUEUE_BATCHES = 2
_SKIP_WAIT_S = 2.0  # longest the model stage waits for a document's in-flight writes before an unchanged-chunk lookup
_WAIT_S = 0.05  # longest a stage waits for work (or room) before it looks at stop and health again
_HAND_ON_SLICE_S = 0.002  # a bulk job waiting for the output stage looks for queries this often
_ONLINE_POLL_MS = 10  # intake's wait for queries when a bulk lane shares the thread (a query waits at most this)
# A poll's records are queued in slices: the model stage starts on the first slice while the rest
# are still decoded and tokenised (a 2,048-record poll is about half a second of host work).
_INTAKE_SLICE = 256
REVOKE_WAIT_S = 2.0  # a revocation waits this long for an in-flight write of those partitions to finish


@dataclass
class WorkItem(Taken):
    """One decoded record waiting in a lane queue."""

    event: ChunkEvent | DocumentDelete | QueryRequest | None = None
    prepared: Prepared | None = None
    received: float = field(default_factory=time.perf_counter)
    deadline_ms: int = 0  # a query's effective deadline (epoch ms): defaulted and capped on arrival
    predicted_finish_ms: float = 0.0  # when admission expected it answered (its error calibrates later ones)

    @property
    def tokens(self) -> int:
        return len(self.prepared.tokens) if self.prepared else 0

    @property
    def doc_key(self) -> tuple | None:
        """(collection, doc_id) of a chunk or delete: writes of one document stay in log order."""
        event = self.event
        return None if isinstance(event, QueryRequest) else (event.collection, event.doc_id)


@dataclass
class WriteJob:
    """A computed batch on its way to the output stage: every item, in log order, and the chunks' vectors."""

    items: list[WorkItem]
    vectors: dict[int, object]  # id(item) -> vector, for the chunks that were embedded

    @property
    def doc_keys(self) -> list[tuple]:
        """The documents this job writes (counted in and out of ``docs_in_flight``)."""
        return [key for key in (item.doc_key for item in self.items) if key is not None]


class WorkerOptions(WorkerSettings):
    """The worker knobs (``EMBEDSTREAM_WORKER__*``) plus what a deployment picks per process."""

    lanes: tuple[str, ...] = LANES
    worker_id: str = Field(default_factory=lambda: new_worker_id("embed"))

    @classmethod
    def from_settings(cls, settings: Settings, lanes: tuple[str, ...] = LANES) -> "WorkerOptions":
        return cls(lanes=lanes, **settings.worker.model_dump())


class EmbedWorker(StagedWorkerLoop):
    """Drains the chunk and query topics through one Engine into one sink, in three overlapped stages."""

    name = "embed worker"

    def __init__(self, settings: Settings, engine: Engine, sink: QdrantSink, options: WorkerOptions | None = None,
                 metrics: WorkerMetrics | None = None):
        self.settings = settings
        self.engine = engine
        self.sink = sink
        self.options = options or WorkerOptions.from_settings(settings)
        super().__init__(settings.kafka, self.options, metrics or WorkerMetrics(), self.options.worker_id)
        self.scheduler = Scheduler(engine.limits, self.options.bulk_slice_tokens, self.options.online_quiet_s)
        self.window = BatchingWindow.from_settings(self.options, "online")
        self.admission = self.window.controller  # online lane: window, compute prediction, shedding (issue #16)
        self.scheduler.admission = self.admission  # bulk slices shrink while online is at risk
        both = {"online", "bulk"} <= set(self.options.lanes)
        # A bulk pass on the CPU lets queued queries run between its layers (engine/yield_points.py).
        self.yield_points = _yield_points(engine) if both else 0
        self.scheduler.yield_points = max(1, self.yield_points)
        if both and engine.runner.path.startswith("openvino"):
            log.warning("online_waits_for_bulk_passes", path=engine.runner.path,
                        why="an OpenVINO pass does not yield between layers: a query waits for the whole bulk pass "
                            "ahead of it; run online lanes on backend auto (packed) and bulk on openvino")
        self._served_between_s = 0.0  # time the current bulk pass spent serving online work at its checkpoints
        # Per lane, the passes running now (a query pass may run inside a bulk pass's checkpoint): for each, the
        # perf_counter until which a query arriving now waits for it. A pass removes only its own entry.
        self._running: dict[str, list[float]] = {"online": [], "bulk": []}
        self.lookups = StoreReads(sink.unchanged)  # unchanged-chunk lookups: off the stage that answers queries
        self.online_first = OnlineFirst(self._online_pending) if both else None  # bulk host work steps aside
        self.last_commit = 0.0
        self.policy = TrustPolicy.from_settings(settings)
        self.queued = threading.Condition(threading.RLock())  # every lane queue's changes; waits for work or room
        self.to_output: queue.Queue[WriteJob] = queue.Queue(maxsize=OUTPUT_QUEUE_BATCHES)
        self.writes = threading.Condition()  # in-flight write state, for revocations and skip_unchanged
        self.writing: set[tuple[str, int]] = set()  # partitions of the write the output stage is making now
        self.docs_in_flight: Counter = Counter()  # (collection, doc_id) handed to the output stage, not yet written
        kafka = settings.kafka
        topics = {"online": [kafka.topic_chunks_online, kafka.topic_queries], "bulk": [kafka.topic_chunks_bulk]}
        groups = {"online": kafka.group_online, "bulk": kafka.group_bulk}
        for lane in self.options.lanes:
            self.add_lane(lane, topics[lane], groups[lane], _MAX_POLL_RECORDS[lane], full=self._full_check(lane),
                          queue=SyncQueue(self.queued), on_revoke=self._finish_writes_of, online=lane == "online")

    def _full_check(self, lane: str):
        """When a lane's partitions pause: its queue at ``max_queue_tokens``; the bulk lane's also while the
        scheduler says online is over its target even with shrunk slices (``bulk_paused``): no bulk is
        fetched or decoded then, what is queued still drains."""
        limit = self.options.max_queue_tokens
        if lane == "bulk":
            return lambda q: q.tokens >= limit or self.scheduler.update_pause()
        return lambda q: q.tokens >= limit

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
        for first in range(0, len(records), _INTAKE_SLICE):
            if name == "bulk" and self.online_first is not None:
                # queries first: fetch them while online work is pending, then decode this bulk slice
                self.online_first.hold(lambda s: self.intake("online", max(1, round(s * 1000))))
            elif first and name == "bulk":
                self.intake("online", 0)  # a query waits for one bulk slice's decoding at most, not a whole poll's
            self._queue_records(lane, records[first:first + _INTAKE_SLICE], received)
        if name == "online":
            self.scheduler.online_arrived()
            self.window.arrived(received, len(records))
        self.metrics.queue_depth(name, len(lane.queue), lane.queue.tokens)
        return len(records)

    def _queue_records(self, lane: Lane, records: list, received: float) -> None:
        """Decode, validate and tokenise some records, then queue them at once (one lock, one wake-up)."""
        name = lane.name
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
        ready: list[WorkItem] = []
        for record, handle, event in staged:
            prep = None if isinstance(event, DocumentDelete) else next(prepared)
            if isinstance(prep, EngineError):
                self._reject(lane, record, handle, event, prep)
                continue
            ready.append(WorkItem(name, record, handle, event, prep, received))
        lane.queue.push_many(self._admit(lane, ready))

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

    def _admit(self, lane: Lane, items: list[WorkItem]) -> list[WorkItem]:
        """The items to queue; a query whose deadline is gone, or that cannot finish by it behind the tokens
        queued ahead of it, is answered ``deadline_exceeded`` at once instead (``workers/admission.py``)."""
        now, ahead, admitted = now_ms(), lane.queue.tokens, []
        running = max(0.0, self._running_ms())
        for item in items:
            if isinstance(item.event, QueryRequest):
                reason = self.admission.refuse_on_arrival(item.event.deadline_ms, now)
                if reason is None:
                    item.deadline_ms = self.admission.deadlines.effective(item.event.deadline_ms, now)
                    reason = self.admission.late(item.deadline_ms, now, ahead, item.tokens,
                                                 self.engine.limits.max_batch_tokens, running_ms=running)
                    item.predicted_finish_ms = self.admission.predicted_finish(
                        now, ahead, item.tokens, self.engine.limits.max_batch_tokens, running)
                if reason is not None:
                    self._shed(item, reason)
                    continue
            ahead += item.tokens
            admitted.append(item)
        return admitted

    def _shed(self, item: WorkItem, reason: str) -> None:
        waited = (time.perf_counter() - item.received) * 1000
        self._reply_error(item.lane, item.record, item.event, item.handle,
                          ErrorInfo(code="deadline_exceeded", message=SHED_MESSAGES[reason]),
                          {"queue_wait": waited, "total": waited})
        self.metrics.shed.labels(lane=item.lane, reason=reason).inc()

    def _reply_error(self, lane: str, record, request: QueryRequest, handle, info: ErrorInfo,
                     timings: dict | None = None) -> None:
        reply = QueryReply(request_id=request.request_id, model=self.engine.spec.name, error=info,
                           timings_ms=timings or {})
        self.lanes[lane].reply(record, request, reply, handle)
        self.metrics.errors.labels(lane=lane, code=info.code).inc()

    # -- batch formation -----------------------------------------------------------------------
    def next_batch(self) -> list[WorkItem]:
        """Online first, bulk fills the rest (``Scheduler``), after the online batching window."""
        online, bulk = self.lanes.get("online"), self.lanes.get("bulk")
        if online is not None:
            self._await_online_window(online)
        with self.queued:  # both lanes at once: a revocation cannot drop items between measuring and taking
            return self.scheduler.next_batch(online.queue if online else None, bulk.queue if bulk else None)

    def _await_online_window(self, online: Lane) -> None:
        """Give a fresh online batch up to ``batch_window_ms`` to grow, while traffic is dense."""
        oldest = online.queue.oldest
        if oldest is not None:
            deadline_s = self.admission.deadline_on_clock(oldest.deadline_ms, now_ms()) if oldest.deadline_ms else None
            self.window.gather(oldest.received, lambda: self._online_arrivals(online),
                               lambda: online.queue.tokens >= self.engine.limits.max_batch_tokens,
                               deadline_s, lambda: online.queue.tokens)

    def _online_pending(self) -> bool:
        """Online work is queued or in a pass: bulk host work should step aside (``OnlineFirst``)."""
        online = self.lanes.get("online")
        return bool(self._running["online"]) or (online is not None and bool(online.queue))

    def _running_ms(self) -> float:
        """How long a query arriving now waits for the passes running (0 when none)."""
        now = time.perf_counter()
        return max((until - now) * 1000 for runs in self._running.values() for until in runs[-1:] or [now])

    def _online_arrivals(self, online: Lane, wait_s: float = 0.0005) -> int:
        """Wait briefly for intake to queue more online work; how many items arrived meanwhile."""
        with self.queued:
            before = online.queue.pushed
            self.queued.wait(wait_s)
            return online.queue.pushed - before

    def _await_work(self, timeout_s: float) -> bool:
        """Whether some lane has queued work, waiting up to ``timeout_s`` for intake to queue some."""
        with self.queued:
            return self.queued.wait_for(lambda: any(lane.queue for lane in self.lanes.values()), timeout_s)

    # -- model stage ---------------------------------------------------------------------------
    def compute(self, batch: list[WorkItem]) -> list[WriteJob]:
        """Embed what needs embedding in one forward pass and answer the queries; what is left to
        write (chunks with their vectors, deletes) goes on as write jobs, in log order."""
        start = time.perf_counter()
        batch = [item for item in batch if not OffsetTracker.revoked(item.handle)]  # revoked: the new owner's
        self._observe_queue_wait(batch, start)
        live = self._drop_expired([i for i in batch if not isinstance(i.event, DocumentDelete)], now_ms())
        if self.options.skip_unchanged:
            live = self._skip_unchanged(live, _deleted_earlier(batch))
        if not live:
            return _write_jobs(batch, {})
        timings = StageTimings()
        predicted_ms = self.admission.model.predict(sum(i.tokens for i in live))
        preemptible = self.yield_points > 0 and live[0].lane == "bulk"
        # How long a query arriving now waits for this pass: all of it, or one step where it yields
        # (two points per layer: after attention, after the MLP).
        wait_ms = predicted_ms / (2 * self.yield_points) if preemptible else predicted_ms
        running = self._running[live[0].lane]
        running.append(time.perf_counter() + wait_ms / 1000)
        if preemptible:
            self._served_between_s = 0.0
        pass_start = time.perf_counter()
        try:
            with yielding_to(self._serve_online_between) if preemptible else nullcontext():
                vectors = self.engine.forward([i.prepared for i in live], timings)
        except Exception as exc:  # noqa: BLE001 - a failed pass fails its records, never the worker
            running.pop()
            return self._forward_failed(batch, live, exc)
        running.pop()
        served_ms = self._served_between_s * 1000 if preemptible else 0.0
        timings.forward_ms = max(0.0, timings.forward_ms - served_ms)  # this pass's own time
        self.metrics.observe_batch(live[0].lane, timings, len(live))
        pass_ms = (time.perf_counter() - pass_start) * 1000 - served_ms
        # bulk passes too: one engine, one cost model (and the online passes' own, for the check at their turn)
        self.admission.observed_pass(timings.tokens, pass_ms, own=live[0].lane == "online")
        self.metrics.observe_pass(live[0].lane, self.admission.window_ms, predicted_ms, pass_ms)
        self.metrics.queue_age.labels(lane=live[0].lane).set(pass_start - min(i.received for i in live))
        chunks = {}
        for item, vector in zip(live, vectors):
            if isinstance(item.event, QueryRequest):
                self._answer(item, vector, start, timings)
            else:
                chunks[id(item)] = vector
        return _write_jobs(batch, chunks)

    def _serve_online_between(self) -> None:
        """At a bulk pass's checkpoint: run the queued online work now (no batching window: it is late
        already) and hand its writes on, then let the bulk pass go on. Measured here under a backlog:
        a query's queue wait p50 10 ms / p95 22 ms behind whole bulk passes."""
        start = time.perf_counter()
        for job in self._compute_online_now():
            self._hand_on(job)
        self._served_between_s += time.perf_counter() - start

    def _compute_online_now(self) -> list[WriteJob]:
        """Compute the queued online work at once (its replies go out); returns its write jobs."""
        online = self.lanes.get("online")
        if online is None or not online.queue:
            return []
        with self.queued:
            batch = self.scheduler.next_batch(online.queue, None)
        return self.compute(batch) if batch else []

    def _wait_answering_queries(self, done, timeout_s: float | None = None) -> bool:
        """Wait on the model stage for ``done()`` (room in the output queue, a lookup, writes in flight), at most
        ``timeout_s`` (None: until it is done or the worker stops), answering queued queries meanwhile: they
        make no write, so nothing the sink holds back can hold them. Whether ``done()`` came true."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        stage = self.current_stage()
        online = self.lanes.get("online")
        while not done():
            if self._halt.is_set() or (end is not None and time.monotonic() >= end):
                return False
            if online is not None and online.queue:
                with self.queued:
                    queries = online.queue.take_where(lambda i: isinstance(i.event, QueryRequest), self.engine.limits)
                if queries:
                    self.compute(queries)  # replies only: no write job
                    continue
            with self.writes:
                self.writes.wait(_HAND_ON_SLICE_S)
            if stage is not None:
                stage.touch()  # held back by the sink on purpose: its own step is watched
        return True

    def process(self, batch: list[WorkItem]) -> None:
        """Compute and write one batch on the calling thread (a step driven by hand; the stages split it)."""
        for job in self.compute(batch):
            self.write(job)

    def _observe_queue_wait(self, batch: list[WorkItem], start: float) -> None:
        """Each query's wait; for chunks one observation per lane and batch (the oldest's), not one per record."""
        oldest: dict[str, float] = {}
        for item in batch:
            if isinstance(item.event, QueryRequest):
                self.metrics.observe_stage("queue_wait", item.lane, (start - item.received) * 1000)
            elif item.lane not in oldest:
                oldest[item.lane] = item.received
        for lane, received in oldest.items():
            self.metrics.observe_stage("queue_wait", lane, (start - received) * 1000)

    def _drop_expired(self, items: list[WorkItem], now: int) -> list[WorkItem]:
        """Answer before compute (``deadline_exceeded``) the queries that would miss their deadline: gone
        already, or the pass's predicted compute ends after it (all of a pass finishes together)."""
        pass_tokens = sum(item.tokens for item in items)
        live = []
        for item in items:
            if isinstance(item.event, QueryRequest):
                deadline = item.deadline_ms or self.admission.deadlines.effective(item.event.deadline_ms, now)
                reason = self.admission.late(deadline, now, pass_tokens - item.tokens, item.tokens, queued=False)
                if reason is not None:
                    self._shed(item, reason)
                    continue
            live.append(item)
        return live

    def _forward_failed(self, batch: list[WorkItem], live: list[WorkItem], exc: Exception) -> list[WriteJob]:
        """Several items: run the batch again one item at a time, in log order, to find the one at fault.
        One item: it is answered with the error (a query) or dead-lettered (a chunk); deletes are written."""
        log.error("forward pass failed", items=len(live), error=f"{type(exc).__name__}: {str(exc)[:300]}")
        if len(live) > 1:
            return [job for item in batch for job in self.compute([item])]
        (item,) = live
        info = ErrorInfo(code="forward_failed", message=f"the forward pass failed: {type(exc).__name__}: {str(exc)[:500]}")
        if isinstance(item.event, QueryRequest):
            self._reply_error(item.lane, item.record, item.event, item.handle, info)
        else:
            self.lanes[item.lane].dead_letter(item.record, info, item.handle)
        return _write_jobs(batch, {})

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
        replied = now_ms()
        self.admission.observed_reply(reply.timings_ms["total"], item.event.sent_at_ms, replied)
        self.admission.observed_finish(item.predicted_finish_ms, replied)
        self.metrics.texts.labels(lane=item.lane, kind="query").inc()

    def _skip_unchanged(self, items: list[WorkItem], deleted_earlier: set[int]) -> list[WorkItem]:
        """Finish, without embedding, the chunks whose stored point already matches (one lookup per collection).

        A chunk that a delete earlier in the same batch may remove is never skipped, nor one whose
        document still has writes on their way to the sink (the store is about to change under it).
        Those writes are waited for first (at most ``_SKIP_WAIT_S``: the output queue holds two
        batches), so a redelivered document right behind its first delivery is still recognised."""
        candidates = [i for i in items if isinstance(i.event, ChunkEvent) and id(i) not in deleted_earlier]
        if not candidates:
            return items
        docs = {i.doc_key for i in candidates}
        self._wait_answering_queries(lambda: docs.isdisjoint(self.docs_in_flight), _SKIP_WAIT_S)
        with self.writes:
            in_flight = set(self.docs_in_flight)
        chunks = [i for i in candidates if i.doc_key not in in_flight]
        if not chunks:
            return items
        lookup = self.lookups.start([i.event for i in chunks])
        if lookup is None or not self._wait_answering_queries(lookup.done, _SKIP_WAIT_S):
            log.warning("unchanged-chunk lookup unanswered; embedding the batch", waited_s=_SKIP_WAIT_S)
            return items
        try:
            same = lookup.result()
        except Exception as exc:  # noqa: BLE001 - lookup failed: embed them all; the upsert retries the sink
            log.warning("unchanged-chunk lookup failed; embedding the batch", error=str(exc)[:300])
            return items
        skipped = {id(item) for item, hit in zip(chunks, same) if hit}
        for item in chunks:
            if id(item) in skipped:
                OffsetTracker.done(item.handle)
                self.metrics.chunks_unchanged.labels(lane=item.lane).inc()
        return [i for i in items if id(i) not in skipped] if skipped else items

    def model_step(self) -> None:
        """Wait for queued work (idle), form a batch and compute it (busy), hand it on (blocked while full)."""
        waited = time.perf_counter()
        found = self._await_work(_WAIT_S)
        batch = self.next_batch() if found else []
        started = time.perf_counter()
        self.metrics.stage_idle.labels(stage="model").inc(started - waited)
        if not batch:
            return
        jobs = self.compute(batch)
        handed = time.perf_counter()
        self.metrics.stage_busy.labels(stage="model").inc(handed - started)
        for job in jobs:
            self._hand_on(job)
        self.metrics.stage_blocked.labels(stage="model").inc(time.perf_counter() - handed)
        self.progressed()

    def _hand_on(self, job: WriteJob) -> None:
        """Queue a job for the output stage, waiting while its queue is full (the backpressure); queued
        queries are answered meanwhile (a slow or absent sink holds writes, never replies)."""
        keys = job.doc_keys
        with self.writes:
            self.docs_in_flight.update(keys)

        handed: list[WriteJob] = []

        def handed_or_stopped() -> bool:
            try:
                self.to_output.put_nowait(job)
                handed.append(job)
                return True
            except queue.Full:
                return not self._stage_alive("output")

        self._wait_answering_queries(handed_or_stopped)
        if not handed:  # stopped: redelivered later
            log.info("stopping: a computed batch was not written", items=len(job.items))

    # -- output stage --------------------------------------------------------------------------
    def output_step(self) -> None:
        """Write the next computed batch (busy), or wait for one (idle)."""
        waited = time.perf_counter()
        try:
            job = self.to_output.get(timeout=_WAIT_S)
        except queue.Empty:
            self.metrics.stage_idle.labels(stage="output").inc(time.perf_counter() - waited)
            return
        held = 0.0
        if self.online_first is not None and job.items and job.items[0].lane == "bulk":
            held = self.online_first.hold()  # a query's pass and reply go first
            self.metrics.stage_blocked.labels(stage="output").inc(held)
        started = time.perf_counter()
        self.metrics.stage_idle.labels(stage="output").inc(started - waited - held)
        try:
            self.write(job)
        finally:
            keys = job.doc_keys
            with self.writes:
                self.docs_in_flight.subtract(keys)
                for key in keys:
                    if self.docs_in_flight[key] <= 0:
                        del self.docs_in_flight[key]
                self.writes.notify_all()
            self.metrics.stage_busy.labels(stage="output").inc(time.perf_counter() - started)
        self.progressed()

    def _output_drained(self) -> bool:
        """The output stage stops once the model stage has stopped and every computed batch is written."""
        if self._halt.is_set():
            return True
        if not self.stop_event.is_set():
            return False
        return not self._stage_alive("model") and self.to_output.empty()

    def _stage_alive(self, name: str) -> bool:
        return any(stage.name == name and stage.thread.is_alive() for stage in self.running_stages)

    def write(self, job: WriteJob) -> None:
        """Upsert runs of embedded chunks and apply deletes between them, exactly in log order."""
        run: list[WorkItem] = []
        for item in job.items:
            if OffsetTracker.revoked(item.handle):
                continue  # its partition moved: the new owner writes it
            if isinstance(item.event, DocumentDelete):
                if run:
                    self._upsert(run, job.vectors)
                    run = []
                reason = self._sink_write(lambda event=item.event: self.sink.delete(event), "sink delete", [item])
                self._settle(item, reason)
            elif id(item) in job.vectors:
                run.append(item)
        if run:
            self._upsert(run, job.vectors)

    def _sink_write(self, write, what: str, items: list[WorkItem], limit_s: float | None = None) -> ErrorInfo | None:
        """One sink write, retried by failure kind; a revocation of the partitions waits for it (``writing``)."""
        partitions = {(item.topic, item.partition) for item in items}
        with self.writes:
            self.writing = partitions
        try:
            return self.write_with_retry(write, what, self.metrics.sink_failures.inc, limit_s,
                                         abandoned=lambda: all(OffsetTracker.revoked(i.handle) for i in items))
        finally:
            with self.writes:
                self.writing = set()
                self.writes.notify_all()

    def _finish_writes_of(self, partitions: set[tuple[str, int]]) -> None:
        """On revocation: let a write of those partitions in progress finish (bounded), so it is committed
        now rather than landing after the new owner's writes."""
        with self.writes:
            self.writes.wait_for(lambda: not (self.writing & partitions), REVOKE_WAIT_S)

    def _upsert(self, run: list[WorkItem], vectors: dict[int, object], limit_s: float | None = None) -> None:
        """One upsert for the run; when the sink rejects it, each chunk alone finds the ones at fault."""
        embedded = [EmbeddedChunk(i.event, vectors[id(i)], {"topic": i.topic, "partition": i.partition,
                                                            "offset": i.offset}) for i in run]
        upsert_start = time.perf_counter()
        reason = self._sink_write(lambda: self.sink.upsert(embedded), "sink upsert", run, limit_s)
        if reason is not None and reason is not ABANDONED and len(run) > 1:
            for item in run:  # the failure already outlasted its bound: singles are not waited for again
                self._upsert([item], vectors, limit_s=0.0)
            return
        self.metrics.observe_stage("upsert", run[0].lane, (time.perf_counter() - upsert_start) * 1000)
        for item in run:
            self._settle(item, reason)
        if reason is None:
            self.metrics.texts.labels(lane=run[0].lane, kind="chunk").inc(len(run))

    def _settle(self, item: WorkItem, reason: ErrorInfo | None) -> None:
        """Written: finished. Refused by the sink for good: dead-lettered with the reason. Revoked: nothing
        (the partition's new owner has the record again)."""
        if OffsetTracker.revoked(item.handle):
            return
        if reason is None:
            OffsetTracker.done(item.handle)
        else:
            self.lanes[item.lane].dead_letter(item.record, reason, item.handle)

    # -- intake stage (this thread owns the consumers) ------------------------------------------
    def stages(self) -> list[Stage]:
        return [self.new_stage("model", self.model_step),
                self.new_stage("output", self.output_step, halted=self._output_drained)]

    def run_once(self) -> int:
        """One intake step: poll every lane (decode, validate, tokenise, queue), commit what finished.

        Queues over their bound have their partitions paused inside the poll (the group keeps the
        member); when every lane is paused, wait for the model stage to take work instead of spinning."""
        started = time.perf_counter()
        online, bulk = self.lanes.get("online"), self.lanes.get("bulk")
        taken = 0
        if online is not None:
            taken += self.intake("online", online.joining_timeout(_ONLINE_POLL_MS if bulk is not None else 50))
        if bulk is not None:
            taken += self.intake("bulk", bulk.joining_timeout(0 if online is not None else 50))
        busy = time.perf_counter()
        self.metrics.stage_busy.labels(stage="intake").inc(busy - started)
        if not taken and all(lane.paused for lane in self.lanes.values()):
            with self.queued:
                self.queued.wait(_WAIT_S)  # a take by the model stage wakes this
            self.metrics.stage_blocked.labels(stage="intake").inc(time.perf_counter() - busy)
        now = time.monotonic()
        # A synchronous commit is a broker round trip: under load, commit every commit_interval_s
        # (a crash redoes at most that much, harmlessly: upserts are idempotent); when idle, at once.
        if now - self.last_commit >= self.options.commit_interval_s or (not taken and self._idle()):
            for lane in self.lanes.values():
                lane.commit()
                lane.record_lag(self.metrics)
            self.last_commit = now
        return taken

    def _idle(self) -> bool:
        return self.to_output.empty() and not any(lane.queue for lane in self.lanes.values())

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


def _write_jobs(batch: list[WorkItem], vectors: dict[int, object]) -> list[WriteJob]:
    """What of a computed batch goes to the output stage: nothing when it writes nothing (queries answered,
    chunks found unchanged), so reply-only work never waits for room there."""
    writes = vectors or any(isinstance(item.event, DocumentDelete) for item in batch)
    return [WriteJob(batch, vectors)] if writes else []


def _yield_points(engine: Engine) -> int:
    """The layers whose checkpoints a pass of this engine offers (two per layer on the packed CPU paths:
    after attention and after each MLP tile); 0 on a GPU, where the pass is queued on the device at
    once, and on the padded fallback, which has none."""
    runner = engine.runner
    if runner.device.type != "cpu" or not runner.path.startswith("packed"):
        return 0
    return len(getattr(runner.encoder, "layers", ()))


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
