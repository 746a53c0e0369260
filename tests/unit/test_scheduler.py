"""The embed worker's batch formation, with no broker: online first, bulk fills, bulk sliced, deletes in place."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from embedstream.engine.batcher import BatchLimits
from embedstream.workers.scheduler import Scheduler, WorkQueue


@dataclass
class Item:
    name: str
    tokens: int


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def queue(*items: Item) -> WorkQueue:
    q: WorkQueue = WorkQueue()
    for item in items:
        q.push(item)
    return q


def names(batch) -> list[str]:
    return [item.name for item in batch]


def scheduler(clock=None, max_tokens=100, max_requests=8, slice_tokens=20, quiet_s=1.0) -> Scheduler:
    return Scheduler(BatchLimits(max_tokens, max_requests), slice_tokens, quiet_s, clock or Clock())


def test_online_is_taken_first_and_bulk_fills_only_the_leftover_budget():
    online = queue(Item("q1", 30), Item("q2", 30))
    bulk = queue(Item("b1", 30), Item("b2", 30), Item("b3", 5))
    batch = scheduler().next_batch(online, bulk)
    assert names(batch) == ["q1", "q2", "b1"]  # 90 of 100 tokens: b2 (30) does not fit, FIFO stops there
    assert sum(i.tokens for i in batch) <= 100
    assert names(bulk) == ["b2", "b3"] and bulk.tokens == 35 and online.tokens == 0


def test_bulk_fills_by_the_sequence_budget_too():
    online = queue(*(Item(f"q{i}", 1) for i in range(6)))
    bulk = queue(*(Item(f"b{i}", 1) for i in range(6)))
    batch = scheduler(max_requests=8).next_batch(online, bulk)
    assert names(batch) == [f"q{i}" for i in range(6)] + ["b0", "b1"]


def test_online_over_the_budget_runs_first_and_bulk_takes_the_rest_of_that_pass():
    online = queue(Item("q1", 60), Item("q2", 60))
    bulk = queue(Item("b1", 1), Item("b2", 50))
    s = scheduler()
    assert names(s.next_batch(online, bulk)) == ["q1", "b1"]  # q2 would exceed 100; b1 fits the 40 left
    assert names(s.next_batch(online, bulk)) == ["q2"]  # b2 (50) does not fit beside q2


def test_bulk_is_capped_at_the_slice_while_online_is_recent_and_not_after():
    clock = Clock()
    s = scheduler(clock, slice_tokens=20, quiet_s=1.0)
    bulk = queue(*(Item(f"b{i}", 10) for i in range(10)))
    online = queue()
    s.online_arrived()
    assert names(s.next_batch(online, bulk)) == ["b0", "b1"]  # 20-token slice
    clock.now += 0.5
    assert names(s.next_batch(online, bulk)) == ["b2", "b3"]  # still recent
    clock.now += 0.6  # 1.1 s after the last online record: quiet
    assert names(s.next_batch(online, bulk)) == [f"b{i}" for i in range(4, 10)]  # whole budget


def test_bulk_alone_is_never_sliced_and_an_oversized_item_runs_alone():
    s = scheduler(slice_tokens=20)
    bulk = queue(Item("b1", 50), Item("b2", 50), Item("b3", 1))
    assert names(s.next_batch(None, bulk)) == ["b1", "b2"]  # no online lane: full budget
    clock = Clock()
    s = scheduler(clock, slice_tokens=20)
    s.online_arrived()
    big = queue(Item("big", 80), Item("b", 1))
    assert names(s.next_batch(queue(), big)) == ["big"]  # over the slice: still runs, alone


def test_deletes_keep_their_log_position_relative_to_chunks():
    bulk = queue(Item("c1", 30), Item("del-doc1", 0), Item("c2", 30), Item("del-doc2", 0), Item("c3", 50))
    batch = scheduler().next_batch(None, bulk)
    assert names(batch) == ["c1", "del-doc1", "c2", "del-doc2"]  # c3 does not fit; nothing jumps the queue
    assert names(scheduler().next_batch(None, bulk)) == ["c3"]


def test_work_queue_keeps_its_token_count():
    q = queue(Item("a", 3), Item("b", 4), Item("c", 5))
    q.keep(lambda item: item.name != "b")
    assert names(q) == ["a", "c"] and q.tokens == 8 and q.oldest.name == "a"
    assert names(q.take(5)) == ["a", "c"] and q.tokens == 0 and not q


def at_risk_scheduler(clock, p95_ms: float, slice_tokens=1024, max_tokens=8192):
    """A scheduler whose online controller learnt 3 ms + 0.16 ms/token and saw ``p95_ms`` latencies (target 30)."""
    from embedstream.workers.admission import AdmissionConfig, LaneController

    online = LaneController("online", AdmissionConfig(target_ms=30, reply_allowance_ms=2), clock=clock)
    for tokens in (10, 50, 100, 200, 400, 800):
        online.model.observe(tokens, 3 + 0.16 * tokens)
    for _ in range(20):
        online.observed_latency(p95_ms)
    return Scheduler(BatchLimits(max_tokens, 256), slice_tokens, 1.0, clock, admission=online, min_slice_tokens=32)


def test_bulk_slices_shrink_to_what_fits_beside_a_query_while_online_is_at_risk():
    clock = Clock()
    calm, risky = at_risk_scheduler(clock, 6.0), at_risk_scheduler(clock, 28.0)
    for s in (calm, risky):
        s.online_arrived()
        s.next_batch(queue(Item("q", 20)), None)  # learns the size of an online request
    assert calm.bulk_cap() == 1024
    fit = risky.bulk_cap()
    assert 32 <= fit < 1024
    assert 3 + 0.16 * fit + 3 + 0.16 * 20 <= 30  # slice + the query still inside the target
    bulk = queue(*(Item(f"b{i}", 10) for i in range(200)))
    assert sum(i.tokens for i in risky.next_batch(queue(), bulk)) <= fit
    assert not risky.bulk_paused


def test_bulk_tops_up_an_online_pass_only_within_the_target_and_pauses_when_over_it():
    clock = Clock()
    s = at_risk_scheduler(clock, 45.0)  # over the target
    bulk = queue(*(Item(f"b{i}", 10) for i in range(200)))
    batch = s.next_batch(queue(Item("q", 20)), bulk)
    assert sum(i.tokens for i in batch) <= 20 + 0.1 * 30 / 0.16  # bulk adds at most 3 ms to the query's pass
    assert s.bulk_paused  # over the target even with shrunk slices: bulk consumption may pause
    clock.now += 10  # the latencies age out: slack again, bulk resumes
    assert not s.update_pause()  # without any batch formed (nothing queued): the bulk lane asks before each poll
    assert not s.bulk_paused


def test_bulk_fills_an_online_pass_where_tokens_cost_almost_nothing_and_never_before_a_pass_is_seen():
    from embedstream.workers.admission import AdmissionConfig, LaneController

    clock = Clock()
    online = LaneController("online", AdmissionConfig(target_ms=30), clock=clock)
    s = Scheduler(BatchLimits(2048, 256), 1024, 1.0, clock, admission=online)
    bulk = queue(*(Item(f"b{i}", 100) for i in range(100)))
    assert names(s.next_batch(queue(Item("q", 20)), bulk)) == ["q"]  # cost unknown: the query runs alone
    for tokens in (10, 100, 1000, 2000):  # GPU-like: 5 ms a pass, whatever it holds
        online.model.observe(tokens, 5 + 0.0001 * tokens)
    batch = s.next_batch(queue(Item("q", 20)), bulk)
    assert sum(i.tokens for i in batch) == 2020  # filled to the token budget


def test_marginal_tokens_follow_the_slope_not_the_fixed_cost():
    from embedstream.workers.admission import ComputeModel

    model = ComputeModel()
    for tokens in (10, 100, 1000):
        model.observe(tokens, 3 + 0.16 * tokens)
    assert model.marginal_tokens_within(3.2) == pytest.approx(20, abs=1)
    assert model.tokens_within(3.2) <= 1  # a whole pass of 3.2 ms holds almost nothing


def test_a_pass_with_yield_points_may_be_larger_while_online_is_at_risk():
    clock = Clock()
    plain, yielding = at_risk_scheduler(clock, 28.0), at_risk_scheduler(clock, 28.0)
    yielding.yield_points = 6
    for s in (plain, yielding):
        s.online_arrived()
        s.next_batch(queue(Item("q", 20)), None)
    assert plain.bulk_cap() < yielding.bulk_cap() <= 1024
    assert yielding.bulk_cap() == min(1024, 6 * plain.bulk_cap())  # a query waits for one step, not the pass


def test_a_bulk_pause_ends_after_its_bound_even_while_online_stays_over_target_and_bulk_then_runs_a_while():
    clock = Clock()
    s = at_risk_scheduler(clock, 45.0)
    assert s.update_pause()
    clock.now += 1.0
    for _ in range(5):
        s.admission.observed_latency(45.0)
    assert s.update_pause()  # still over the target: still paused
    clock.now += 1.1
    for _ in range(5):
        s.admission.observed_latency(45.0)
    assert not s.update_pause()  # 2 s is the longest pause
    clock.now += 1.0
    for _ in range(5):
        s.admission.observed_latency(45.0)
    assert not s.update_pause()  # and bulk runs at least as long before the next
    clock.now += 1.1
    for _ in range(5):
        s.admission.observed_latency(45.0)
    assert s.update_pause()
