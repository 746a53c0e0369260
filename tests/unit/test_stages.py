"""The staged worker's parts without Kafka: the shared lane queue, a stage thread, revoked offsets."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from embedstream.workers.transport.lane import SyncQueue
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.stages import Stage


@dataclass
class Item:
    name: str
    tokens: int
    partition: int = 0


def test_a_push_wakes_the_model_stage_and_a_take_wakes_intake():
    cond = threading.Condition(threading.RLock())
    queue = SyncQueue(cond)
    woke: list[str] = []

    woken_at: list[float] = []
    patience_s = 30.0  # woken by the push, not by the end of this wait (which would also find the item)

    def model_waits_for_work() -> None:
        with cond:
            if cond.wait_for(lambda: len(queue) > 0, patience_s):
                woke.append("model")
                woken_at.append(time.monotonic())

    waiter = threading.Thread(target=model_waits_for_work)
    waiter.start()
    time.sleep(0.05)
    pushed_at = time.monotonic()
    queue.push_many([Item("a", 3), Item("b", 4)])
    waiter.join(patience_s * 2)
    assert woke == ["model"] and queue.tokens == 7 and queue.pushed == 2
    assert woken_at[0] - pushed_at < patience_s / 2

    def intake_waits_for_room() -> None:
        with cond:
            if cond.wait_for(lambda: queue.tokens < 5, patience_s):
                woke.append("intake")
                woken_at.append(time.monotonic())

    waiter = threading.Thread(target=intake_waits_for_room)
    waiter.start()
    time.sleep(0.05)
    taken_at = time.monotonic()
    assert [i.name for i in queue.take(1)] == ["a"]
    waiter.join(patience_s * 2)
    assert woke == ["model", "intake"] and queue.tokens == 4
    assert woken_at[1] - taken_at < patience_s / 2


def test_dropping_revoked_work_while_another_thread_pushes_keeps_the_count_right():
    queue = SyncQueue(threading.Condition(threading.RLock()))
    stop = threading.Event()

    def intake() -> None:
        n = 0
        while not stop.is_set():
            queue.push_many([Item(f"i{n}", 1, partition=n % 2), Item(f"j{n}", 2, partition=n % 2)])
            n += 1

    pusher = threading.Thread(target=intake)
    pusher.start()
    try:
        for _ in range(200):
            queue.keep(lambda item: item.partition == 0)  # partition 1 revoked, again and again
            queue.take(3)
    finally:
        stop.set()
        pusher.join(10)
    assert queue.tokens == sum(item.tokens for item in queue)
    assert sum(queue.lengths()) == queue.tokens


def test_a_stage_reports_the_error_that_ended_it_and_stops():
    failures: list[tuple[str, BaseException]] = []
    steps = []

    def step() -> None:
        steps.append(time.monotonic())
        if len(steps) == 3:
            raise OSError(28, "No space left on device")

    stage = Stage("output", step, halted=lambda: False, on_failure=lambda s, exc: failures.append((s.name, exc)))
    stage.start()
    assert stage.join(10)
    assert len(steps) == 3 and stage.step_started is None
    ((name, exc),) = failures
    assert name == "output" and "No space left" in str(exc)


def test_a_stage_shows_the_step_in_progress_and_ends_when_halted():
    release, halted = threading.Event(), threading.Event()
    stage = Stage("model", lambda: release.wait(10), halted=halted.is_set, on_failure=lambda s, exc: None)
    stage.start()
    time.sleep(0.1)
    assert stage.step_started is not None and time.monotonic() - stage.step_started >= 0.05  # stuck in one step
    before = stage.step_started
    stage.touch()  # waiting on purpose (backing off): the step counts as fresh
    assert stage.step_started > before
    halted.set()
    release.set()
    assert stage.join(10)


def test_revoked_handles_read_revoked_and_never_commit():
    tracker = OffsetTracker()
    kept = [tracker.track("t", 0, off) for off in range(3)]
    moved = [tracker.track("t", 1, off) for off in range(3)]
    OffsetTracker.done(moved[0])
    OffsetTracker.done(moved[2])
    # where the partition must be read again should it come back (kafka-python keeps its fetch position)
    assert tracker.forget({("t", 1)}) == {("t", 1): 1}
    for handle in kept + moved:
        OffsetTracker.done(handle)  # the output stage finishing work it already had
    assert all(OffsetTracker.revoked(h) for h in moved) and not any(OffsetTracker.revoked(h) for h in kept)
    assert tracker.drain() == {("t", 0): 3}
