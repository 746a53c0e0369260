"""The embed worker's Kafka loop: lanes -> token-budget batch -> engine -> Qdrant / reply -> commit.

Two lanes, each its own consumer group so they can also run as separate deployments:
* online: online chunks and query requests. Batched first, with a short batching window.
* bulk: bulk chunks. Only fills the token budget online work leaves, or runs when online is idle;
  while online traffic is recent, bulk batches are capped (``bulk_slice_tokens``) so a live query
  never waits behind a long bulk forward pass.
Offsets are committed only after the sink write (or reply / dead letter) for every earlier
record of the partition succeeded. Undecodable or invalid records go to the dead-letter topic with
the reason and the loop carries on. Queues are bounded: a slow sink pauses consumption.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from kafka import KafkaConsumer, KafkaProducer
from kafka.consumer.subscription_state import ConsumerRebalanceListener

from embedstream import logs
from embedstream.config import Settings
from embedstream.engine.batcher import take_prefix
from embedstream.engine.engine import EmbedRequest, Engine, Prepared, StageTimings
from embedstream.engine.errors import EngineError
from embedstream.schemas import ChunkEvent, DocumentDelete, ErrorInfo, QueryReply, QueryRequest
from embedstream.schemas.codec import DecodeError, decode
from embedstream.schemas.events import CHUNK_TOPIC_ADAPTER, now_ms
from embedstream.workers.batching_window import BatchingWindow
from embedstream.workers.kafka_io import WorkerLoop, commit_finished, send_dead_letter, send_reply, subscribe
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.offsets import OffsetTracker
from embedstream.workers.sink import EmbeddedChunk, QdrantSink

log = logs.get("embedstream.worker")

LANES = ("online", "bulk")


@dataclass
class WorkItem:
    """One decoded record waiting in a lane queue."""

    lane: str
    topic: str
    partition: int
    offset: int
    handle: list
    event: ChunkEvent | DocumentDelete | QueryRequest
    prepared: Prepared | None
    received: float = field(default_factory=time.perf_counter)

    @property
    def tokens(self) -> int:
        return len(self.prepared.tokens) if self.prepared else 0


@dataclass
class WorkerOptions:
    lanes: tuple[str, ...] = LANES
    online_window_ms: float = 2.0  # opens only while queries arrive densely (BatchingWindow)
    bulk_slice_tokens: int = 1024  # bulk batch cap while online traffic is recent
    online_quiet_s: float = 1.0  # online counts as "recent" for this long after its last item
    max_queue_tokens: int = 65536  # per lane; above it the lane's partitions are paused
    sink_backoff_s: tuple[float, float] = (0.2, 10.0)
    commit_interval_s: float = 0.25  # under load; an idle loop commits at once
    flush_timeout_s: float = 30.0  # a producer stuck after a long broker outage must not hang the loop
    skip_unchanged: bool = True  # do not embed a chunk whose point already has its content hash, model, metadata
    warm_up_tokens: int = 64  # online lane: build kernels for query lengths 1..N before reporting ready (0: off)
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{threading.get_ident()}")


class _Revocations(ConsumerRebalanceListener):
    """Drop queued work of partitions another worker now owns: it will be redelivered there."""

    def __init__(self, worker: "EmbedWorker", lane: str):
        self.worker, self.lane = worker, lane

    def on_partitions_revoked(self, revoked):
        # kafka-python 3 calls this on the consumer's IO thread, which refuses blocking calls: commit async
        self.worker._commit(self.lane, wait=False)
        self.worker._drop(self.lane, {(tp.topic, tp.partition) for tp in revoked})

    def on_partitions_assigned(self, assigned):
        log.info("partitions assigned", lane=self.lane, partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))


class EmbedWorker(WorkerLoop):
    """Drains the chunk and query topics through one Engine into one sink."""

    name = "embed worker"

    def __init__(self, settings: Settings, engine: Engine, sink: QdrantSink, options: WorkerOptions | None = None,
                 metrics: WorkerMetrics | None = None):
        self.settings = settings
        self.kafka = settings.kafka
        self.engine = engine
        self.sink = sink
        self.options = options or WorkerOptions()
        self.metrics = metrics or WorkerMetrics()
        self.queues: dict[str, deque[WorkItem]] = {lane: deque() for lane in self.options.lanes}
        self.queued_tokens = {lane: 0 for lane in self.options.lanes}
        self.offsets = {lane: OffsetTracker() for lane in self.options.lanes}
        self.paused: dict[str, bool] = {lane: False for lane in self.options.lanes}
        self.last_online = 0.0
        self.last_commit = 0.0
        self.window = BatchingWindow(self.options.online_window_ms)
        super().__init__()
        client = self.kafka.client_kwargs()
        self.producer = KafkaProducer(**client, acks="all", linger_ms=0, retries=5)
        self.consumers: dict[str, KafkaConsumer] = {}
        topics = {"online": [self.kafka.topic_chunks_online, self.kafka.topic_queries], "bulk": [self.kafka.topic_chunks_bulk]}
        groups = {"online": self.kafka.group_online, "bulk": self.kafka.group_bulk}
        for lane in self.options.lanes:
            consumer = KafkaConsumer(
                **client,
                group_id=groups[lane],
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                fetch_max_wait_ms=self.kafka.fetch_max_wait_ms,
                max_poll_records=256 if lane == "online" else 2048,
                client_id=f"embedstream-{lane}-{self.options.worker_id}",
                # A group joined before its topics' metadata arrived gets an empty assignment until
                # the next refresh: keep refreshes frequent so new or grown topics are noticed.
                metadata_max_age_ms=10_000,
                **({"session_timeout_ms": self.kafka.session_timeout_ms} if self.kafka.session_timeout_ms else {}),
            )
            subscribe(consumer, topics[lane], _Revocations(self, lane))
            self.consumers[lane] = consumer

    # -- intake ---------------------------------------------------------------------------------
    def _poll(self, lane: str, timeout_ms: int) -> int:
        """Fetch, decode, validate and tokenise records; bad ones are dead-lettered at once."""
        consumer = self.consumers.get(lane)
        if consumer is None:
            return 0
        self._apply_backpressure(lane)
        batches = consumer.poll(timeout_ms=timeout_ms)
        records = [r for recs in batches.values() for r in recs]
        if not records:
            return 0
        received = time.perf_counter()
        staged: list[tuple] = []
        for record in records:
            handle = self.offsets[lane].track(record.topic, record.partition, record.offset)
            try:
                if record.topic == self.kafka.topic_queries:
                    event = decode(record.value, QueryRequest, self.kafka.max_record_bytes)
                else:
                    event = decode(record.value, CHUNK_TOPIC_ADAPTER, self.kafka.max_record_bytes)
            except DecodeError as err:
                self._dead_letter(record, err.to_error_info(), handle, lane)
                continue
            try:
                self._check_model(event)
            except EngineError as err:
                self._reject(lane, record, handle, event, err)
                continue
            staged.append((record, handle, event))
        to_embed = [(r, h, e) for r, h, e in staged if not isinstance(e, DocumentDelete)]
        requests = [self._request(e) for _, _, e in to_embed]
        timings = StageTimings()
        prepared = iter(self.engine.prepare(requests, timings) if requests else [])
        self.metrics.observe_stage("tokenize", lane, timings.tokenize_ms)
        for record, handle, event in staged:
            prep = None if isinstance(event, DocumentDelete) else next(prepared)
            if isinstance(prep, EngineError):
                self._reject(lane, record, handle, event, prep)
                continue
            item = WorkItem(lane, record.topic, record.partition, record.offset, handle, event, prep, received)
            self.queues[lane].append(item)
            self.queued_tokens[lane] += item.tokens
        if lane == "online":
            self.last_online = time.monotonic()
            self.window.arrived(received, len(records))
        self.metrics.queue_depth(lane, len(self.queues[lane]), self.queued_tokens[lane])
        return len(records)

    def _check_model(self, event) -> None:
        model = getattr(event, "model", None)
        if model and model != self.engine.spec.name:
            raise EngineError("unknown_model", f"model {model!r} is not served by this worker (it serves {self.engine.spec.name!r})")

    @staticmethod
    def _request(event) -> EmbedRequest:
        if isinstance(event, QueryRequest):
            return EmbedRequest(event.request_id, event.text, event.dimensions, event.dtype, prompt=event.prompt)
        return EmbedRequest(f"{event.doc_id}/{event.chunk_id}", event.text, prompt="document")

    def _reject(self, lane: str, record, handle, event, err: EngineError) -> None:
        info = ErrorInfo(code=err.code, message=err.message)
        if isinstance(event, QueryRequest):
            self._reply(event, QueryReply(request_id=event.request_id, model=self.engine.spec.name, error=info))
            OffsetTracker.done(handle)
            self.metrics.errors.labels(lane=lane, code=err.code).inc()
        else:
            self._dead_letter(record, info, handle, lane)

    def _dead_letter(self, record, error: ErrorInfo, handle, lane: str) -> None:
        send_dead_letter(self.producer, self.kafka.topic_dead_letters, record, error, handle,
                         self.options.worker_id, self.metrics, lane)

    def _reply(self, request: QueryRequest, reply: QueryReply) -> None:
        send_reply(self.producer, request, reply)

    def _apply_backpressure(self, lane: str) -> None:
        """Pause a lane's partitions while its queue is full (bounded memory), resume when drained."""
        consumer = self.consumers[lane]
        full = self.queued_tokens[lane] >= self.options.max_queue_tokens
        if full and not self.paused[lane]:
            consumer.pause(*consumer.assignment())
            self.paused[lane] = True
        elif not full and self.paused[lane]:
            consumer.resume(*consumer.paused())
            self.paused[lane] = False

    def _drop(self, lane: str, partitions: set[tuple[str, int]]) -> None:
        kept = deque(i for i in self.queues[lane] if (i.topic, i.partition) not in partitions)
        self.queues[lane] = kept
        self.queued_tokens[lane] = sum(i.tokens for i in kept)
        self.offsets[lane].forget(partitions)

    # -- batch formation -----------------------------------------------------------------------
    def _take(self, lane: str, used_tokens: int, used_requests: int, max_tokens: int) -> list[WorkItem]:
        """FIFO prefix of a lane within the budget left. Deletes ride along (they cost no tokens) and
        are applied in their place in the log order when the batch is written."""
        queue = self.queues[lane]
        if not queue:
            return []
        lengths = [item.tokens for item in queue]
        limits = self.engine.limits
        budget = type(limits)(min(max_tokens, limits.max_batch_tokens), limits.max_batch_requests)
        count = take_prefix(lengths, budget, used_tokens, used_requests)
        if count == 0 and used_requests == 0:
            count = 1  # an item larger than a slice still runs alone
        taken = [queue.popleft() for _ in range(count)]
        self.queued_tokens[lane] -= sum(i.tokens for i in taken)
        return taken

    def _next_batch(self) -> list[WorkItem]:
        batch: list[WorkItem] = []
        if "online" in self.queues:
            self._await_online_window()
            batch = self._take("online", 0, 0, self.engine.limits.max_batch_tokens)
        if "bulk" in self.queues:
            online_recent = "online" in self.queues and time.monotonic() - self.last_online < self.options.online_quiet_s
            cap = self.options.bulk_slice_tokens if online_recent else self.engine.limits.max_batch_tokens
            used = sum(i.tokens for i in batch)
            batch += self._take("bulk", used, len(batch), cap if not batch else self.engine.limits.max_batch_tokens)
        return batch

    def _await_online_window(self) -> None:
        """Give a fresh online batch up to ``online_window_ms`` to grow, while traffic is dense."""
        queue = self.queues["online"]
        if queue:
            self.window.gather(queue[0].received, lambda: self._poll("online", 1),
                               lambda: self.queued_tokens["online"] >= self.engine.limits.max_batch_tokens)

    # -- processing ----------------------------------------------------------------------------
    def _process(self, batch: list[WorkItem]) -> None:
        """Embed what needs embedding in one forward pass, answer queries, then write chunks and
        deletes to the sink in log order; offsets become committable only after their write."""
        start = time.perf_counter()
        now = now_ms()
        live = []
        for item in batch:
            if isinstance(item.event, DocumentDelete):
                continue
            wait_ms = (start - item.received) * 1000
            self.metrics.observe_stage("queue_wait", item.lane, wait_ms)
            if isinstance(item.event, QueryRequest) and item.event.deadline_ms and item.event.deadline_ms < now:
                self._reply(item.event, QueryReply(request_id=item.event.request_id, model=self.engine.spec.name,
                                                   error=ErrorInfo(code="deadline_exceeded", message="the request's deadline passed before it was embedded")))
                OffsetTracker.done(item.handle)
                continue
            live.append(item)
        if self.options.skip_unchanged:
            live = self._skip_unchanged(live, _deleted_earlier(batch))
        if not live:
            self._write(batch, {})
            return
        timings = StageTimings()
        vectors = self.engine.forward([i.prepared for i in live], timings)
        lane = live[0].lane
        self.metrics.observe_batch(lane, timings, len(live))
        chunks, queries = [], []
        for item, vector in zip(live, vectors):
            (queries if isinstance(item.event, QueryRequest) else chunks).append((item, vector))
        for item, vector in queries:
            result = self.engine.finish(item.prepared, vector)
            total_ms = (time.perf_counter() - item.received) * 1000
            reply = QueryReply(
                request_id=item.event.request_id, embedding=result.vector.to_list(), dims=int(result.vector.values.shape[0])
                if result.vector.dtype != "binary" else int(result.vector.values.shape[0]) * 8,
                dtype=result.vector.dtype, scale=result.vector.scale, tokens=result.tokens, truncated=result.truncated,
                model=self.engine.spec.name,
                timings_ms={"queue_wait": (start - item.received) * 1000, **timings.as_dict(), "total": total_ms},
            )
            self._reply(item.event, reply)
            OffsetTracker.done(item.handle)
            self.metrics.texts.labels(lane=item.lane, kind="query").inc()
        self._write(batch, {id(item): vector for item, vector in chunks})

    def _write(self, batch: list[WorkItem], vectors: dict[int, object]) -> None:
        """Upsert runs of embedded chunks and apply deletes between them, exactly in batch order."""
        run: list[WorkItem] = []

        def flush_run() -> None:
            if not run:
                return
            embedded = [EmbeddedChunk(i.event, vectors[id(i)], {"topic": i.topic, "partition": i.partition,
                                                                 "offset": i.offset}) for i in run]
            upsert_start = time.perf_counter()
            self._with_sink_retry(lambda: self.sink.upsert(embedded))
            self.metrics.observe_stage("upsert", run[0].lane, (time.perf_counter() - upsert_start) * 1000)
            for item in run:
                OffsetTracker.done(item.handle)
            self.metrics.texts.labels(lane=run[0].lane, kind="chunk").inc(len(run))
            run.clear()

        for item in batch:
            if isinstance(item.event, DocumentDelete):
                flush_run()
                self._with_sink_retry(lambda event=item.event: self.sink.delete(event))
                OffsetTracker.done(item.handle)
            elif id(item) in vectors:
                run.append(item)
        flush_run()

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

    def _with_sink_retry(self, write) -> None:
        """Retry a sink write with exponential backoff; consumers are paused meanwhile, nothing commits."""
        delay, ceiling = self.options.sink_backoff_s
        paused: list[tuple[KafkaConsumer, list]] = []
        try:
            while True:
                try:
                    write()
                    return
                except Exception as exc:  # noqa: BLE001 - any sink failure: back off, keep the work
                    if self.stop_event.is_set():
                        raise
                    self.metrics.sink_failures.inc()
                    log.warning("sink write failed; backing off", error=str(exc)[:300], retry_in_s=delay)
                    if not paused:
                        for consumer in self.consumers.values():
                            assigned = list(consumer.assignment())
                            consumer.pause(*assigned)
                            paused.append((consumer, assigned))
                    end = time.monotonic() + delay
                    while time.monotonic() < end and not self.stop_event.is_set():
                        for consumer, _ in paused:
                            consumer.poll(timeout_ms=50)  # paused: keeps group membership, fetches nothing
                    delay = min(delay * 2, ceiling)
        finally:
            for consumer, assigned in paused:
                consumer.resume(*[tp for tp in assigned if tp in consumer.assignment()])
            for lane in self.paused:
                self.paused[lane] = False

    def _commit(self, lane: str, wait: bool = True) -> None:
        commit_finished(self.consumers[lane], self.producer, self.offsets[lane], wait=wait,
                        flush_timeout_s=self.options.flush_timeout_s, lane=lane)

    # -- main loop -----------------------------------------------------------------------------
    def run_once(self) -> int:
        """One iteration: poll, form a batch, process it, commit. Returns items processed."""
        busy = any(self.queues.values())
        if "online" in self.consumers:
            self._poll("online", self._timeout("online", 0 if busy else 20))
        if "bulk" in self.consumers and self.queued_tokens["bulk"] < self.options.max_queue_tokens:
            self._poll("bulk", self._timeout("bulk", 0 if (busy or "online" in self.consumers) else 50))
        batch = self._next_batch()
        if batch:
            self._process(batch)
        now = time.monotonic()
        # A synchronous commit is a broker round trip: under load, commit every commit_interval_s
        # (a crash redoes at most that much, harmlessly: upserts are idempotent); when idle, at once.
        if not batch or now - self.last_commit >= self.options.commit_interval_s:
            for lane in self.options.lanes:
                self._commit(lane)
                self.metrics.lag(lane, self.consumers[lane])
            self.last_commit = now
        return len(batch)

    def _timeout(self, lane: str, wanted_ms: int) -> int:
        """A consumer still joining its group needs blocking polls to finish the join."""
        return wanted_ms if self.consumers[lane].assignment() else max(wanted_ms, 100)

    def warm_up(self) -> None:
        if "online" in self.options.lanes and self.options.warm_up_tokens > 0:
            start = time.perf_counter()
            lengths = self.engine.warm_up(self.options.warm_up_tokens)
            log.info("query shapes warmed up", lengths=lengths, ms=round((time.perf_counter() - start) * 1000))

    def started_fields(self) -> dict:
        return {"lanes": list(self.options.lanes), "model": self.engine.spec.name,
                "path": self.engine.runner.describe(), "max_batch_tokens": self.engine.limits.max_batch_tokens}

    def close(self) -> None:
        for lane in self.options.lanes:
            try:
                self._commit(lane)
            except Exception as exc:  # noqa: BLE001 - closing: report and carry on
                log.warning("final commit failed", lane=lane, error=str(exc))
        for consumer in self.consumers.values():
            consumer.close(autocommit=False)
        self.producer.close()


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
