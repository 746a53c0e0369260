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
* Admission control (``workers/admission.py``), one controller per lane (rerank, search) against
  ``rerank_latency_target_ms`` (default: ``latency_target_ms``): the batching window follows the
  observed p95, a request whose deadline is gone, or that cannot finish by it given the pairs queued
  ahead of it and the predicted pass time (pairs -> ms, fitted on the passes seen), is answered
  ``deadline_exceeded`` at once, before any compute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from embedstream import logs
from embedstream.config import Settings, WorkerSettings
from embedstream.engine.engine import Engine, ScoreRequest, ScoreResult, StageTimings
from embedstream.engine.errors import EngineError
from embedstream.schemas import ErrorInfo
from embedstream.schemas.codec import DecodeError, decode
from embedstream.schemas.events import now_ms
from embedstream.schemas.rerank import Candidate, RankedResult, RerankReply, RerankRequest, SearchReply, SearchRequest
from embedstream.workers.admission import SHED_MESSAGES, AdmissionConfig, LaneController
from embedstream.workers.batching_window import BatchingWindow
from embedstream.workers.lane import Taken
from embedstream.workers.loop import WorkerLoop, new_worker_id
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.search import Retrieved, Searcher, SearchError
from embedstream.workers.serve import run_until_signalled
from embedstream.workers.trust import TrustError, TrustPolicy, admit

__all__ = ["RerankOptions", "RerankWorker", "build_rerank_worker", "run_until_signalled"]

log = logs.get("embedstream.rerank")

LANE_RERANK = "rerank"
LANE_SEARCH = "search"


class RerankOptions(WorkerSettings):
    """The worker knobs (``EMBEDSTREAM_WORKER__*``: max_candidates, max_pairs_per_pass, batch_window_ms,
    max_queue_requests, ...) plus the collection searched when a request names none."""

    default_collection: str = "docs"
    worker_id: str = Field(default_factory=lambda: new_worker_id("rerank"))

    @classmethod
    def from_settings(cls, settings: Settings, **overrides) -> "RerankOptions":
        return cls(**{**settings.worker.model_dump(), "default_collection": settings.qdrant.collection, **overrides})


@dataclass
class _Item(Taken):
    request: RerankRequest | SearchRequest | None = None
    candidates: list[Candidate] = field(default_factory=list)
    received: float = field(default_factory=time.perf_counter)
    deadline_ms: int = 0  # effective deadline (epoch ms): the request's, defaulted and capped
    predicted_finish_ms: float = 0.0  # when admission expected it answered (its error calibrates later ones)

    @property
    def searches(self) -> int:
        return 1 if isinstance(self.request, SearchRequest) else 0

    @property
    def pairs(self) -> int:
        if isinstance(self.request, SearchRequest):
            return self.request.top_k if self.request.rerank else 0
        return len(self.candidates)

    tokens = pairs  # what the lane's queue counts


class _Rejected(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class RerankWorker(WorkerLoop):
    """Serves RerankRequests (and SearchRequests when a Searcher is given) with one cross-encoder."""

    name = "rerank worker"

    def __init__(self, settings: Settings, engine: Engine, options: RerankOptions | None = None,
                 metrics: WorkerMetrics | None = None, searcher: Searcher | None = None, owns_store: bool = False):
        if engine.spec.kind != "rerank":
            raise ValueError(f"model {engine.spec.name!r} is a {engine.spec.kind} model; the rerank worker needs a cross-encoder")
        self.settings = settings
        self.engine = engine
        self.options = options or RerankOptions.from_settings(settings)
        self.searcher = searcher
        self.owns_store = owns_store  # close the searcher's store with the worker (it was opened for it)
        super().__init__(settings.kafka, self.options, metrics or WorkerMetrics(model=engine.spec.name),
                         self.options.worker_id)
        target = self.options.rerank_latency_target_ms or self.options.latency_target_ms
        self.admission = {lane: LaneController(lane, AdmissionConfig.from_settings(self.options, target))
                          for lane in (LANE_RERANK, LANE_SEARCH)}
        self.window = BatchingWindow(controller=self.admission[LANE_RERANK])  # the pass is shared: one window
        self.policy = TrustPolicy.from_settings(settings)
        self.lane = self.add_lane(LANE_RERANK, [self.kafka.topic_rerank, self.kafka.topic_search], self.kafka.group_rerank,
                                  64, full=lambda queue: len(queue) >= self.options.max_queue_requests, online=True)

    # -- intake ---------------------------------------------------------------------------------
    def intake(self, timeout_ms: int) -> int:
        records = self.lane.poll(timeout_ms)
        received = time.perf_counter()
        for record in records:
            handle = self.lane.track(record)
            search = record.topic == self.kafka.topic_search
            label = LANE_SEARCH if search else LANE_RERANK
            try:
                request = decode(record.value, SearchRequest if search else RerankRequest, self.kafka.max_record_bytes)
            except DecodeError as err:
                self.lane.dead_letter(record, err.to_error_info(), handle, label)
                continue
            item = _Item(label, record, handle, request, received=received)
            try:
                admit(request, self.policy)
            except TrustError as err:  # a refused reply_to is never answered: dead letter
                if err.may_reply:
                    self._reject(item, err.code, err.message)
                else:
                    self.lane.dead_letter(record, err.to_error_info(), handle, label)
                continue
            try:
                item.candidates = self._check(request)
            except _Rejected as err:
                self._reject(item, err.code, err.message)
                continue
            if self._admit(item):
                self.lane.queue.push(item)
        if records:
            self.window.arrived(received, len(records))
            self.metrics.queue_depth(LANE_RERANK, len(self.lane.queue), self.lane.queue.tokens)
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

    def _admit(self, item: _Item) -> bool:
        """Queue it, or answer ``deadline_exceeded`` at once: deadline gone, or it cannot finish by it
        behind the pairs and searches already queued."""
        now = now_ms()
        controller = self.admission[item.lane]
        reason = controller.refuse_on_arrival(item.request.deadline_ms, now)
        if reason is None:
            item.deadline_ms = controller.deadlines.effective(item.request.deadline_ms, now)
            queue = self.lane.queue
            searches_ahead = sum(queued.searches for queued in queue)
            reason = self._late(item, now, queue.tokens, searches_ahead)
            item.predicted_finish_ms = self.admission[LANE_RERANK].predicted_finish(
                now, queue.tokens, item.pairs, self.options.max_pairs_per_pass, self._retrieve_ms(item, searches_ahead))
        if reason is None:
            return True
        self._shed(item, reason)
        return False

    def _late(self, item: _Item, now: int, pairs_ahead: int, searches_ahead: int, queued: bool = True,
              retrieval_left: bool = True) -> str | None:
        """Why ``item`` would miss its deadline behind that much work (pairs pass + searches' retrieval, unless
        it is done), or None."""
        extra_ms = self._retrieve_ms(item, searches_ahead) if retrieval_left else 0.0
        return self.admission[LANE_RERANK].late(item.deadline_ms, now, pairs_ahead, item.pairs,
                                                self.options.max_pairs_per_pass, extra_ms=extra_ms, queued=queued)

    def _retrieve_ms(self, item: _Item, searches_ahead: int) -> float:
        return self.admission[LANE_SEARCH].model.predict(1) * (searches_ahead + item.searches)

    def _shed(self, item: _Item, reason: str) -> None:
        waited = (time.perf_counter() - item.received) * 1000
        self._reject(item, "deadline_exceeded", SHED_MESSAGES[reason], {"queue_wait": waited, "total": waited})
        self.metrics.shed.labels(lane=item.lane, reason=reason).inc()

    def _reject(self, item: _Item, code: str, message: str, timings: dict | None = None) -> None:
        info = ErrorInfo(code=code, message=message)
        request = item.request
        if isinstance(request, SearchRequest):
            reply: Any = SearchReply(request_id=request.request_id, error=info, timings_ms=timings or {})
        else:
            reply = RerankReply(request_id=request.request_id, error=info, model=self.engine.spec.name,
                                timings_ms=timings or {})
        self.lane.reply(item.record, request, reply, item.handle, item.lane)
        self.metrics.errors.labels(lane=item.lane, code=code).inc()

    # -- batch formation -------------------------------------------------------------------------
    def _await_window(self) -> None:
        """Give a fresh pass up to ``batch_window_ms`` to gather more requests, while traffic is dense."""
        oldest = self.lane.queue.oldest
        if oldest is not None:
            deadline_s = self.window.controller.deadline_on_clock(oldest.deadline_ms, now_ms()) if oldest.deadline_ms else None
            self.window.gather(oldest.received, lambda: self.intake(1),
                               lambda: self.lane.queue.tokens >= self.options.max_pairs_per_pass,
                               deadline_s, lambda: self.lane.queue.tokens)

    def _take(self) -> list[_Item]:
        """A FIFO prefix of requests whose pairs fit one pass (a single larger request runs alone)."""
        queue = self.lane.queue
        taken: list[_Item] = []
        pairs = 0
        while queue and not (taken and pairs + queue.oldest.pairs > self.options.max_pairs_per_pass):
            pairs += queue.oldest.pairs
            taken += queue.take(1)
        return taken

    # -- processing ------------------------------------------------------------------------------
    def _process(self, batch: list[_Item]) -> None:
        start = time.perf_counter()
        self.metrics.queue_age.labels(lane=batch[0].lane).set(start - batch[0].received)
        for item in batch:
            self.metrics.observe_stage("queue_wait", item.lane, (start - item.received) * 1000)
        live = self._in_time(batch, retrieval_left=True)  # nothing that would miss its deadline is computed
        # Searches first retrieve (embed + Qdrant), then join the shared rerank pass.
        retrieved: dict[int, Retrieved] = {}
        for pos, item in enumerate(live):
            if isinstance(item.request, SearchRequest):
                try:
                    retrieved[pos] = self.searcher.retrieve(item.request)  # type: ignore[union-attr]
                except SearchError as err:
                    self._reject(item, err.code, err.message)
                    continue
                except Exception as exc:  # noqa: BLE001 - store/embedder failure: this request fails, loop goes on
                    log.warning("search failed", request_id=item.request.request_id, error=str(exc)[:300])
                    self._reject(item, "search_failed", str(exc)[:500])
                    continue
                t = retrieved[pos].timings_ms
                self.admission[LANE_SEARCH].observed_pass(1, t.get("embed", 0.0) + t.get("search", 0.0))
                self.metrics.observe_stage("embed", item.lane, t.get("embed", 0.0))
                self.metrics.observe_stage("search", item.lane, t.get("search", 0.0))
        ready = [pos for pos, item in enumerate(live) if isinstance(item.request, RerankRequest) or pos in retrieved]
        # Checked again just before scoring: retrieval and a busy host take time since the first check (a CI
        # run scored one request after its deadline); what has nothing left to score is answered as it is.
        still = {id(item) for item in self._in_time([live[pos] for pos in ready if live[pos].pairs], False)}
        served = [pos for pos in ready if not live[pos].pairs or id(live[pos]) in still]
        pairs: list[ScoreRequest] = []
        for pos in served:
            item = live[pos]
            if isinstance(item.request, RerankRequest):
                pairs += [ScoreRequest((pos, i), item.request.query, c.text) for i, c in enumerate(item.candidates)]
            elif item.request.rerank:
                pairs += Searcher.score_requests(item.request, retrieved[pos], key=pos)
        # The last look, at the pass's door: a thread that lost the GIL after the check above can find a deadline
        # gone (a CI run scored one request after its deadline); only the clock is read, nothing predicted.
        now = now_ms()
        gone = {pos for pos in served if live[pos].pairs and live[pos].deadline_ms and live[pos].deadline_ms <= now}
        if gone:
            for pos in gone:  # expired_in_queue, counted by the controller as every shed
                self._shed(live[pos], self._late(live[pos], now, 0, 0, queued=False, retrieval_left=False))
            served = [pos for pos in served if pos not in gone]
            pairs = [p for p in pairs if p.id[0] not in gone]
        results: dict[int, dict[int, ScoreResult]] = {pos: {} for pos in served}
        timings = StageTimings()
        rerank_ms = 0.0
        if pairs:
            rerank = self.admission[LANE_RERANK]
            predicted_ms = rerank.model.predict(len(pairs), self.options.max_pairs_per_pass)
            pass_start = time.perf_counter()
            try:
                scored, timings = self.engine.score(pairs)
            except Exception as exc:  # noqa: BLE001 - a failed pass fails its requests, not the worker
                code, message = (exc.code, exc.message) if isinstance(exc, EngineError) else ("internal_error", str(exc)[:500])
                log.error("rerank pass failed", error=message, requests=len(served), pairs=len(pairs))
                for pos in served:
                    self._reject(live[pos], code, message)
                return
            rerank_ms = (time.perf_counter() - pass_start) * 1000
            rerank.observed_pass(len(pairs), rerank_ms)
            self.metrics.observe_pass(LANE_RERANK, rerank.window_ms, predicted_ms, rerank_ms)
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
            replied = now_ms()
            self.admission[item.lane].observed_reply((time.perf_counter() - item.received) * 1000,
                                                     item.request.sent_at_ms, replied)
            self.admission[LANE_RERANK].observed_finish(item.predicted_finish_ms, replied)
            self.metrics.observe_stage("reply", item.lane, (time.perf_counter() - reply_start) * 1000)

    def _in_time(self, items: list[_Item], retrieval_left: bool) -> list[_Item]:
        """The items that can still meet their deadlines in a pass starting now, in order (the pairs, and the
        retrievals still to do, of those before each count as work ahead); the others are shed."""
        now, pairs_ahead, searches_ahead, kept = now_ms(), 0, 0, []
        for item in items:
            reason = self._late(item, now, pairs_ahead, searches_ahead, queued=False, retrieval_left=retrieval_left)
            if reason is not None:
                self._shed(item, reason)
                continue
            pairs_ahead, searches_ahead = pairs_ahead + item.pairs, searches_ahead + item.searches
            kept.append(item)
        return kept

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
            self._reject(item, code, message, times)
            return
        order = sorted(results.items(), key=lambda kv: (-kv[1].score, kv[0]))
        ranked = [RankedResult(id=item.candidates[i].id, score=r.score, rank=rank, truncated=r.truncated)
                  for rank, (i, r) in enumerate(order[: request.top_n], 1)]
        self.lane.reply(item.record, request, RerankReply(request_id=request.request_id, results=ranked,
                                                          timings_ms=times, model=self.engine.spec.name),
                        item.handle, item.lane)

    def _answer_search(self, item: _Item, retrieved: Retrieved, results: dict[int, ScoreResult] | None,
                       start: float, rerank_ms: float) -> None:
        request: SearchRequest = item.request  # type: ignore[assignment]
        times = {"queue_wait": (start - item.received) * 1000, **retrieved.timings_ms,
                 "rerank": rerank_ms if results is not None else 0.0}
        times["total"] = (time.perf_counter() - item.received) * 1000
        reply = Searcher.assemble(request, retrieved, results, times, self.engine.spec.name)
        self.lane.reply(item.record, request, reply, item.handle, item.lane)

    def run_once(self) -> int:
        """Poll, form one pass, score it, reply, commit. Returns requests processed."""
        self.intake(0 if self.lane.queue else 20)
        self._await_window()
        batch = self._take()
        if batch:
            self._process(batch)
        self.lane.commit()
        self.lane.record_lag(self.metrics)
        return len(batch)

    def started_fields(self) -> dict:
        return {"model": self.engine.spec.name, "path": self.engine.runner.describe(),
                "search": self.searcher is not None, "max_candidates": self.options.max_candidates,
                "max_batch_tokens": self.engine.limits.max_batch_tokens}

    def close_resources(self) -> None:
        if self.owns_store and self.searcher is not None:
            self.searcher.store.close()

    def readiness_checks(self) -> dict:
        checks = super().readiness_checks()
        if self.searcher is not None:
            checks["qdrant"] = lambda: self.searcher.store.list_collections() is not None
        return checks


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
    options = options or RerankOptions.from_settings(settings)
    return RerankWorker(settings, engine, options, WorkerMetrics(model=engine.spec.name), searcher,
                        owns_store=searcher is not None)
