"""The admission controller with a synthetic compute-time model and a fake clock (no Kafka, no engine)."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from embedstream.config import Settings, WorkerSettings
from embedstream.workers.admission import (DEADLINE_PAST, EXPIRED_IN_QUEUE, LATE_AT_PASS, ON_ARRIVAL, PREDICTED_LATE,
                                          AdmissionConfig,
                                           ComputeModel, Deadlines, LaneController)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def synthetic_ms(tokens: int, rng: random.Random) -> float:
    """The host's measured shape: about 3 ms per pass + 0.16 ms per token, with +-10% noise."""
    return (3.0 + 0.16 * tokens) * rng.uniform(0.9, 1.1)


def trained(controller: LaneController, passes: int = 60, seed: int = 1) -> None:
    rng = random.Random(seed)
    for _ in range(passes):
        tokens = rng.randint(10, 400)
        controller.model.observe(tokens, synthetic_ms(tokens, rng))


def controller(policy: str = "aimd", clock: Clock | None = None, **config) -> LaneController:
    return LaneController("online", AdmissionConfig(policy=policy, **config), clock=clock or Clock())


def test_prediction_tracks_the_synthetic_model_and_follows_a_drift():
    rng = random.Random(7)
    model = ComputeModel()
    assert model.predict(100) == 0.0  # nothing seen: no guess
    for _ in range(200):
        tokens = rng.randint(10, 800)
        model.observe(tokens, synthetic_ms(tokens, rng))
    a, b = model.coefficients()
    assert a == pytest.approx(3.0, abs=1.0) and b == pytest.approx(0.16, rel=0.1)
    assert model.predict(500) == pytest.approx(83.0, rel=0.1)
    for _ in range(200):  # the host gets twice as slow: the recent passes win
        tokens = rng.randint(10, 800)
        model.observe(tokens, 2 * synthetic_ms(tokens, rng))
    assert model.predict(500) == pytest.approx(166.0, rel=0.1)
    assert model.predict(1000, max_pass_tokens=500) == pytest.approx(2 * model.predict(500), rel=0.01)


def test_one_token_count_only_gives_a_proportional_fit():
    model = ComputeModel()
    for _ in range(5):
        model.observe(20, 6.0)
    assert model.predict(20) == pytest.approx(6.0) and model.predict(40) == pytest.approx(12.0)


def test_the_window_shrinks_when_the_p95_exceeds_the_target():
    clock = Clock()
    c = controller(clock=clock, target_ms=30, max_window_ms=10)
    c.window_ms = 8.0
    for _ in range(20):
        c.observed_latency(45.0)
    widths = [c.window_ms]
    for _ in range(6):
        clock.now += 0.2
        c.observed_pass(100, 19.0)
        widths.append(c.window_ms)
    assert all(later < earlier or later == 0 for earlier, later in zip(widths, widths[1:]))
    assert widths[-1] == 0.0


def test_the_window_grows_with_slack_up_to_its_bound():
    clock = Clock()
    c = controller(clock=clock, target_ms=30, max_window_ms=4)
    for _ in range(20):
        c.observed_latency(6.0)
    widths = []
    for _ in range(20):
        clock.now += 0.01
        c.observed_pass(20, 6.0)
        widths.append(c.window_ms)
    assert widths[0] > 0 and widths == sorted(widths) and widths[-1] == 4.0


def test_the_window_holds_between_slack_and_the_target():
    clock = Clock()
    c = controller(clock=clock, target_ms=30)
    c.window_ms = 3.0
    for _ in range(20):
        c.observed_latency(20.0)  # between 0.5 and 0.8 of the target
    c.observed_pass(20, 6.0)
    assert c.window_ms == 3.0


@pytest.mark.parametrize("policy", ["aimd", "deadline", "fixed"])
def test_the_wait_never_exceeds_the_remaining_deadline_budget(policy):
    clock = Clock()
    rng = random.Random(3)
    c = controller(policy, clock=clock, target_ms=30, max_window_ms=10, fixed_window_ms=10, reply_allowance_ms=2)
    trained(c)
    c.window_ms = 10.0
    for _ in range(300):
        received = clock.now
        c.arrived(received, rng.randint(1, 4))
        queued = rng.randint(1, 300)
        deadline = received + rng.uniform(-0.01, 0.05)
        until = c.wait_until(received, deadline, queued)
        budget_end = deadline - (c.model.predict(queued) + 2) / 1000
        assert received <= until <= max(received, budget_end) + 1e-12
        assert until <= received + 0.010 + 1e-12
        clock.now += rng.uniform(0.0005, 0.003)


def test_a_lone_request_does_not_wait_and_a_burst_does():
    clock = Clock()
    c = controller(clock=clock, max_window_ms=5)
    c.window_ms = 5.0
    c.arrived(clock.now, 1)
    assert c.wait_until(clock.now) == clock.now
    c.arrived(clock.now + 0.001, 4)
    assert c.wait_until(clock.now + 0.001) == pytest.approx(clock.now + 0.006)


def test_deadline_policy_waits_while_the_oldest_still_meets_the_target():
    clock = Clock()
    c = controller("deadline", clock=clock, target_ms=30, max_window_ms=50, reply_allowance_ms=2)
    for _ in range(10):
        c.model.observe(20, 6.0)  # 0.3 ms per token, proportional
    c.arrived(clock.now, 4)
    until = c.wait_until(clock.now, None, queued_tokens=20)
    assert (until - clock.now) * 1000 == pytest.approx(0.92 * 30 - 6.0 - 2, abs=1e-6)


def test_bad_deadlines_have_a_clear_outcome():
    config = AdmissionConfig(default_deadline_ms=5000, max_request_age_ms=60000)
    c = controller(default_deadline_ms=5000, max_request_age_ms=60000)
    now = 1_700_000_000_000
    assert c.refuse_on_arrival(now - 1, now) == DEADLINE_PAST  # past: refused at once
    assert c.refuse_on_arrival(now + 10, now) is None and c.refuse_on_arrival(None, now) is None
    deadlines = Deadlines(config)
    assert deadlines.effective(None, now) == now + 5000  # missing: the default
    assert deadlines.effective(now + 10 * 365 * 86400 * 1000, now) == now + 60000  # years ahead: capped
    assert deadlines.effective(now + 100, now) == now + 100
    assert c.shed[DEADLINE_PAST] == 1


def test_a_request_that_cannot_finish_in_time_is_shed_before_compute():
    c = controller(target_ms=30, reply_allowance_ms=2)
    now = 1_700_000_000_000
    assert c.late(now + 20, now, tokens_ahead=0, tokens=20) is None  # no pass seen yet: nothing shed on a guess
    trained(c)
    assert c.late(now + 30, now, tokens_ahead=0, tokens=20) is None  # ~6 ms of work: fits
    assert c.late(now + 30, now, tokens_ahead=400, tokens=20) == PREDICTED_LATE  # ~70 ms queued ahead of it
    assert c.late(now - 1, now, 0, 20) == EXPIRED_IN_QUEUE
    # at its turn (no longer queued) the same verdict has its own reason: it was not answered at once
    assert c.late(now + 5, now, tokens_ahead=400, tokens=20, queued=False) == LATE_AT_PASS
    assert c.shed == {PREDICTED_LATE: 1, EXPIRED_IN_QUEUE: 1, LATE_AT_PASS: 1}
    assert PREDICTED_LATE in ON_ARRIVAL and LATE_AT_PASS not in ON_ARRIVAL and EXPIRED_IN_QUEUE not in ON_ARRIVAL


def test_fixed_policy_does_not_shed_on_predictions():
    c = controller("fixed")
    trained(c)
    now = 1_700_000_000_000
    assert c.late(now + 5, now, tokens_ahead=4000, tokens=20) is None
    assert c.late(now - 5, now, 0, 20) == EXPIRED_IN_QUEUE


def test_risk_and_the_bulk_slice_that_fits_beside_a_query():
    c = controller(target_ms=30, reply_allowance_ms=2)
    assert not c.at_risk() and c.pass_tokens_beside(20) == 0
    trained(c)
    fit = c.pass_tokens_beside(20)
    assert 0 < fit and c.model.predict(fit) + c.model.predict(20) <= 30
    for _ in range(20):
        c.observed_latency(28.0)
    assert c.at_risk()


@pytest.mark.parametrize("field", ["batch_window_ms", "latency_target_ms", "max_window_ms", "default_deadline_ms",
                                   "max_request_age_ms"])
def test_a_negative_setting_is_refused_at_start_naming_it(monkeypatch, field):
    monkeypatch.setenv(f"EMBEDSTREAM_WORKER__{field.upper()}", "-5")
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert field in str(refused.value) and "greater than" in str(refused.value)


def test_an_unknown_policy_or_negative_config_is_refused():
    with pytest.raises(ValidationError):
        WorkerSettings(admission_policy="guess")
    with pytest.raises(ValueError, match="target_ms"):
        AdmissionConfig(target_ms=-1)
    with pytest.raises(ValueError, match="policy"):
        AdmissionConfig(policy="guess")
    assert AdmissionConfig.from_settings(WorkerSettings(latency_target_ms=25)).target_ms == 25


def test_shedding_counts_as_a_miss_so_bulk_yields_to_a_lane_that_sheds_everything():
    c = controller(target_ms=30)
    trained(c)
    now = 1_700_000_000_000
    assert not c.at_risk()  # no latencies yet
    for _ in range(10):
        assert c.late(now + 10, now, tokens_ahead=1000, tokens=20) == PREDICTED_LATE
    assert c.at_risk()


def test_the_p95_is_the_callers_wait_when_the_send_time_is_known():
    c = controller(target_ms=30)
    now = 1_700_000_000_000
    for _ in range(10):
        c.observed_reply(8.0, sent_at_ms=now - 26, now_ms=now)  # 18 ms of it was the trip in
    assert c.latency.p95() == 26.0 and c.at_risk()
    c = controller(target_ms=30)
    for sent in (None, now + 50, now - 10 ** 9):  # unknown, a clock ahead, absurdly old: the in-worker time
        for _ in range(3):
            c.observed_reply(8.0, sent_at_ms=sent, now_ms=now)
    assert c.latency.p95() == 8.0


def test_requests_that_finished_later_than_predicted_widen_the_margin_of_the_next_decisions():
    clock = Clock()
    c = controller(target_ms=30, reply_allowance_ms=2, clock=clock)
    trained(c)
    now = 1_700_000_000_000
    fits = c.predicted_finish(now, 0, 20)
    assert now + 5 < fits < now + 8  # ~6 ms of compute
    assert c.late(now + 20, now, tokens_ahead=0, tokens=20) is None  # 6 + 2 ms well inside 20
    for _ in range(20):  # every admitted request finished 15 ms later than its prediction (cold core, GIL turns)
        c.observed_finish(fits, fits + 15)
    assert c.errors.margin() == pytest.approx(15)
    assert c.late(now + 20, now, tokens_ahead=20, tokens=20) == PREDICTED_LATE  # 9.4 + 15 + 2 > 20
    assert c.late(now + 30, now, tokens_ahead=20, tokens=20) is None  # 26.4 ms still fits 30
    # nothing queued ahead: it delays nobody, judged on its own compute
    assert c.late(now + 20, now, tokens_ahead=0, tokens=20) is None
    # just before its own pass only the pass's compute is left: the queueing margin is not counted again
    assert c.late(now + 20, now, tokens_ahead=20, tokens=20, queued=False) is None
    clock.now += 11  # the errors age out: back to the compute model alone
    assert c.errors.margin() == 0.0 and c.late(now + 20, now, 20, 20) is None


def test_the_margin_is_bounded_and_never_negative():
    c = controller(target_ms=30)
    for _ in range(10):
        c.observed_finish(1000.0, 900.0)  # earlier than predicted
    assert c.errors.margin() == 0.0
    for _ in range(30):
        c.observed_finish(1000.0, 5000.0)  # a stall: 4 s late
    assert c.errors.margin() == 15.0  # at most half the target


def test_the_pass_already_running_counts_as_work_ahead():
    c = controller(target_ms=30, reply_allowance_ms=2)
    trained(c)
    now = 1_700_000_000_000
    assert c.late(now + 20, now, tokens_ahead=0, tokens=20) is None  # ~6 + 2 ms: fits
    assert c.late(now + 20, now, tokens_ahead=0, tokens=20, running_ms=15) == PREDICTED_LATE  # 15 more ms first
    assert c.predicted_finish(now, 0, 20, None, 15) == pytest.approx(c.predicted_finish(now, 0, 20) + 15)


def test_at_its_turn_a_request_is_judged_by_its_own_lanes_passes_not_by_bulk_ones():
    """Under a backlog the shared cost model is fitted on long bulk passes; its intercept must not refuse a
    query whose own passes take a few ms (that refused 30 of 50 QPS's queries at their turn)."""
    c = controller(target_ms=30, reply_allowance_ms=2)
    for _ in range(40):  # bulk passes: 512 tokens in 120 ms, 256 in 90 ms (a big fixed part under contention)
        c.observed_pass(512, 120.0, own=False)
        c.observed_pass(256, 90.0, own=False)
    now = 1_700_000_000_000
    assert c.model.predict(20) > 50  # the shared model reads a 20-token query's pass as ~60 ms
    assert c.late(now + 20, now, 0, 20, queued=False) == LATE_AT_PASS  # too few of its own passes seen yet
    for _ in range(LaneController.OWN_PASSES_NEEDED):
        c.observed_pass(16, 5.0)
        c.observed_pass(32, 7.0)
    assert c.late(now + 20, now, 0, 20, queued=False) is None  # ~5.5 + 2 ms: it makes it
    assert c.late(now + 5, now, 0, 20, queued=False) == LATE_AT_PASS  # it would not
    # on arrival the work ahead may be bulk: the shared model (fitted on every pass) still predicts it
    assert c.predicted_finish(now, 0, 20) == pytest.approx(now + c.model.predict(20))
    assert c.model.predict(20) > c.own_passes.predict(20) + 5
