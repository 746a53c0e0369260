"""The online batching window waits only when company is likely: a lone request goes at once."""

from __future__ import annotations

import pytest

from embedstream.workers.batching_window import BatchingWindow


def test_a_lone_request_after_a_quiet_spell_does_not_wait():
    window = BatchingWindow(window_ms=5)
    window.arrived(when=10.0, count=1)
    assert window.deadline(oldest_received=10.0) == 10.0
    window.arrived(when=10.5, count=1)  # 500 ms later: still sparse traffic
    assert window.deadline(oldest_received=10.5) == 10.5


def test_dense_traffic_gets_the_full_window():
    window = BatchingWindow(window_ms=5)
    window.arrived(when=10.0, count=1)
    window.arrived(when=10.003, count=1)  # 3 ms after the last one: another is likely within 5 ms
    assert abs(window.deadline(oldest_received=10.003) - 10.008) < 1e-9


def test_a_burst_in_one_poll_counts_as_dense():
    window = BatchingWindow(window_ms=5)
    window.arrived(when=10.0, count=4)
    assert abs(window.deadline(oldest_received=10.0) - 10.005) < 1e-9


def test_traffic_that_thins_out_stops_waiting():
    window = BatchingWindow(window_ms=5)
    window.arrived(when=10.0, count=3)
    window.arrived(when=10.2, count=1)
    assert window.deadline(oldest_received=10.2) == 10.2


def test_a_zero_window_never_waits():
    window = BatchingWindow(window_ms=0)
    window.arrived(when=10.0, count=8)
    assert window.deadline(oldest_received=10.0) == 10.0


def test_the_window_follows_the_configured_policy():
    from embedstream.config import WorkerSettings

    fixed = BatchingWindow.from_settings(WorkerSettings(admission_policy="fixed", batch_window_ms=5))
    assert fixed.controller.config.policy == "fixed" and fixed.window_s == 0.005
    steered = BatchingWindow.from_settings(WorkerSettings(latency_target_ms=20, max_window_ms=4), "rerank")
    assert steered.controller.lane == "rerank" and steered.controller.config.target_ms == 20
    assert steered.window_s == 0.0  # the controller starts closed and opens while the p95 has slack


def test_the_wait_stops_at_the_oldest_requests_deadline_budget():
    window = BatchingWindow(window_ms=10)
    window.arrived(when=10.0, count=4)
    assert window.deadline(oldest_received=10.0) == 10.010
    assert window.deadline(oldest_received=10.0, oldest_deadline_s=10.006) == pytest.approx(10.006 - 0.004)  # reply allowance
