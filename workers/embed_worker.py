"""The embed worker: lanes -> token-budget batch -> engine -> Qdrant / reply -> commit.

Two lanes (``workers/transport/lane.py``), each its own consumer group (they may run as separate deployments):
online (online chunks and queries) and bulk (bulk chunks). Three overlapped stages
(``workers/stages.py``): intake (poll, decode, validate, tokenise), model (form a batch with the
``Scheduler``, compute, answer queries) and output (sink writes in log order, then the records are
finished). Who goes first, waits or is refused is the ``TurnPolicy``'s (``workers/policy.py``).
Offsets are committed only after the write (or reply, or dead letter) of every earlier record of the
partition. Undecodable or invalid records, and records the sink rejects for good, are dead-lettered.
Queries never wait on the sink: the model stage makes no store call of its own (lookups run on their
own thread), and only work that writes goes to the bounded output queue.
"""

from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

from pydantic import Field

from embedstream import logs
from embedstream.config import Settings, WorkerSettings
from embedstream.engine.engine import EmbedRequest, Engine, StageTimings
from embedstream.engine.prepared import Prepared
from embedstream.engine.errors import EngineError
from embedstream.engine.yield_points import yielding_to
from embedstream.producers.search_routing import is_query_topic, online_topics
from embedstream.schemas import ChunkEvent, DocumentDelete, ErrorInfo, QueryReply, QueryRequest
from embedstream.schemas.codec import DecodeError, decode, encode
from embedstream.schemas.events import CHUNK_TOPIC_ADAPTER, SparseTerms, now_ms
from embedstream.workers.admission import SHED_MESSAGES, AdmissionConfig, LaneController
from embedstream.workers.transport.lane import Lane, SyncQueue, Taken
from embedstream.workers.loop import new_worker_id
from embedstream.workers.transport.kafka_io import MAX_REQUEST_BYTES
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.policy import BULK, ONLINE, TurnPolicy
from embedstream.workers.scheduler import Scheduler
from embedstream.workers.output_stage import OutputStage, WriteJob
from embedstream.workers.sink import QdrantSink
from embedstream.workers.stages import Stage, StagedWorkerLoop
from embedstream.workers.trust import TrustError, TrustPolicy, check_trust
from embedstream.workers.unchanged import StoredChunks, UnchangedChunks

log = logs.get("embedstream.worker")

LANES = (ONLINE, BULK)
_MAX_POLL_RECORDS = {ONLINE: 256, BULK: 2048}
_WAIT_S = 0.05  # longest a stage waits for work (or room) before it looks at stop and health again
_QUERY_LOOK_S = 0.002  # a model stage waiting on the sink looks for queries this often
_ONLINE_POLL_MS = 10  # intake's wait for queries when a bulk lane shares the thread (a query waits at most this)
_INTAKE_SLICE = 256  # records decoded and queued at once: the model stage starts on the first slice


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
    def doc_key(self) -> str | None:
        """The doc_id of a chunk or delete (whatever collection name reached it): its writes stay in log order."""
        return None if isinstance(self.event, QueryRequest) else self.event.doc_id


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
        self.admission = LaneController(ONLINE, AdmissionConfig.from_settings(self.options))  # the online lane's estimators
        self.scheduler.admission = self.admission  # bulk slices shrink while online is at risk
        both = {ONLINE, BULK} <= set(self.options.lanes)
        self.turns = TurnPolicy(self.admission, self._online_queued, max_aside_s=0.05 if both else 0.0)
        # A bulk pass on the CPU lets queued queries run between its layers (engine/yield_points.py), and gives
        # itself up there when the worker stops (with or without an online lane).
        self.checkpoints = _yield_points(engine)
        self.yield_points = self.checkpoints if both else 0
        self.scheduler.yield_points = max(1, self.yield_points)
        if both and engine.runner.path.startswith("openvino"):
            log.warning("online_waits_for_bulk_passes", path=engine.runner.path,
                        why="an OpenVINO pass does not yield between layers: a query waits for the whole bulk pass "
                            "ahead of it; run online lanes on backend auto (packed) and bulk on openvino")
        self._served_between_s = 0.0  # time the current bulk pass spent serving online work at its checkpoints
        self.last_commit = 0.0
        self.trust = TrustPolicy.from_settings(settings)
        self.queued = threading.Condition(threading.RLock())  # every lane queue's changes; waits for work or room
        self.output = OutputStage(self)
        self.unchanged = UnchangedChunks(StoredChunks(sink).lookup, self._wait_answering_queries, self.output.docs,
                                         self.metrics, lambda: self.options.skip_unchanged)  # lookups off this stage
        kafka = settings.kafka
        topics = {ONLINE: online_topics(kafka, settings.qdrant.collection), BULK: [kafka.topic_chunks_bulk]}
        groups = {ONLINE: kafka.group_online, BULK: kafka.group_bulk}
        for lane in self.options.lanes:
            self.add_lane(lane, topics[lane], groups[lane], _MAX_POLL_RECORDS[lane], full=self._full_check(lane),
                          queue=SyncQueue(self.queued), on_revoke=self.output.finish_writes_of,
                          online=lane == ONLINE)

    def _full_check(self, lane: str):
        """When a lane's partitions pause: its queue at ``max_queue_tokens``; the bulk lane's also while
        ``bulk_paused`` (online over its target even with shrunk slices); what is queued still drains."""
        limit = self.options.max_queue_tokens
        if lane == BULK:
            return lambda q: q.tokens >= limit or self.scheduler.update_pause()
        return lambda q: q.tokens >= limit

    def _online_queued(self) -> bool:
        online = self.lanes.get(ONLINE)
        return online is not None and bool(online.queue)

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
            if name == BULK:  # online first: fetch queries while online work is pending, then decode this slice
                self.turns.step_aside(lambda s: self.intake(ONLINE, max(1, round(s * 1000))))
            self._queue_records(lane, records[first:first + _INTAKE_SLICE], received)
        if name == ONLINE:
            self.scheduler.online_arrived()
            self.turns.arrived(received, len(records))
        self.metrics.queue_depth(name, len(lane.queue), lane.queue.tokens)
        return len(records)

    def _queue_records(self, lane: Lane, records: list, received: float) -> None:
        """Decode, validate and tokenise some records, then queue them at once (one lock, one wake-up)."""
        name = lane.name
        staged: list[tuple] = []
        for record in records:
            handle = lane.track(record)
            try:
                if is_query_topic(self.kafka, record.topic):
                    event = decode(record.value, QueryRequest, self.kafka.max_record_bytes)
                else:
                    event = decode(record.value, CHUNK_TOPIC_ADAPTER, self.kafka.max_record_bytes)
                event = check_trust(event, self.trust)
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
        lane.queue.push_many(self._on_arrival(lane, ready))

    def _check_model(self, event) -> None:
        model = getattr(event, "model", None)
        if model and model != self.engine.spec.name:
            raise EngineError("unknown_model", f"model {model!r} is not served by this worker (it serves {self.engine.spec.name!r})")
        if getattr(event, "sparse", False) and self.engine.sparse is None:
            raise EngineError("sparse_unavailable", "this worker has no sparse encoder (EMBEDSTREAM_SPARSE__KIND)")

    @staticmethod
    def _request(event) -> EmbedRequest:
        if isinstance(event, QueryRequest):
            return EmbedRequest(event.request_id, event.text, event.dimensions, event.dtype, normalize=event.normalize,
                                truncate=event.truncate, prompt=event.prompt, sparse=event.sparse,
                                token_states=event.token_embeddings, truncate_left=event.truncation_direction == "left",
                                max_tokens=event.max_tokens)
        return EmbedRequest(f"{event.doc_id}/{event.chunk_id}", event.text, prompt="document",
                            token_ids=event.token_id_array(), tokenizer=event.tokenizer)

    def _reject(self, lane: Lane, record, handle, event, err: EngineError) -> None:
        info = ErrorInfo(code=err.code, message=err.message)
        if isinstance(event, QueryRequest):
            self._reply_error(lane.name, record, event, handle, info)
        else:
            lane.dead_letter(record, info, handle)

    def _on_arrival(self, lane: Lane, items: list[WorkItem]) -> list[WorkItem]:
        """The items to queue; the queries the policy sheds on arrival are answered ``deadline_exceeded`` at once."""
        now, ahead, admitted = now_ms(), lane.queue.tokens, []
        for item in items:
            if isinstance(item.event, QueryRequest):
                arrival = self.turns.on_arrival(item.event.deadline_ms, now, ahead, item.tokens,
                                                self.engine.limits.max_batch_tokens)
                if arrival.shed is not None:
                    self._shed(item, arrival.shed)
                    continue
                item.deadline_ms, item.predicted_finish_ms = arrival.deadline_ms, arrival.predicted_finish_ms
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
        online, bulk = self.lanes.get(ONLINE), self.lanes.get(BULK)
        if online is not None:
            self.turns.gather(online.queue.oldest, now_ms(), lambda: self._online_arrivals(online),
                              lambda: online.queue.tokens >= self.engine.limits.max_batch_tokens,
                              lambda: online.queue.tokens)
        with self.queued:  # both lanes at once: a revocation cannot drop items between measuring and taking
            return self.scheduler.next_batch(online.queue if online else None, bulk.queue if bulk else None)

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
        write (chunks with their vectors or written without a forward pass, deletes) goes on as one
        write job, in log order."""
        start = time.perf_counter()
        batch = [item for item in batch if not OffsetTracker.revoked(item.handle)]  # revoked: the new owner's
        self._observe_queue_wait(batch, start)
        live = self._drop_expired([i for i in batch if not isinstance(i.event, DocumentDelete)], now_ms())
        live, reused, hold = self.unchanged.skip(live, batch)  # its documents are in flight from the lookup on
        try:
            vectors = self._embed(live, start) if live else {}
        except _StoppedMidPass:  # nothing written, nothing finished: the records are redelivered to the next owner
            log.info("stopping: a bulk pass was given up between its layers", items=len(live))
            self.output.docs.release(hold)
            return []
        finally:
            self.output.docs.computed(hold)
        return self.output.jobs(batch, vectors, reused, hold)

    def _embed(self, live: list[WorkItem], start: float) -> dict[int, object]:
        """One forward pass for ``live``: queries are answered, the chunks' vectors returned (id(item) -> vector)."""
        timings = StageTimings()
        kind = live[0].lane
        predicted_ms = self.admission.model.predict(sum(i.tokens for i in live))
        preemptible = self.yield_points > 0 and kind == BULK
        # A query arriving now waits for all of this pass, or one step where it yields (two per layer).
        wait_ms = predicted_ms / (2 * self.yield_points) if preemptible else predicted_ms
        if preemptible:
            self._served_between_s = 0.0
        pass_start = time.perf_counter()
        try:
            with self.turns.running_pass(kind, wait_ms), \
                    (yielding_to(self._at_checkpoint) if self.checkpoints and kind == BULK else nullcontext()):
                vectors = self.engine.forward([i.prepared for i in live], timings)
        except _StoppedMidPass:
            raise  # the worker stops: ``compute`` drops the pass
        except Exception as exc:  # noqa: BLE001 - a failed pass fails its records, never the worker
            return self._forward_failed(live, exc, start)
        served_ms = self._served_between_s * 1000 if preemptible else 0.0
        timings.forward_ms = max(0.0, timings.forward_ms - served_ms)  # this pass's own time
        self.metrics.observe_batch(kind, timings, len(live))
        pass_ms = (time.perf_counter() - pass_start) * 1000 - served_ms
        self.turns.observed_pass(timings.tokens, pass_ms, kind)
        self.metrics.observe_pass(kind, self.admission.window_ms, predicted_ms, pass_ms)
        self.metrics.queue_age.labels(lane=kind).set(pass_start - min(i.received for i in live))
        chunks = {}
        for item, vector in zip(live, vectors):
            if isinstance(item.event, QueryRequest):
                self._answer(item, vector, start, timings)
            else:
                chunks[id(item)] = vector
        return chunks

    def _at_checkpoint(self) -> None:
        """Between two layers of a bulk pass: give the pass up if the worker is stopping (a pass can outlast
        the stages' join at stop: 30-45 s for 8,192 MiniLM tokens on a busy 2-vCPU host), else serve the
        queued online work (when this worker has an online lane)."""
        if self.stopping():
            raise _StoppedMidPass
        self.output.again.serve(self._forward_items)  # lost races first: the output stage waits for them
        if self.yield_points:
            self._serve_online_between()

    def _serve_online_between(self) -> None:
        """At a bulk pass's checkpoint: compute the queued online work now (no window: it is late already),
        hand its writes on, then let the bulk pass go on."""
        if not self.turns.online_first():
            return
        start = time.perf_counter()
        online = self.lanes[ONLINE]
        with self.queued:
            batch = self.scheduler.next_batch(online.queue, None)
        for job in self.compute(batch) if batch else []:
            self._hand_on(job)
        self._served_between_s += time.perf_counter() - start

    def _wait_answering_queries(self, done, timeout_s: float | None = None) -> bool:
        """Wait on the model stage for ``done()`` (room in the output queue, a lookup, writes in flight), at most
        ``timeout_s`` (None: until it is done or the worker stops), answering queued queries meanwhile: they
        make no write, so nothing the sink holds back can hold them. Whether ``done()`` came true."""
        end = None if timeout_s is None else time.monotonic() + timeout_s
        stage = self.current_stage()
        online = self.lanes.get(ONLINE)
        while not done():
            if self._halt.is_set() or (end is not None and time.monotonic() >= end):
                return False
            self.output.again.serve(self._forward_items)
            if online is not None and online.queue:
                with self.queued:
                    queries = online.queue.take_where(lambda i: isinstance(i.event, QueryRequest), self.engine.limits)
                if queries:
                    self.compute(queries)  # replies only: no write job
                    continue
            with self.output.writes:
                self.output.writes.wait(_QUERY_LOOK_S)
            if stage is not None:
                stage.touch()  # held back by the sink on purpose: its own step is watched
        return True

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
        """At their turn: the queries the policy would see miss their deadline (the pass's predicted compute:
        all of a pass finishes together) are answered ``deadline_exceeded`` before compute."""
        pass_tokens = sum(item.tokens for item in items)
        live = []
        for item in items:
            if isinstance(item.event, QueryRequest):
                reason = self.turns.at_turn(item.deadline_ms, now, pass_tokens - item.tokens, item.tokens)
                if reason is not None:
                    self._shed(item, reason)
                    continue
            live.append(item)
        return live

    def _forward_failed(self, live: list[WorkItem], exc: Exception, start: float) -> dict[int, object]:
        """Several items: each alone through the model, in log order, to find the one at fault (what the
        batch decided without a forward pass stands: its lookup saw the whole batch). One item: it is
        answered with the error (a query) or dead-lettered (a chunk)."""
        log.error("forward pass failed", items=len(live), error=f"{type(exc).__name__}: {str(exc)[:300]}")
        if len(live) > 1:
            return {key: vector for item in live for key, vector in self._embed([item], start).items()}
        (item,) = live
        info = ErrorInfo(code="forward_failed", message=f"the forward pass failed: {type(exc).__name__}: {str(exc)[:500]}")
        if isinstance(item.event, QueryRequest):
            self._reply_error(item.lane, item.record, item.event, item.handle, info)
        else:
            self.lanes[item.lane].dead_letter(item.record, info, item.handle)
        return {}

    def _answer(self, item: WorkItem, vector, start: float, timings: StageTimings) -> None:
        result = self.engine.finish(item.prepared, vector)
        values = result.vector.values
        reply = QueryReply(
            request_id=item.event.request_id, embedding=result.vector.to_list(),
            dims=int(values.shape[0]) * (8 if result.vector.dtype == "binary" else 1),
            dtype=result.vector.dtype, scale=result.vector.scale, tokens=result.tokens, truncated=result.truncated,
            model=self.engine.spec.name, sparse=SparseTerms.of(result.sparse) if item.event.sparse else None,
            timings_ms={"queue_wait": (start - item.received) * 1000, **timings.as_dict(),
                        "total": (time.perf_counter() - item.received) * 1000},
        )
        if item.event.token_embeddings and result.token_states is not None:
            too_large = _with_token_states(reply, result.token_states)
            if too_large is not None:
                self._reply_error(item.lane, item.record, item.event, item.handle, too_large)
                return
        self.lanes[item.lane].reply(item.record, item.event, reply, item.handle)
        self.turns.replied(item.predicted_finish_ms, reply.timings_ms["total"], item.event.sent_at_ms, now_ms())
        self.metrics.texts.labels(lane=item.lane, kind="query").inc()

    def _forward_items(self, items: list[WorkItem]) -> list:
        return self.engine.forward([item.prepared for item in items], StageTimings())

    def model_step(self) -> None:
        """Wait for queued work (idle), form a batch and compute it (busy), hand it on (blocked while full)."""
        waited = time.perf_counter()
        self.output.again.serve(self._forward_items)
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
        handed: list[WriteJob] = []

        def handed_or_stopped() -> bool:
            if self.output.offer(job):
                handed.append(job)
            return bool(handed) or not self._stage_alive("output")

        self._wait_answering_queries(handed_or_stopped)
        if not handed:  # stopped: redelivered later
            log.info("stopping: a computed batch was not written", items=len(job.items))

    def _output_drained(self) -> bool:
        """The output stage stops once the model stage has stopped and every computed batch is written."""
        if self._halt.is_set():
            return True
        return self.stop_event.is_set() and not self._stage_alive("model") and self.output.queue.empty()

    def _stage_alive(self, name: str) -> bool:
        return any(stage.name == name and stage.thread.is_alive() for stage in self.running_stages)

    # -- intake stage (this thread owns the consumers) ------------------------------------------
    def stages(self) -> list[Stage]:
        return [self.new_stage("model", self.model_step),
                self.new_stage("output", self.output.step, halted=self._output_drained)]

    def run_once(self) -> int:
        """One intake step: poll every lane (decode, validate, tokenise, queue), commit what finished.

        Queues over their bound have their partitions paused inside the poll (the group keeps the
        member); when every lane is paused, wait for the model stage to take work instead of spinning."""
        started = time.perf_counter()
        online, bulk = self.lanes.get(ONLINE), self.lanes.get(BULK)
        taken = 0
        if online is not None:
            taken += self.intake(ONLINE, online.joining_timeout(_ONLINE_POLL_MS if bulk is not None else 50))
        if bulk is not None:
            taken += self.intake(BULK, bulk.joining_timeout(0 if online is not None else 50))
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
        return self.output.queue.empty() and not any(lane.queue for lane in self.lanes.values())

    def warm_up(self) -> None:
        if ONLINE in self.lanes and self.options.warm_up_tokens > 0:
            start = time.perf_counter()
            lengths = self.engine.warm_up(self.options.warm_up_tokens)
            log.info("query shapes warmed up", lengths=lengths, ms=round((time.perf_counter() - start) * 1000))

    def started_fields(self) -> dict:
        return {"lanes": list(self.options.lanes), "model": self.engine.spec.name,
                "path": self.engine.runner.describe(), "max_batch_tokens": self.engine.limits.max_batch_tokens}

    def readiness_checks(self) -> dict:
        return {**super().readiness_checks(), "qdrant": lambda: self.sink.store.list_collections() is not None}


class _StoppedMidPass(Exception):
    """Raised at a bulk pass's checkpoint when the worker stops; ``compute`` drops the pass (not a failure)."""


def _with_token_states(reply: QueryReply, states) -> ErrorInfo | None:
    """Put a text's token states (TEI's /embed_all) on its reply, or say why they cannot travel: the reply is
    one record, at most the reply producer's ``MAX_REQUEST_BYTES``."""
    encoded = QueryReply.encode_token_states(states)
    size = len(encode(reply)) + len(encoded) + 64  # the two new keys and their punctuation
    if size > MAX_REQUEST_BYTES:
        tokens, width = states.shape
        return ErrorInfo(code="reply_too_large", message=(
            f"{tokens} tokens x {width} floats make a {size:,}-byte reply, over the {MAX_REQUEST_BYTES:,}-byte "
            "reply record: send a shorter input (or truncate it)"))
    reply.token_embeddings, reply.token_dims = encoded, int(states.shape[1])
    return None


def _yield_points(engine: Engine) -> int:
    """The layers whose checkpoints a pass of this engine offers (two per layer on the packed CPU paths:
    after attention and after each MLP tile); 0 on a GPU, where the pass is queued on the device at
    once, and on the padded fallback, which has none."""
    runner = engine.runner
    if runner.device.type != "cpu" or not runner.path.startswith("packed"):
        return 0
    return len(getattr(runner.encoder, "layers", ()))
