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


def test_a_bulk_batch_waiting_for_the_output_stage_lets_queued_queries_compute_meanwhile():
    """The model stage blocked on a full output queue with a bulk batch must not keep a query waiting: the
    output stage holds bulk writes while a query is pending, so without this they waited on each other."""
    import queue
    import threading
    import time
    from collections import Counter
    from types import SimpleNamespace

    from embedstream.workers.embed_worker import EmbedWorker, WriteJob

    worker = EmbedWorker.__new__(EmbedWorker)  # just the hand-on path: no Kafka, no model
    worker.to_output = queue.Queue(maxsize=1)
    worker.to_output.put("a batch the output stage is holding")
    worker.writes = threading.Condition()
    worker.docs_in_flight = Counter()
    worker._halt = threading.Event()
    stop = threading.Event()
    output = SimpleNamespace(name="output", thread=threading.Thread(target=stop.wait, daemon=True))
    output.thread.start()  # alive: the model stage keeps waiting for room
    worker.running_stages = [output]
    worker.lanes = {"online": object(), "bulk": object()}
    item = lambda lane: SimpleNamespace(lane=lane, doc_key=None)  # noqa: E731
    bulk_job, query_job = WriteJob([item("bulk")], {}), WriteJob([item("online")], {})
    computed: list[float] = []
    queued_queries = [query_job]

    def compute_online_now():
        computed.append(time.monotonic())
        return [queued_queries.pop()] if queued_queries else []

    worker._compute_online_now = compute_online_now
    freed_at: list[float] = []
    written: list = []

    def output_stage_frees_room_later():
        time.sleep(0.1)
        freed_at.append(time.monotonic())
        written.append(worker.to_output.get())
        written.append(worker.to_output.get(timeout=5))  # room again for the next job

    writer = threading.Thread(target=output_stage_frees_room_later)
    writer.start()
    worker._hand_on(bulk_job)
    writer.join(5)
    stop.set()
    assert computed and computed[0] < freed_at[0] - 0.05  # the query ran while the bulk batch waited
    assert written[1] is bulk_job  # then the bulk batch went on, and the query's job after it
    assert worker.to_output.get_nowait() is query_job
