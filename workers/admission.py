"""Admission control's estimators for an online lane: compute, latency, deadlines, the window's length.

Transport-free (no Kafka types), driven by an injected clock, unit-tested with a synthetic compute-time
model. Per online lane (embed: queries and online chunks; rerank; search) one ``LaneController``:

* **predicts a pass's compute** (``ComputeModel``: ms = a + b * tokens, exponentially weighted least
  squares over recent passes, so it follows a host whose speed drifts);
* **sizes the batching window** (how long the oldest queued request may wait for company): never
  beyond its remaining deadline budget minus the predicted compute, only while company is likely;
  policy ``aimd`` steers it by the observed p95, ``deadline`` by the target budget (Clipper), ``fixed``
  is a constant ``batch_window_ms``;
* **judges lateness** (``late``): a deadline already past, or one the request cannot meet given the
  work ahead of it and the predicted compute (``Deadlines``, ``FinishErrors``' learnt margin);
* says when online traffic **is at risk** (p95 near the target) and how large a bulk pass still fits.

Which request runs, waits or is refused, using these, is decided in ``workers/policy.py``; why some
refusals still come at a request's turn (the alternatives measured) is in docs/components/admission.md.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

POLICIES = ("aimd", "deadline", "fixed")

# Shed reasons (metric label ``reason``).
DEADLINE_PAST = "deadline_past"  # the request arrived with its deadline already gone
EXPIRED_IN_QUEUE = "expired_in_queue"  # the deadline passed while it queued
PREDICTED_LATE = "predicted_late"  # it cannot finish in time given the work ahead and the predicted compute
LATE_AT_PASS = "late_at_pass"  # admitted, but at its turn its own pass's predicted compute ends after the deadline
#: Refused on arrival (answered at once) vs refused later, after queueing (``bench latency`` reports them apart).
ON_ARRIVAL = (DEADLINE_PAST, PREDICTED_LATE)
SHED_MESSAGES = {
    DEADLINE_PAST: "the request's deadline had passed when it arrived",
    EXPIRED_IN_QUEUE: "the request's deadline passed before it was served",
    PREDICTED_LATE: "the request cannot be served by its deadline (work queued ahead of it and the predicted compute)",
    LATE_AT_PASS: "the request could not be served by its deadline once its turn came (its pass's predicted compute)",
}


@dataclass(frozen=True)
class AdmissionConfig:
    """The knobs of one lane's controller (from ``WorkerSettings``; see config.py for their meaning)."""

    target_ms: float = 30.0
    policy: str = "aimd"
    fixed_window_ms: float = 2.0
    max_window_ms: float = 10.0
    default_deadline_ms: float = 5000.0
    max_request_age_ms: float = 60000.0
    reply_allowance_ms: float = 4.0
    shed_predicted: bool = True

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"admission policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("target_ms", "fixed_window_ms", "max_window_ms", "default_deadline_ms", "max_request_age_ms",
                     "reply_allowance_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 ms, got {getattr(self, name)}")
        if self.target_ms <= 0:
            raise ValueError(f"target_ms must be > 0 ms, got {self.target_ms}")

    @classmethod
    def from_settings(cls, worker, target_ms: float | None = None) -> "AdmissionConfig":
        """From ``WorkerSettings`` (or anything with its attribute names); ``target_ms`` overrides the lane's target."""
        return cls(target_ms=target_ms if target_ms is not None else worker.latency_target_ms,
                   policy=worker.admission_policy, fixed_window_ms=worker.batch_window_ms,
                   max_window_ms=worker.max_window_ms, default_deadline_ms=worker.default_deadline_ms,
                   max_request_age_ms=worker.max_request_age_ms, reply_allowance_ms=worker.reply_allowance_ms,
                   shed_predicted=worker.shed_predicted)


class ComputeModel:
    """ms = a + b * tokens, fitted by exponentially weighted least squares over recent passes.

    Until two different token counts are seen the fit is proportional (a = 0, b = mean ms / mean
    tokens), which over-predicts larger passes rather than under-predicting them. Before any pass it
    predicts 0 ms: nothing is shed on a guess."""

    def __init__(self, decay: float = 0.97):
        self.decay = decay
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self.passes = 0
        self._lock = threading.Lock()  # the model stage observes while intake predicts

    def observe(self, tokens: int, ms: float) -> None:
        if tokens <= 0 or ms < 0 or math.isnan(ms):
            return
        d = self.decay
        with self._lock:
            self._w = d * self._w + 1.0
            self._x = d * self._x + tokens
            self._y = d * self._y + ms
            self._xx = d * self._xx + tokens * tokens
            self._xy = d * self._xy + tokens * ms
            self.passes += 1

    def coefficients(self) -> tuple[float, float]:
        """(a ms, b ms per token); (0, 0) before any pass."""
        with self._lock:
            w, x, y, xx, xy = self._w, self._x, self._y, self._xx, self._xy
        if w == 0:
            return 0.0, 0.0
        mean_x, mean_y = x / w, y / w
        var = xx / w - mean_x * mean_x
        if var > 1e-6 * max(1.0, mean_x * mean_x):
            b = (xy / w - mean_x * mean_y) / var
            a = mean_y - b * mean_x
            if b >= 0 and a >= 0:
                return a, b
            if b < 0:  # noise made larger passes look cheaper: flat cost
                return mean_y, 0.0
            return 0.0, xy / xx  # negative intercept: proportional fit through the origin
        return 0.0, mean_y / mean_x if mean_x else 0.0

    def predict(self, tokens: int, max_pass_tokens: int | None = None) -> float:
        """Predicted ms for ``tokens`` of work, split into passes of at most ``max_pass_tokens``."""
        if tokens <= 0:
            return 0.0
        a, b = self.coefficients()
        passes = 1 if not max_pass_tokens else max(1, math.ceil(tokens / max_pass_tokens))
        return passes * a + b * tokens

    def marginal_tokens_within(self, ms: float) -> int:
        """The most tokens that may be added to a pass for at most ``ms`` more (the slope alone: the pass's
        fixed cost is paid anyway); unbounded where extra tokens cost nothing measurable."""
        _, b = self.coefficients()
        return 1 << 30 if b <= 0 else max(0, int(ms / b))

    def tokens_within(self, ms: float) -> int:
        """The most tokens one pass may hold to finish within ``ms`` (0 when even an empty pass would not)."""
        a, b = self.coefficients()
        if b <= 0:
            return 0 if ms < a else 1 << 30
        return max(0, int((ms - a) / b))


class LatencyTracker:
    """Recent per-request latencies (ms) of a lane; p95 over the last ``horizon_s`` seconds."""

    def __init__(self, horizon_s: float = 3.0, max_samples: int = 512, clock: Callable[[], float] = time.monotonic):
        self.horizon_s = horizon_s
        self.clock = clock
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)
        self._lock = threading.Lock()  # replies are observed on one thread, the p95 read on others

    def observe(self, ms: float) -> None:
        with self._lock:
            self._samples.append((self.clock(), ms))

    def quantile(self, q: float) -> float | None:
        """The q-quantile of recent samples, or None when there are fewer than 5."""
        horizon = self.clock() - self.horizon_s
        with self._lock:
            while self._samples and self._samples[0][0] < horizon:
                self._samples.popleft()
            if len(self._samples) < 5:
                return None
            values = sorted(ms for _, ms in self._samples)
        return values[min(len(values) - 1, int(q * len(values)))]

    def p95(self) -> float | None:
        return self.quantile(0.95)


class FinishErrors:
    """How much later than predicted admitted requests actually finished (ms), recently: the margin a
    prediction needs. The compute model sees passes alone; a request also waits for the pass already
    running, for GIL turns with intake and output, for a cold core after idling (a lone query's pass:
    4.1 ms back to back, 6.4 ms after 50 ms idle, here). ``margin()`` is the median of the recent
    errors (the 80th percentile shed 10-25% of the queries at low load that would have made it), never
    below 0 nor above ``cap_ms``."""

    def __init__(self, cap_ms: float, quantile: float = 0.5, horizon_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.cap_ms = cap_ms
        self.quantile = quantile
        self._recent = LatencyTracker(horizon_s=horizon_s, max_samples=256, clock=clock)

    def observe(self, predicted_finish_ms: float, finished_ms: float) -> None:
        self._recent.observe(finished_ms - predicted_finish_ms)

    def margin(self) -> float:
        error = self._recent.quantile(self.quantile)
        return 0.0 if error is None else min(self.cap_ms, max(0.0, error))


class Deadlines:
    """A request's effective deadline (epoch ms): missing → the default, years ahead → capped."""

    def __init__(self, config: AdmissionConfig):
        self.config = config

    def effective(self, deadline_ms: int | None, now_ms: int) -> int:
        if deadline_ms is None or deadline_ms <= 0:
            return now_ms + int(self.config.default_deadline_ms)
        return min(int(deadline_ms), now_ms + int(self.config.max_request_age_ms))


class LaneController:
    """One online lane's admission control: window, prediction, shedding, risk (see the module doc).

    Times: ``clock`` is monotonic seconds (the worker passes ``time.perf_counter``); deadlines are
    epoch ms as on the wire and are converted by the caller's ``now_ms``."""

    INCREASE_MS = 0.5  # AIMD additive step per batch with slack
    OWN_PASSES_NEEDED = 8  # the lane's own passes seen before they predict its requests' passes at their turn
    DECREASE = 0.5  # AIMD multiplicative cut when the p95 nears the target
    NEAR = 0.8  # p95 >= NEAR * target: near the target (shrink the window, bulk yields)
    SLACK = 0.5  # p95 < SLACK * target: slack (grow the window, bulk back to full slices)
    CUT_EVERY_S = 0.1  # at most one multiplicative cut per this long (the p95 lags the change)

    def __init__(self, lane: str, config: AdmissionConfig, clock: Callable[[], float] = time.perf_counter):
        self.lane = lane
        self.config = config
        self.clock = clock
        self.model = ComputeModel()
        # Passes of this lane's own requests only: what a request's pass costs at its turn. The shared model
        # is fitted mostly on 512-token bulk passes under a backlog, and its intercept read a query's pass
        # far above the 5-9 ms it took: most refusals at the turn (late_at_pass) were such misreadings.
        self.own_passes = ComputeModel()
        self.latency = LatencyTracker(clock=clock)
        self.deadlines = Deadlines(config)
        self.errors = FinishErrors(cap_ms=config.target_ms / 2, clock=clock)
        self.window_ms = config.fixed_window_ms if config.policy == "fixed" else 0.0
        self.shed: Counter[str] = Counter()
        self._last_arrival: float | None = None
        self._last_gap_s: float | None = None
        self._gap_s: float | None = None  # EWMA of the gap between arrivals
        self._burst = False
        self._last_cut = -math.inf

    # -- arrivals and the window -----------------------------------------------------------------
    def arrived(self, when: float, count: int) -> None:
        """A poll brought ``count`` requests at ``when`` (clock seconds)."""
        if count <= 0:
            return
        if self._last_arrival is not None:
            self._last_gap_s = max(0.0, when - self._last_arrival)
            gap = self._last_gap_s / count
            self._gap_s = gap if self._gap_s is None else 0.7 * self._gap_s + 0.3 * gap
        self._burst = count > 1
        self._last_arrival = when

    def company_likely(self, window_ms: float) -> bool:
        """Another request is likely within ``window_ms``: a burst in one poll, or arrivals that close together
        (policy ``fixed``: the last gap, as before; the controllers: the smoothed gap)."""
        if window_ms <= 0:
            return False
        gap = self._last_gap_s if self.config.policy == "fixed" else self._gap_s
        return self._burst or (gap is not None and gap * 1000 <= window_ms)

    def wait_until(self, oldest_received: float, oldest_deadline_s: float | None = None, queued_tokens: int = 0) -> float:
        """Until when (clock seconds) a batch whose oldest request arrived at ``oldest_received`` may gather.

        ``oldest_deadline_s``: that request's deadline on the same clock; the wait never goes past it
        minus the predicted compute of the queued work and the reply allowance."""
        window_ms = self._window_for(oldest_received, queued_tokens)
        if not self.company_likely(window_ms):
            return oldest_received
        until = oldest_received + window_ms / 1000
        if oldest_deadline_s is not None:
            budget_end = oldest_deadline_s - (self.model.predict(max(queued_tokens, 1)) + self.config.reply_allowance_ms) / 1000
            until = min(until, budget_end)
        return max(oldest_received, until)

    def _window_for(self, oldest_received: float, queued_tokens: int) -> float:
        if self.config.policy != "deadline":
            return self.window_ms
        # Deadline-driven: wait while the oldest still finishes inside the target (Clipper's 0.92 margin).
        spare = 0.92 * self.config.target_ms - self.model.predict(max(queued_tokens, 1)) - self.config.reply_allowance_ms
        return max(0.0, min(self.config.max_window_ms, spare))

    def deadline_on_clock(self, deadline_ms: int, now_ms: int) -> float:
        """An epoch-ms deadline as a time on this controller's clock."""
        return self.clock() + (deadline_ms - now_ms) / 1000

    def gather(self, oldest_received: float, poll: Callable[[], int], full: Callable[[], bool],
               oldest_deadline_s: float | None = None, queued_tokens: Callable[[], int] = lambda: 0) -> None:
        """Poll for more requests until the wait ends or the batch is full.

        ``poll`` fetches briefly and returns how many records it queued; ``full`` says whether the
        queue already fills one pass."""
        until = self.wait_until(oldest_received, oldest_deadline_s, queued_tokens())
        while self.clock() < until and not full():
            if not poll():
                remaining = until - self.clock()
                if remaining > 0:
                    time.sleep(min(remaining, 0.0005))

    # -- observations ----------------------------------------------------------------------------
    def observed_pass(self, tokens: int, compute_ms: float, own: bool = True) -> None:
        """A forward pass of ``tokens`` took ``compute_ms``: refit the prediction, move the window.

        ``own``: a pass of this lane's requests (False: another lane's, e.g. bulk, sharing the engine)."""
        self.model.observe(tokens, compute_ms)
        if own:
            self.own_passes.observe(tokens, compute_ms)
        self._adjust()

    def observed_latency(self, ms: float) -> None:
        """A request of this lane was answered ``ms`` after it arrived."""
        self.latency.observe(ms)

    def observed_reply(self, in_worker_ms: float, sent_at_ms: int | None, now_ms: int) -> None:
        """A reply went out: the latency its caller sees, as far as the worker can tell: since the client sent
        it (``sent_at_ms``, when present and plausible: the clocks agree on one host or under NTP), else
        since it arrived here. The caller's wait includes the trip in, which on this 2-vCPU host under
        load was 10-25 ms of a 30 ms target: steering by the in-worker time alone read slack there."""
        age = None if not sent_at_ms else now_ms - sent_at_ms
        plausible = age is not None and in_worker_ms <= age <= self.config.max_request_age_ms
        self.latency.observe(float(age) if plausible else in_worker_ms)

    def _adjust(self) -> None:
        if self.config.policy != "aimd":
            return
        p95 = self.latency.p95()
        if p95 is None:
            return
        now = self.clock()
        if p95 >= self.NEAR * self.config.target_ms:
            if now - self._last_cut >= self.CUT_EVERY_S:
                self.window_ms = 0.0 if self.window_ms < 0.5 else self.window_ms * self.DECREASE
                self._last_cut = now
        elif p95 < self.SLACK * self.config.target_ms:
            self.window_ms = min(self.config.max_window_ms, self.window_ms + self.INCREASE_MS)

    # -- shedding --------------------------------------------------------------------------------
    def refuse_on_arrival(self, deadline_ms: int | None, now_ms: int) -> str | None:
        """The reason to refuse a request at once on arrival (its deadline already passed), else None."""
        if deadline_ms is not None and 0 < deadline_ms <= now_ms:
            self._count_shed(DEADLINE_PAST)
            return DEADLINE_PAST
        return None

    def _count_shed(self, reason: str) -> None:
        """A shed request is a miss for the lane's p95 too: otherwise a lane that sheds everything would
        look calm (no latencies) and bulk would never yield to it."""
        self.shed[reason] += 1
        self.latency.observe(2 * self.config.target_ms)

    @property
    def predicts_sheds(self) -> bool:
        """Whether requests are refused on a prediction (not with policy ``fixed``, nor before any pass)."""
        return self.config.shed_predicted and self.config.policy != "fixed" and self.model.passes > 0

    def late(self, deadline_ms: int, now_ms: int, tokens_ahead: int, tokens: int, max_pass_tokens: int | None = None,
             extra_ms: float = 0.0, queued: bool = True, running_ms: float = 0.0) -> str | None:
        """Why a queued request would miss ``deadline_ms`` (effective, epoch ms), or None if it can make it.

        ``tokens_ahead``: the work queued (or running) before it; its own pass is predicted with it.
        ``extra_ms``: predicted time outside this model's passes (e.g. a search's retrieval).
        ``running_ms``: what is left of the pass running now (the request waits for it, or for one
        step of it where the pass yields).
        ``queued``: the request still has to queue (on arrival): the learnt finish-error margin applies;
        False just before its own pass, where only that pass's compute is left to predict (adding the
        margin there too shed 30% of the queries at 25 QPS under a backlog, most of which would have
        made it)."""
        if deadline_ms <= now_ms:
            self._count_shed(EXPIRED_IN_QUEUE)
            return EXPIRED_IN_QUEUE
        if not self.predicts_sheds:
            return None
        model = self.model if queued or self.own_passes.passes < self.OWN_PASSES_NEEDED else self.own_passes
        finish = self.predicted_finish(now_ms, tokens_ahead, tokens, max_pass_tokens, extra_ms + running_ms, model)
        # The margin guards the requests queued behind this one; one with nothing ahead of it delays
        # nobody, so it is judged on its own compute (with the margin on every arrival, 2x overload shed
        # 99.8% here: a loaded intake made every trip in look too slow for the margin).
        margin = self.errors.margin() if queued and (tokens_ahead > 0 or running_ms > 0) else 0.0
        if finish + margin + self.config.reply_allowance_ms > deadline_ms:
            reason = PREDICTED_LATE if queued else LATE_AT_PASS
            self._count_shed(reason)
            return reason
        return None

    def predicted_finish(self, now_ms: int, tokens_ahead: int, tokens: int, max_pass_tokens: int | None = None,
                         extra_ms: float = 0.0, model: ComputeModel | None = None) -> float:
        """When (epoch ms) a request would be answered, from the compute model alone."""
        return now_ms + (model or self.model).predict(tokens_ahead + tokens, max_pass_tokens) + extra_ms

    def observed_finish(self, predicted_finish_ms: float | None, now_ms: int) -> None:
        """An admitted request was answered at ``now_ms``; its admission predicted ``predicted_finish_ms``."""
        if predicted_finish_ms:
            self.errors.observe(predicted_finish_ms, now_ms)

    # -- bulk ------------------------------------------------------------------------------------
    def at_risk(self) -> bool:
        """The lane's recent p95 is near its target: bulk should yield."""
        p95 = self.latency.p95()
        return p95 is not None and p95 >= self.NEAR * self.config.target_ms

    def pass_tokens_beside(self, online_tokens: int) -> int:
        """Most tokens a pass that runs just before an online request may hold and still leave it inside the
        target (the bulk slice that fits: predicted(slice) + predicted(request) within the target)."""
        if self.model.passes == 0:
            return 0
        spare = self.config.target_ms - self.model.predict(max(online_tokens, 1)) - self.config.reply_allowance_ms
        return self.model.tokens_within(spare * 0.8)
