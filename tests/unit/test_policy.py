"""The turn policy: who runs next, waits or is refused, without Kafka or a model (fake clocks, known costs)."""

from __future__ import annotations

import pytest

from embedstream.config import WorkerSettings
from embedstream.workers.admission import (EXPIRED_IN_QUEUE, LATE_AT_PASS, PREDICTED_LATE, AdmissionConfig,
                                           LaneController)
from embedstream.workers.policy import BULK, ONLINE, TurnPolicy


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _policy(queued=lambda: False, clock=None, max_aside_s=0.05, **config) -> TurnPolicy:
    clock = clock or Clock()
    controller = LaneController(ONLINE, AdmissionConfig(**config), clock=clock)
    return TurnPolicy(controller, queued, max_aside_s=max_aside_s, clock=clock)


def _window(window_ms: float) -> LaneController:
    """The fixed batching window (policy ``fixed``)."""
    return LaneController(ONLINE, AdmissionConfig(policy="fixed", fixed_window_ms=window_ms))


# -- passes: a running pass is never forgotten -----------------------------------------------------
def test_a_query_pass_inside_a_bulk_pass_leaves_the_bulk_pass_estimate_in_place():
    clock = Clock()
    policy = _policy(clock=clock)
    with policy.running_pass(BULK, wait_ms=400):
        clock.now = 0.1
        with policy.running_pass(ONLINE, wait_ms=5):  # a query served at the bulk pass's checkpoint
            assert policy.computing(ONLINE) and policy.online_first()
        assert policy.running_ms() == pytest.approx(300)  # the bulk pass still runs
        assert not policy.computing(ONLINE) and policy.computing(BULK)
    assert policy.running_ms() == 0.0 and not policy.computing(BULK)


def test_a_pass_that_fails_still_ends():
    policy = _policy()
    with pytest.raises(RuntimeError), policy.running_pass(BULK, wait_ms=50):
        raise RuntimeError("forward failed")
    assert policy.running_ms() == 0.0


# -- arrival ---------------------------------------------------------------------------------------
def test_an_arrival_is_judged_behind_the_pass_running_and_admitted_when_idle():
    policy = _policy()
    policy.controller.model.observe(100, 100.0)  # 1 ms per token
    policy.controller.model.observe(200, 200.0)
    idle = policy.on_arrival(10_000 + 50, 10_000, ahead=0, tokens=10)
    assert idle.shed is None and idle.deadline_ms == 10_050 and idle.predicted_finish_ms == pytest.approx(10_010)
    with policy.running_pass(BULK, wait_ms=500):
        assert policy.on_arrival(10_000 + 50, 10_000, ahead=0, tokens=10).shed == PREDICTED_LATE


def test_at_its_turn_a_deadline_gone_or_a_pass_too_long_is_shed_and_the_rest_runs():
    policy = _policy()
    assert policy.at_turn(1000, 1000, ahead=0, tokens=10) == EXPIRED_IN_QUEUE
    assert policy.at_turn(1001, 1000, ahead=0, tokens=10) is None  # nothing learnt yet: nothing predicted
    policy.controller.model.observe(100, 100.0)  # 1 ms per token
    policy.controller.model.observe(200, 200.0)
    assert policy.at_turn(1000 + 50, 1000, ahead=0, tokens=10) is None
    assert policy.at_turn(1000 + 50, 1000, ahead=100, tokens=10) == LATE_AT_PASS


# -- online first? (moved from test_online_first.py) ----------------------------------------------
def test_no_wait_when_no_online_work_is_pending():
    clock = Clock()
    gate = _policy(lambda: False, clock=clock)
    assert gate.step_aside(clock.sleep) == 0.0 and clock.now == 0.0


def test_waits_until_online_work_is_done():
    clock = Clock()
    gate = _policy(lambda: clock.now < 0.012, clock=clock, max_aside_s=0.05)
    held = gate.step_aside(clock.sleep, step_s=0.001)
    assert 0.012 <= held < 0.0135 and gate.aside_s == held


def test_never_holds_bulk_longer_than_the_bound_under_endless_online_load():
    clock = Clock()
    gate = _policy(lambda: True, clock=clock, max_aside_s=0.05)
    assert 0.05 <= gate.step_aside(clock.sleep, step_s=0.001) < 0.052
    assert _policy(lambda: True, clock=clock, max_aside_s=0.0).step_aside(clock.sleep) == 0.0


# -- gathering: the window (moved from test_batching_window.py) -----------------------------------
def test_a_lone_request_after_a_quiet_spell_does_not_wait():
    window = _window(5)
    window.arrived(when=10.0, count=1)
    assert window.wait_until(oldest_received=10.0) == 10.0
    window.arrived(when=10.5, count=1)  # 500 ms later: still sparse traffic
    assert window.wait_until(oldest_received=10.5) == 10.5


def test_dense_traffic_gets_the_full_window():
    window = _window(5)
    window.arrived(when=10.0, count=1)
    window.arrived(when=10.003, count=1)  # 3 ms after the last one: another is likely within 5 ms
    assert abs(window.wait_until(oldest_received=10.003) - 10.008) < 1e-9


def test_a_burst_in_one_poll_counts_as_dense():
    window = _window(5)
    window.arrived(when=10.0, count=4)
    assert abs(window.wait_until(oldest_received=10.0) - 10.005) < 1e-9


def test_traffic_that_thins_out_stops_waiting():
    window = _window(5)
    window.arrived(when=10.0, count=3)
    window.arrived(when=10.2, count=1)
    assert window.wait_until(oldest_received=10.2) == 10.2


def test_a_zero_window_never_waits():
    window = _window(0)
    window.arrived(when=10.0, count=8)
    assert window.wait_until(oldest_received=10.0) == 10.0


def test_the_window_follows_the_configured_policy():
    fixed = LaneController(ONLINE, AdmissionConfig.from_settings(WorkerSettings(admission_policy="fixed", batch_window_ms=5)))
    assert fixed.config.policy == "fixed" and fixed.window_ms / 1000 == 0.005
    steered = LaneController("rerank", AdmissionConfig.from_settings(WorkerSettings(latency_target_ms=20, max_window_ms=4)))
    assert steered.lane == "rerank" and steered.config.target_ms == 20
    assert steered.window_ms / 1000 == 0.0  # the controller starts closed and opens while the p95 has slack


def test_the_wait_stops_at_the_oldest_requests_deadline_budget():
    window = _window(10)
    window.arrived(when=10.0, count=4)
    assert window.wait_until(oldest_received=10.0) == 10.010
    assert window.wait_until(oldest_received=10.0, oldest_deadline_s=10.006) == pytest.approx(10.006 - 0.004)  # reply allowance


def test_gathering_polls_until_the_window_ends_and_a_lone_request_goes_at_once():
    clock = Clock()
    policy = _policy(clock=clock, policy="fixed", fixed_window_ms=5)

    class Oldest:
        received, deadline_ms = 0.0, 0

    polls = []

    def poll() -> int:
        polls.append(clock.now)
        clock.sleep(0.001)
        return 0

    policy.gather(Oldest(), 0, poll, full=lambda: False, queued_tokens=lambda: 1)
    assert polls == []  # nothing suggests company: no wait
    policy.arrived(0.0, 4)  # a burst
    policy.gather(Oldest(), 0, poll, full=lambda: False, queued_tokens=lambda: 1)
    assert len(polls) == 5 and clock.now == pytest.approx(0.005)


# -- the unchanged-chunk lookup never holds the caller longer than its bound -----------------------
def test_a_lookup_the_store_never_answers_is_given_up_after_the_bound_and_the_next_is_not_started():
    import threading
    import time

    from embedstream.schemas import ChunkEvent
    from embedstream.workers.output_stage import DocsInFlight
    from embedstream.workers.sink import SAME
    from embedstream.workers.unchanged import UnchangedChunks

    hung, calls = threading.Event(), []

    def lookup(events):  # a store that stopped answering
        calls.append(len(events))
        hung.wait(30)
        return [SAME] * len(events)

    def wait(done, timeout_s):  # the worker answers queries here; this one only waits
        end = time.monotonic() + timeout_s
        while not done() and time.monotonic() < end:
            time.sleep(0.001)
        return done()

    class Item:
        def __init__(self, i):
            self.event = ChunkEvent(doc_id=f"d{i}", chunk_id=0, text="t")
            self.doc_key = f"d{i}"

    docs = DocsInFlight(threading.Condition())
    finder = UnchangedChunks(lookup, wait, docs, metrics=None, wait_s=0.05)
    items = [Item(i) for i in range(3)]

    def find() -> dict:
        found, hold = finder.find(items, items)
        docs.release(hold)  # the batch is written (or writes nothing)
        return found

    try:
        assert find() == {}  # unanswered: nothing skipped, every chunk embedded
        assert find() == {}  # the hung read is still out: no second one
        assert calls == [3]
    finally:
        hung.set()
    end, found = time.monotonic() + 10, {}
    while not found and time.monotonic() < end:  # once the hung read has returned, a new one is answered
        found = find()
    assert found == {id(i): SAME for i in items}  # the store answers again: unchanged chunks are skipped
