"""OnlineFirst: a bulk step waits while online work is pending, never longer than its bound."""

from embedstream.workers.online_first import OnlineFirst


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_no_wait_when_no_online_work_is_pending():
    clock = Clock()
    gate = OnlineFirst(lambda: False, clock=clock)
    assert gate.hold(clock.sleep) == 0.0 and clock.now == 0.0


def test_waits_until_online_work_is_done():
    clock = Clock()
    gate = OnlineFirst(lambda: clock.now < 0.012, max_hold_s=0.05, clock=clock)
    held = gate.hold(clock.sleep, step_s=0.001)
    assert 0.012 <= held < 0.0135 and gate.held_s == held


def test_never_holds_bulk_longer_than_the_bound_under_endless_online_load():
    clock = Clock()
    gate = OnlineFirst(lambda: True, max_hold_s=0.05, clock=clock)
    assert 0.05 <= gate.hold(clock.sleep, step_s=0.001) < 0.052
    assert OnlineFirst(lambda: True, max_hold_s=0.0, clock=clock).hold(clock.sleep) == 0.0
