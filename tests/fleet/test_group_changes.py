"""The bulk lane's group changing under load on the 3-broker cluster: 1 -> 3 -> 1 workers mid-backlog, a member
killed -9, a rolling restart with static membership. Each ends with the index exact and no worker exited;
the pauses and the query p95 during each event are measured by ``embedstream bench fleet`` (docs/fleet.md),
not asserted here."""

from __future__ import annotations

import signal
import threading

import pytest
import ports
from conftest import memory_store, wait_for
from fault_rig import (_assert_exactly, _chunk_events, _chunks_handled, _committed_to_the_end, _GroupProgress, _publish,
                       _spawn_worker, _SteadyProducer, counting_settings)
from worker_rig import RunningWorker

from embedstream.producers.topics import ensure_topics
from embedstream.schemas.codec import encode

pytestmark = pytest.mark.usefixtures("healed")


def _count(store, collection: str) -> int:
    return store.count(collection) if store.collection_exists(collection) else 0


def _assigned(worker) -> set:
    return set(worker.lanes["bulk"].consumer.assignment())


def _embedded(worker) -> float:
    return worker.metrics.texts.labels(lane="bulk", kind="chunk")._value.get()


def _with_kafka(settings, **changes):
    return settings.model_copy(update={"kafka": settings.kafka.model_copy(update=changes)})


def _fed_backlog(cluster, name: str, partitions: int, count: int, first: int, rate_per_s: float):
    """``first`` of ``count`` chunks published now, a steady producer ready to send the rest; a memory store."""
    settings = counting_settings(cluster.bootstrap, name)
    ensure_topics(settings.kafka, partitions=partitions)
    topic = settings.kafka.topic_chunks_bulk
    events = _chunk_events(count, name[-1].upper())
    _publish(settings, topic, [encode(e) for e in events[:first]])
    producer = _SteadyProducer(settings, topic, [encode(e) for e in events[first:]], rate_per_s=rate_per_s)
    return settings, topic, settings.qdrant.collection, events, producer, memory_store()


@pytest.mark.timeout(600)
def test_bulk_lane_one_to_three_to_one_workers_mid_backlog(cluster, minilm_engine):
    from embedstream.engine.engine import Engine

    settings = counting_settings(cluster.bootstrap, "g131")
    ensure_topics(settings.kafka, partitions=6)
    topic, collection = settings.kafka.topic_chunks_bulk, settings.qdrant.collection
    events = _chunk_events(720, "S")
    thirds = [events[i:i + 240] for i in (0, 240, 480)]
    _publish(settings, topic, [encode(e) for e in thirds[0]])
    store = memory_store()
    first = RunningWorker(settings, minilm_engine, store, lanes=("bulk",))
    others = [RunningWorker(settings, Engine.from_name("all-MiniLM-L6-v2"), store, lanes=("bulk",)) for _ in range(2)]
    with first as one:
        wait_for(lambda: _count(store, collection) >= 60, 180, "the first worker indexing")
        with others[0] as two, others[1] as three:  # 1 -> 3: the six partitions spread over three members
            _publish(settings, topic, [encode(e) for e in thirds[1]])  # a backlog while they join
            wait_for(lambda: all(_assigned(w) and _embedded(w) >= 10 for w in (two, three)), 300,
                     "the new members taking partitions and indexing")
            assert 0 < len(_assigned(one)) < 6
            _publish(settings, topic, [encode(e) for e in thirds[2]])  # and while they leave
        # 3 -> 1: both stopped (they leave the group) mid-backlog
        wait_for(lambda: _count(store, collection) == len(events), 300, "every chunk indexed")
        end = _committed_to_the_end(settings, topic, settings.kafka.group_bulk, timeout_s=120)
        assert first.thread.is_alive(), "the first worker exited in a rebalance"
        wait_for(lambda: len(_assigned(one)) == 6, 60, "the first worker holding every partition again")
        print(f"\n1 -> 3 -> 1: embedded {_embedded(one):.0f} + {_embedded(two):.0f} + {_embedded(three):.0f} "
              f"for {len(events)} chunks (log end {end})")
    assert end == len(events)
    _assert_exactly(store.scroll(collection), events)


@pytest.mark.timeout(600)
def test_a_member_killed_9_its_partitions_move_and_nothing_is_lost(cluster, tmp_path):
    from embedstream.vectorstore.edge_store import EdgeStore

    settings = counting_settings(cluster.bootstrap, "gkill")
    ensure_topics(settings.kafka, partitions=4)
    topic, group, collection = settings.kafka.topic_chunks_bulk, settings.kafka.group_bulk, settings.qdrant.collection
    events = _chunk_events(900, "K")
    _publish(settings, topic, [encode(e) for e in events])
    base = ports.port(ports.FLEET_WORKERS)
    metrics_ports, stores, log = (base, base + 1), (tmp_path / "a", tmp_path / "b"), tmp_path / "workers.log"
    workers = [_spawn_worker(settings, stores[i], metrics_ports[i], log) for i in range(2)]  # session timeout 6 s
    progress = _GroupProgress(settings, topic, group)
    try:
        def both_working() -> bool:
            assert all(w.poll() is None for w in workers), log.read_text()[-3000:]
            try:
                return all(_chunks_handled(port) > 0 for port in metrics_ports)
            except OSError:  # metrics not served yet
                return False

        wait_for(both_working, 300, "both members indexing")
        workers[1].send_signal(signal.SIGKILL)
        assert workers[1].wait(10) == -signal.SIGKILL
        at_kill = progress.committed()
        assert at_kill < len(events), "the member should die mid-backlog"
        wait_for(lambda: workers[0].poll() is not None or progress.committed() == len(events), 300,
                 "the survivor committing to the log end")
        assert workers[0].poll() is None, log.read_text()[-3000:]
        workers[0].send_signal(signal.SIGTERM)
        assert workers[0].wait(60) == 0, log.read_text()[-3000:]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        progress.close()
    points, held = {}, []
    for path in stores:  # one shared collection holds the union (upserts by point id)
        store = EdgeStore(path)
        try:
            name = store.get_alias(collection) or collection  # the workers create docs_v1 behind the alias docs
            found = {p.id: p for p in store.scroll(name)} if store.collection_exists(name) else {}
        finally:
            store.close()
        held.append(len(found))
        points.update(found)
    print(f"\nkill -9 of a member at {at_kill}/{len(events)} committed; the survivor took its partitions over; "
          f"stores held {held} points, {len(points)} distinct")
    _assert_exactly(list(points.values()), events)


@pytest.mark.timeout(600)
def test_rolling_restart_with_static_membership_keeps_the_assignment(cluster, minilm_engine):
    from embedstream.engine.engine import Engine

    settings, topic, collection, events, producer, store = _fed_backlog(cluster, "gstatic", 4, 600, 200, 8)
    member = {name: _with_kafka(settings, group_instance_id=name, session_timeout_ms=45_000) for name in ("s1", "s2")}
    engines = {"s1": minilm_engine, "s2": Engine.from_name("all-MiniLM-L6-v2")}
    running = {name: RunningWorker(member[name], engines[name], store, lanes=("bulk",)) for name in member}
    for worker in running.values():
        worker.__enter__()
    try:
        wait_for(lambda: all(_assigned(w.worker) for w in running.values()) and _count(store, collection) >= 40, 240,
                 "both static members indexing")
        producer.thread.start()
        for name in ("s1", "s2"):  # one after the other: stopped, started again under the same id
            other = running["s2" if name == "s1" else "s1"]
            held = _assigned(other.worker)
            before = _assigned(running[name].worker)
            shrunk = threading.Event()
            watch = threading.Thread(target=_watch_kept, args=(other.worker, held, shrunk), daemon=True)
            watch.start()
            running[name].__exit__(None, None, None)
            running[name] = RunningWorker(member[name], engines[name], store, lanes=("bulk",))
            running[name].__enter__()
            wait_for(lambda: _assigned(running[name].worker) == before, 120, f"{name} getting its partitions back")
            assert not shrunk.is_set(), f"the other member lost partitions while {name} restarted (a rebalance)"
            assert other.thread.is_alive()
        producer.thread.join(300)
        assert producer.error is None, repr(producer.error)
        wait_for(lambda: _count(store, collection) == len(events), 300, "every chunk indexed")
        end = _committed_to_the_end(settings, topic, settings.kafka.group_bulk, timeout_s=120)
        assert all(w.thread.is_alive() for w in running.values())
    finally:
        for worker in running.values():
            if worker.thread.is_alive():
                worker.__exit__(None, None, None)
    assert end >= len(events)
    _assert_exactly(store.scroll(collection), events)


def _watch_kept(worker, held: set, shrunk: threading.Event) -> None:
    """Sets ``shrunk`` if ``worker`` holds less than ``held`` at some point within 2 minutes."""
    import time

    end = time.monotonic() + 120
    while time.monotonic() < end:
        if not held <= set(worker.lanes["bulk"].consumer.assignment()):
            shrunk.set()
            return
        time.sleep(0.05)
