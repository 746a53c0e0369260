"""The rerank worker's Kafka loop: rerank and search requests -> one packed cross-encoder pass -> replies.

Consumes ``topic_rerank`` (RerankRequest: candidates given) and ``topic_search`` (SearchRequest:
embed, retrieve from Qdrant, then rerank) with the ``group_rerank`` consumer group. Searches reach
``topic_search`` from the owner of their collection (``workers/vector_search.py``), which hands on those
asking for a rerank while this group has members, with their collection named.

* The pairs of every queued request (up to ``max_pairs_per_pass``) go through **one** ``Engine.score``
  call (packed, padding-free passes); scores are split back per request, sorted and cut to ``top_n``.
* Undecodable records are dead-lettered; requests that cannot be served get an error reply.
  Offsets are committed only after the reply (or dead letter) of every earlier record.
* Who waits or is refused is the ``TurnPolicy``'s (``workers/policy.py``) over the rerank lane's
  estimators; the search lane's estimate a retrieval's time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from embedstream import logs
from embedstream.config import Settings, WorkerSettings
from embedstream.engine.batcher import BatchLimits, take_prefix
from embedstream.engine.engine import Engine, ScoreRequest, ScoreResult, StageTimings
from embedstream.engine.errors import EngineError
from embedstream.errors import CodedError
from embedstream.schemas import ErrorInfo
from embedstream.schemas.codec import DecodeError, decode
from embedstream.schemas.events import now_ms
from embedstream.schemas.rerank import Candidate, RankedResult, RerankReply, RerankRequest, SearchReply, SearchRequest
from embedstream.workers.admission import SHED_MESSAGES, AdmissionConfig, LaneController
from embedstream.workers.transport.lane import Taken
from embedstream.workers.loop import WorkerLoop, new_worker_id
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.policy import TurnPolicy
from embedstream.workers.rerank_checks import servable
from embedstream.workers.search import Retrieved, Searcher, SearchError
from embedstream.workers.trust import TrustError, TrustPolicy, check_trust

__all__ = ["RerankOptions", "RerankWorker"]

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


class RerankWorker(WorkerLoop):
    """Serves RerankRequests (and SearchRequests when a Searcher is given) with one cross-encoder."""

    name = "rerank worker"

    def __init__(self, settings: Settings, engine: Engine, options: RerankOptions | None = None,
                 metrics: WorkerMetrics | None = None, searcher: Searcher | None = None,
                 owned: tuple[Callable[[], None], ...] = ()):
        if engine.spec.kind != "rerank":
            raise ValueError(f"model {engine.spec.name!r} is a {engine.spec.kind} model; the rerank worker needs a cross-encoder")
        self.settings = settings
        self.engine = engine
        self.options = options or RerankOptions.from_settings(settings)
        self.searcher = searcher
        self.owned = owned  # closes what was opened for this worker (its store, its query client), at its end
        super().__init__(settings.kafka, self.options, metrics or WorkerMetrics(model=engine.spec.name),
                         self.options.worker_id)
        target = self.options.rerank_latency_target_ms or self.options.latency_target_ms
        self.admission = {lane: LaneController(lane, AdmissionConfig.from_settings(self.options, target))
                          for lane in (LANE_RERANK, LANE_SEARCH)}
        self.turns = TurnPolicy(self.admission[LANE_RERANK])  # one pass for both lanes: one policy
        self.trust = TrustPolicy.from_settings(settings)
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
                check_trust(request, self.trust)
                item.candidates = servable(request, self.engine.spec, self.searcher, self.options.max_candidates)
            except CodedError as err:  # a refused reply_to is never answered: dead letter
                if isinstance(err, TrustError) and not err.may_reply:
                    self.lane.dead_letter(record, err.to_error_info(), handle, label)
                else:
                    self._reject(item, err.code, err.message)
                continue
            if self._on_arrival(item):
                self.lane.queue.push(item)
        if records:
            self.turns.arrived(received, len(records))
            self.metrics.queue_depth(LANE_RERANK, len(self.lane.queue), self.lane.queue.tokens)
        return len(records)

    def _on_arrival(self, item: _Item) -> bool:
        """Queue it (True), or answer ``deadline_exceeded`` at once: the policy sheds it behind the pairs and
        searches already queued."""
        queue = self.lane.queue
        searches_ahead = sum(queued.searches for queued in queue)
        arrival = self.turns.on_arrival(item.request.deadline_ms, now_ms(), queue.tokens, item.pairs,
                                        self.options.max_pairs_per_pass, self._retrieve_ms(item, searches_ahead),
                                        lane=self.admission[item.lane])
        if arrival.shed is not None:
            self._shed(item, arrival.shed)
            return False
        item.deadline_ms, item.predicted_finish_ms = arrival.deadline_ms, arrival.predicted_finish_ms
        return True

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
    def _next_pass(self) -> list[_Item]:
        """After the policy's window: a FIFO prefix of requests whose pairs fit one pass (a larger one alone)."""
        queue, most = self.lane.queue, self.options.max_pairs_per_pass
        self.turns.gather(queue.oldest, now_ms(), lambda: self.intake(1), lambda: queue.tokens >= most,
                          lambda: queue.tokens)
        return queue.take(take_prefix(queue.lengths(), BatchLimits(most, 1 << 30)) or 1) if queue else []

    def _process(self, batch: list[_Item]) -> None:
        start = time.perf_counter()
        self.metrics.queue_age.labels(lane=batch[0].lane).set(start - batch[0].received)
        for item in batch:
            self.metrics.observe_stage("queue_wait", item.lane, (start - item.received) * 1000)
        live = self._in_time(batch, retrieval_left=True)  # nothing that would miss its deadline is retrieved
        retrieved = self._retrieve(live)
        ready = [pos for pos, item in enumerate(live) if isinstance(item.request, RerankRequest) or pos in retrieved]
        pairs: list[ScoreRequest] = []
        for pos in ready:
            item = live[pos]
            if isinstance(item.request, RerankRequest):
                pairs += [ScoreRequest((pos, i), item.request.query, c.text, item.request.max_tokens_per_doc)
                          for i, c in enumerate(item.candidates)]
            elif item.request.rerank:
                pairs += Searcher.score_requests(item.request, retrieved[pos], key=pos)
        # At the pass's door, the last look (retrieval and a busy host take time): what would miss its deadline is
        # not scored; what has nothing left to score is answered as it is.
        scoring = {id(item) for item in self._in_time([live[pos] for pos in ready if live[pos].pairs], False)}
        served = [pos for pos in ready if not live[pos].pairs or id(live[pos]) in scoring]
        pairs = [p for p in pairs if id(live[p.id[0]]) in scoring]
        results: dict[int, dict[int, ScoreResult]] = {pos: {} for pos in served}
        timings = StageTimings()
        rerank_ms = 0.0
        if pairs:
            try:
                rerank_ms, timings = self._score(pairs, results)
            except Exception as exc:  # noqa: BLE001 - a failed pass fails its requests, not the worker
                code, message = (exc.code, exc.message) if isinstance(exc, EngineError) else ("internal_error", str(exc)[:500])
                log.error("rerank pass failed", error=message, requests=len(served), pairs=len(pairs))
                for pos in served:
                    self._reject(live[pos], code, message)
                return
            for lane in {live[pos].lane for pos in served}:
                self.metrics.observe_stage("tokenize", lane, timings.tokenize_ms)
                self.metrics.observe_stage("rerank", lane, timings.forward_ms)
            for pos in served:
                self.metrics.texts.labels(lane=live[pos].lane, kind="pair").inc(len(results[pos]))
        for pos in served:
            item = live[pos]
            reply_start = time.perf_counter()
            if isinstance(item.request, RerankRequest):
                self._answer_rerank(item, results[pos], start, timings)
            else:
                self._answer_search(item, retrieved[pos], results[pos] if item.request.rerank else None, start,
                                    rerank_ms)
            self.turns.replied(item.predicted_finish_ms, (time.perf_counter() - item.received) * 1000,
                               item.request.sent_at_ms, now_ms(), lane=self.admission[item.lane])
            self.metrics.observe_stage("reply", item.lane, (time.perf_counter() - reply_start) * 1000)

    def _retrieve(self, live: list[_Item]) -> dict[int, Retrieved]:
        """The searches' candidates (embed + Qdrant), by position; a search that fails is answered with why."""
        retrieved: dict[int, Retrieved] = {}
        for pos, item in enumerate(live):
            if not isinstance(item.request, SearchRequest):
                continue
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
        return retrieved

    def _score(self, pairs: list[ScoreRequest], results: dict[int, dict[int, ScoreResult]]) -> tuple[float, StageTimings]:
        """One cross-encoder pass over every pair; the scores land in ``results`` by request position."""
        predicted_ms = self.admission[LANE_RERANK].model.predict(len(pairs), self.options.max_pairs_per_pass)
        pass_start = time.perf_counter()
        with self.turns.running_pass(LANE_RERANK, predicted_ms):
            scored, timings = self.engine.score(pairs)
        rerank_ms = (time.perf_counter() - pass_start) * 1000
        self.turns.observed_pass(len(pairs), rerank_ms)
        self.metrics.observe_pass(LANE_RERANK, self.admission[LANE_RERANK].window_ms, predicted_ms, rerank_ms)
        for result in scored:
            pos, i = result.id
            results[pos][i] = result
        self.metrics.tokens.labels(lane=LANE_RERANK).inc(timings.tokens)
        self.metrics.batch_size.labels(lane=LANE_RERANK).observe(len(pairs))
        self.metrics.batch_tokens.labels(lane=LANE_RERANK).observe(timings.tokens)
        self.metrics.padding.labels(lane=LANE_RERANK).set(0.0)
        return rerank_ms, timings

    def _in_time(self, items: list[_Item], retrieval_left: bool) -> list[_Item]:
        """The items that can still meet their deadlines in a pass starting now, in order (the pairs, and the
        retrievals still to do, of those before each count as work ahead); the policy sheds the others."""
        now, pairs_ahead, searches_ahead, kept = now_ms(), 0, 0, []
        for item in items:
            extra_ms = self._retrieve_ms(item, searches_ahead) if retrieval_left else 0.0
            reason = self.turns.at_turn(item.deadline_ms, now, pairs_ahead, item.pairs, self.options.max_pairs_per_pass,
                                        extra_ms)
            if reason is not None:
                self._shed(item, reason)
                continue
            pairs_ahead, searches_ahead = pairs_ahead + item.pairs, searches_ahead + item.searches
            kept.append(item)
        return kept

    def _answer_rerank(self, item: _Item, results: dict[int, ScoreResult], start: float, timings: StageTimings) -> None:
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
        batch = self._next_pass()
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
        for close in self.owned:
            close()

    def readiness_checks(self) -> dict:
        checks = super().readiness_checks()
        if self.searcher is not None:
            checks["qdrant"] = lambda: self.searcher.store.list_collections() is not None
        return checks
