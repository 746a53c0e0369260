"""The rerank worker's Kafka loop: rerank and search requests -> one packed cross-encoder pass -> replies.

Consumes ``topic_rerank`` (RerankRequest: candidates given) and ``topic_search`` (SearchRequest:
embed, retrieve from Qdrant, then rerank) with the ``group_rerank`` consumer group.

* The candidates of every request waiting in the queue (up to ``max_pairs_per_pass`` pairs) go
  through **one** ``Engine.score`` call, so the token-budget batcher packs pairs of several
  requests into the same padding-free forward passes; scores are split back per request, sorted
  and cut to ``top_n``.
* Records that do not decode are dead-lettered with the reason. Requests that decode but cannot be
  served (empty query, no candidates, too many, unknown model, unknown collection, deadline passed)
  get an error reply on ``reply_to``.
* Offsets are committed only after the reply (or dead letter) of every earlier record of the
  partition is produced (``OffsetTracker``; the producer is flushed before each commit).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka.consumer.subscription_state import ConsumerRebalanceListener

from embedstream import logs
from embedstream.config import Settings
from embedstream.engine.engine import Engine, ScoreRequest, ScoreResult, StageTimings
from embedstream.engine.errors import EngineError
from embedstream.schemas import ErrorInfo
from embedstream.schemas.codec import DecodeError, decode
from embedstream.schemas.events import now_ms
from embedstream.schemas.rerank import Candidate, RankedResult, RerankReply, RerankRequest, SearchReply, SearchRequest
from embedstream.workers import kafka_io
from embedstream.workers.kafka_io import WorkerLoop, broker_reachable, commit_finished, send_dead_letter, send_reply, subscribe
from embedstream.workers.batching_window import BatchingWindow
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.offsets import OffsetTracker
from embedstream.workers.search import Retrieved, Searcher, SearchError

log = logs.get("embedstream.rerank")

LANE_RERANK = "rerank"
LANE_SEARCH = "search"


@dataclass
class RerankOptions:
    max_candidates: int = 50  # more is refused, or cut to this many when the request says cut=true
    max_pairs_per_pass: int = 512  # pairs of several queued requests scored in one Engine.score call
    batch_window_ms: float = 2.0  # how long a fresh request may wait for others to join its pass
    max_queue_requests: int = 256  # above it the partitions are paused (bounded memory)
    default_collection: str = "docs"
    worker_id: str = field(default_factory=lambda: f"{socket.gethostname()}-{threading.get_ident()}")


@dataclass
class _Item:
    lane: str
    topic: str
    partition: int
    offset: int
    handle: list
    request: RerankRequest | SearchRequest
    candidates: list[Candidate] = field(default_factory=list)
    received: float = field(default_factory=time.perf_counter)

    @property
    def pairs(self) -> int:
        if isinstance(self.request, SearchRequest):
            return self.request.top_k if self.request.rerank else 0
        return len(self.candidates)


class _Rejected(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class _Revocations(ConsumerRebalanceListener):
    def __init__(self, worker: "RerankWorker"):
        self.worker = worker

    def on_partitions_revoked(self, revoked):
        self.worker._commit(wait=False)  # runs on kafka-python's IO thread: no blocking calls
        self.worker._drop({(tp.topic, tp.partition) for tp in revoked})

    def on_partitions_assigned(self, assigned):
        log.info("partitions assigned", partitions=sorted(f"{tp.topic}/{tp.partition}" for tp in assigned))


class RerankWorker(WorkerLoop):
    """Serves RerankRequests (and SearchRequests when a Searcher is given) with one cross-encoder."""

    name = "rerank worker"

    def __init__(self, settings: Settings, engine: Engine, options: RerankOptions | None = None,
                 metrics: WorkerMetrics | None = None, searcher: Searcher | None = None):
        if engine.spec.kind != "rerank":
            raise ValueError(f"model {engine.spec.name!r} is a {engine.spec.kind} model; the rerank worker needs a cross-encoder")
        self.settings = settings
        self.kafka = settings.kafka
        self.engine = engine
        self.options = options or RerankOptions(default_collection=settings.qdrant.collection)
        self.metrics = metrics or WorkerMetrics(model=engine.spec.name)
        self.searcher = searcher
        self.queue: deque[_Item] = deque()
        self.window = BatchingWindow(self.options.batch_window_ms)
        self.offsets = OffsetTracker()
        self.paused = False
        super().__init__()
        client = self.kafka.client_kwargs()
        self.producer = KafkaProducer(**client, acks="all", linger_ms=0, retries=5)
        self.consumer = KafkaConsumer(
            **client,
            group_id=self.kafka.group_rerank,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=self.kafka.fetch_max_wait_ms,
            max_poll_records=64,
            client_id=f"embedstream-rerank-{self.options.worker_id}",
        )
        subscribe(self.consumer, [self.kafka.topic_rerank, self.kafka.topic_search], _Revocations(self))
        self.consumers = {"rerank": self.consumer}  # runtime/health helpers look consumers up here

    # -- intake ---------------------------------------------------------------------------------
    def _poll(self, timeout_ms: int) -> int:
        self._apply_backpressure()
        batches = self.consumer.poll(timeout_ms=timeout_ms)
        records = [r for recs in batches.values() for r in recs]
        received = time.perf_counter()
        for record in records:
            handle = self.offsets.track(record.topic, record.partition, record.offset)
            search = record.topic == self.kafka.topic_search
            lane = LANE_SEARCH if search else LANE_RERANK
            try:
                request = decode(record.value, SearchRequest if search else RerankRequest, self.settings.kafka.max_record_bytes)
            except DecodeError as err:
                self._dead_letter(record, err.to_error_info(), handle, lane)
                continue
            try:
                candidates = self._check(request)
            except _Rejected as err:
                self._reject(lane, request, handle, err.code, err.message)
                continue
            self.queue.append(_Item(lane, record.topic, record.partition, record.offset, handle, request,
                                    candidates, received))
        if records:
            self.window.arrived(received, len(records))
            self.metrics.queue_depth(LANE_RERANK, len(self.queue), sum(i.pairs for i in self.queue))
        return len(records)

    def _check(self, request: RerankRequest | SearchRequest) -> list[Candidate]:
        """Refuse what cannot be served; returns the candidates to score (cut when asked)."""
        if isinstance(request, SearchRequest):
            if self.searcher is None:
                raise _Rejected("search_unavailable", "this rerank worker has no searcher (vector store) configured")
            try:
                self.searcher.check(request, can_rerank=True)
            except SearchError as err:
                raise _Rejected(err.code, err.message) from None
            return []
        if request.model and request.model not in (self.engine.spec.name, str(self.engine.spec.path)):
            raise _Rejected("unknown_model",
                            f"model {request.model!r} is not served by this worker (it serves {self.engine.spec.name!r})")
        if not request.query.strip():
            raise _Rejected("empty_query", "query is empty")
        candidates = request.candidates
        if not candidates:
            raise _Rejected("no_candidates", "the request has no candidates to rerank")
        limit = self.options.max_candidates
        if len(candidates) > limit:
            if not request.cut:
                raise _Rejected("too_many_candidates",
                                f"{len(candidates)} candidates, over the limit of {limit} "
                                f"(send at most {limit}, or cut=true to keep the first {limit})")
            candidates = candidates[:limit]
        empty = [c.id for c in candidates if not c.text.strip()]
        if empty:
            raise _Rejected("empty_text", f"candidate(s) with empty text: {', '.join(empty[:10])}")
        return candidates

    def _reject(self, lane: str, request, handle, code: str, message: str, timings: dict | None = None) -> None:
        info = ErrorInfo(code=code, message=message)
        if isinstance(request, SearchRequest):
            reply: Any = SearchReply(request_id=request.request_id, error=info, timings_ms=timings or {})
        else:
            reply = RerankReply(request_id=request.request_id, error=info, model=self.engine.spec.name,
                                timings_ms=timings or {})
        self._reply(request, reply)
        OffsetTracker.done(handle)
        self.metrics.errors.labels(lane=lane, code=code).inc()

    def _dead_letter(self, record, error: ErrorInfo, handle, lane: str) -> None:
        send_dead_letter(self.producer, self.kafka.topic_dead_letters, record, error, handle,
                         self.options.worker_id, self.metrics, lane)

    def _reply(self, request, reply) -> None:
        send_reply(self.producer, request, reply)

    def _apply_backpressure(self) -> None:
        full = len(self.queue) >= self.options.max_queue_requests
        if full and not self.paused:
            self.consumer.pause(*self.consumer.assignment())
            self.paused = True
        elif not full and self.paused:
            self.consumer.resume(*self.consumer.paused())
            self.paused = False

    def _drop(self, partitions: set[tuple[str, int]]) -> None:
        self.queue = deque(i for i in self.queue if (i.topic, i.partition) not in partitions)
        self.offsets.forget(partitions)

    # -- batch formation -------------------------------------------------------------------------
    def _await_window(self) -> None:
        """Give a fresh pass up to ``batch_window_ms`` to gather more requests, while traffic is dense."""
        if self.queue:
            self.window.gather(self.queue[0].received, lambda: self._poll(1),
                               lambda: sum(i.pairs for i in self.queue) >= self.options.max_pairs_per_pass)

    def _take(self) -> list[_Item]:
        taken: list[_Item] = []
        pairs = 0
        while self.queue:
            nxt = self.queue[0].pairs
            if taken and pairs + nxt > self.options.max_pairs_per_pass:
                break
            taken.append(self.queue.popleft())
            pairs += nxt
        return taken

    # -- processing ------------------------------------------------------------------------------
    def _process(self, batch: list[_Item]) -> None:
        start = time.perf_counter()
        now = now_ms()
        live: list[_Item] = []
        for item in batch:
            wait_ms = (start - item.received) * 1000
            self.metrics.observe_stage("queue_wait", item.lane, wait_ms)
            if item.request.deadline_ms and item.request.deadline_ms < now:
                self._reject(item.lane, item.request, item.handle, "deadline_exceeded",
                             "the request's deadline passed before it was served",
                             {"queue_wait": wait_ms, "total": wait_ms})
                continue
            live.append(item)
        # Searches first retrieve (embed + Qdrant), then join the shared rerank pass.
        retrieved: dict[int, Retrieved] = {}
        for pos, item in enumerate(live):
            if isinstance(item.request, SearchRequest):
                try:
                    retrieved[pos] = self.searcher.retrieve(item.request)  # type: ignore[union-attr]
                except SearchError as err:
                    self._reject(item.lane, item.request, item.handle, err.code, err.message)
                    continue
                except Exception as exc:  # noqa: BLE001 - store/embedder failure: this request fails, loop goes on
                    log.warning("search failed", request_id=item.request.request_id, error=str(exc)[:300])
                    self._reject(item.lane, item.request, item.handle, "search_failed", str(exc)[:500])
                    continue
                t = retrieved[pos].timings_ms
                self.metrics.observe_stage("embed", item.lane, t.get("embed", 0.0))
                self.metrics.observe_stage("search", item.lane, t.get("search", 0.0))
        served = [pos for pos, item in enumerate(live)
                  if isinstance(item.request, RerankRequest) or pos in retrieved]
        pairs: list[ScoreRequest] = []
        for pos in served:
            item = live[pos]
            if isinstance(item.request, RerankRequest):
                pairs += [ScoreRequest((pos, i), item.request.query, c.text) for i, c in enumerate(item.candidates)]
            elif item.request.rerank:
                pairs += Searcher.score_requests(item.request, retrieved[pos], key=pos)
        results: dict[int, dict[int, ScoreResult]] = {pos: {} for pos in served}
        timings = StageTimings()
        rerank_ms = 0.0
        if pairs:
            pass_start = time.perf_counter()
            try:
                scored, timings = self.engine.score(pairs)
            except Exception as exc:  # noqa: BLE001 - a failed pass fails its requests, not the worker
                code, message = (exc.code, exc.message) if isinstance(exc, EngineError) else ("internal_error", str(exc)[:500])
                log.error("rerank pass failed", error=message, requests=len(served), pairs=len(pairs))
                for pos in served:
                    self._reject(live[pos].lane, live[pos].request, live[pos].handle, code, message)
                return
            rerank_ms = (time.perf_counter() - pass_start) * 1000
            for result in scored:
                pos, i = result.id
                results[pos][i] = result
            lanes = {live[pos].lane for pos in served}
            for lane in lanes:
                self.metrics.observe_stage("tokenize", lane, timings.tokenize_ms)
                self.metrics.observe_stage("rerank", lane, timings.forward_ms)
            self.metrics.tokens.labels(lane=LANE_RERANK).inc(timings.tokens)
            self.metrics.batch_size.labels(lane=LANE_RERANK).observe(len(pairs))
            self.metrics.batch_tokens.labels(lane=LANE_RERANK).observe(timings.tokens)
            self.metrics.padding.labels(lane=LANE_RERANK).set(0.0)
            for pos in served:
                self.metrics.texts.labels(lane=live[pos].lane, kind="pair").inc(len(results[pos]))
        for pos in served:
            item = live[pos]
            reply_start = time.perf_counter()
            if isinstance(item.request, RerankRequest):
                self._answer_rerank(item, results[pos], start, timings, rerank_ms)
            else:
                self._answer_search(item, retrieved[pos], results[pos] if item.request.rerank else None, start,
                                    rerank_ms)
            OffsetTracker.done(item.handle)
            self.metrics.observe_stage("reply", item.lane, (time.perf_counter() - reply_start) * 1000)

    def _answer_rerank(self, item: _Item, results: dict[int, ScoreResult], start: float, timings: StageTimings,
                       rerank_ms: float) -> None:
        request: RerankRequest = item.request  # type: ignore[assignment]
        total = (time.perf_counter() - item.received) * 1000
        times = {"queue_wait": (start - item.received) * 1000, "tokenize": timings.tokenize_ms,
                 "rerank": timings.forward_ms, "total": total}
        failed = [(item.candidates[i].id, r.error) for i, r in sorted(results.items()) if r.error is not None]
        if failed:  # e.g. a query so long that no passage fits: the ranking would be partial
            code = failed[0][1].code
            message = "; ".join(f"{cid}: {err.message}" for cid, err in failed[:5])
            self._reject(item.lane, request, item.handle, code, message, times)
            return
        order = sorted(results.items(), key=lambda kv: (-kv[1].score, kv[0]))
        ranked = [RankedResult(id=item.candidates[i].id, score=r.score, rank=rank, truncated=r.truncated)
                  for rank, (i, r) in enumerate(order[: request.top_n], 1)]
        self._reply(request, RerankReply(request_id=request.request_id, results=ranked, timings_ms=times,
                                         model=self.engine.spec.name))

    def _answer_search(self, item: _Item, retrieved: Retrieved, results: dict[int, ScoreResult] | None,
                       start: float, rerank_ms: float) -> None:
        request: SearchRequest = item.request  # type: ignore[assignment]
        times = {"queue_wait": (start - item.received) * 1000, **retrieved.timings_ms,
                 "rerank": rerank_ms if results is not None else 0.0}
        times["total"] = (time.perf_counter() - item.received) * 1000
        reply = Searcher.assemble(request, retrieved, results, times, self.engine.spec.name)
        self._reply(request, reply)

    def _commit(self, wait: bool = True) -> None:
        commit_finished(self.consumer, self.producer, self.offsets, wait=wait, lane="rerank")

    def run_once(self) -> int:
        """Poll, form one pass, score it, reply, commit. Returns requests processed."""
        self._poll(0 if self.queue else 20)
        self._await_window()
        batch = self._take()
        if batch:
            self._process(batch)
        self._commit()
        self.metrics.lag(LANE_RERANK, self.consumer)
        return len(batch)

    def started_fields(self) -> dict:
        return {"model": self.engine.spec.name, "path": self.engine.runner.describe(),
                "search": self.searcher is not None, "max_candidates": self.options.max_candidates,
                "max_batch_tokens": self.engine.limits.max_batch_tokens}

    def close(self) -> None:
        try:
            self._commit()
        except Exception as exc:  # noqa: BLE001 - closing: report and carry on
            log.warning("final commit failed", error=str(exc))
        self.consumer.close(autocommit=False)
        self.producer.close()


def build_rerank_worker(settings: Settings, model: str, embed_model: str | None = None, store=None,
                        options: RerankOptions | None = None, engine: Engine | None = None,
                        search: bool = True, remote_embed: bool = False) -> RerankWorker:
    """Cross-encoder engine + (optionally) a Searcher over the configured store and query embedder.

    ``remote_embed``: query vectors come from the embed workers over Kafka instead of an in-process
    embedder (the stages run apart).
    """
    engine = engine or Engine.from_name(model, settings)
    searcher = None
    if search:
        from embedstream.workers.runtime import open_settings_store

        store = store if store is not None else open_settings_store(settings)
        if remote_embed:
            from embedstream.producers.query_client import QueryClient
            from embedstream.workers.search import kafka_embedder

            embedder: Any = kafka_embedder(QueryClient(settings.kafka), embed_model)
        else:
            embedder = Engine.from_name(embed_model or settings.default_model, settings)
        searcher = Searcher(store, embedder, engine, settings.qdrant.collection)
    options = options or RerankOptions(default_collection=settings.qdrant.collection,
                                       batch_window_ms=settings.kafka.online_batch_window_ms)
    return RerankWorker(settings, engine, options, WorkerMetrics(model=engine.spec.name), searcher)


def run_until_signalled(worker: RerankWorker, metrics_port: int | None, host: str = "0.0.0.0") -> None:
    """Serve /healthz /readyz /metrics and run until SIGTERM/SIGINT; close the store afterwards."""
    checks = {"broker": lambda: broker_reachable(worker.consumer)}
    if worker.searcher is not None:
        checks["qdrant"] = lambda: worker.searcher.store.list_collections() is not None
    kafka_io.run_until_signalled(worker, metrics_port, checks, "rerank worker", host)
    if worker.searcher is not None:
        worker.searcher.store.close()
