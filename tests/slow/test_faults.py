"""Fault tolerance on the real broker: Qdrant outages and poison streams lose nothing.

Each test ends with an exact count of points and ids in the store, and checks committed offsets.
"""

from __future__ import annotations

import json
import time

import ports
import pytest
from conftest import isolated_settings, make_engine, memory_store, read_dead_letters, wait_for
from worker_rig import RunningWorker

from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.workers.sink import point_id
from fault_rig import _BROKER_DOWN_S, _GroupProgress, _SteadyProducer, _assert_exactly, _chunk_events, _chunks_handled, _committed, _committed_to_the_end, _free_port, _publish, _spawn_worker

pytestmark = pytest.mark.kafka


@pytest.mark.slow
def test_one_percent_poison_in_ten_thousand_events(kafka_bootstrap, tiny_bert_dir):
    """Poison is decided before the model (decode, validation): a tiny model keeps the 9,900 good events' forward
    passes nearly free (MiniLM's took most of this test's 193 s at load 20)."""
    settings = isolated_settings(kafka_bootstrap, "poison")
    ensure_topics(settings.kafka, partitions=4)
    topic = settings.kafka.topic_chunks_bulk
    values, good_ids, poison = [], set(), 0
    for i in range(10_000):
        if i % 100 == 37:
            kind = poison % 3
            values.append([b"{broken json",
                           json.dumps({"schema_version": 1, "kind": "chunk", "chunk_id": 0, "text": "no doc"}).encode(),
                           encode(ChunkEvent(doc_id=f"p{i}", chunk_id=0, text="  "))][kind])
            poison += 1
        else:
            values.append(encode(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"note {i}: open the file")))
            good_ids.add(point_id(f"d{i}", 0))
    _publish(settings, topic, values)
    store = memory_store()
    with RunningWorker(settings, make_engine(tiny_bert_dir), store, lanes=("bulk",)):
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(good_ids), 600, "good events")
        letters = read_dead_letters(settings, poison, timeout_s=60)
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(values), 60, "offsets committed")
    assert poison == 100 and len(letters) == poison
    assert {l.error.code for l in letters} == {"malformed_json", "invalid_event", "empty_text"}
    assert {p.id for p in store.scroll("docs")} == good_ids


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_9_mid_batch_then_restart_indexes_every_chunk_once(kafka_bootstrap, tmp_path):
    import signal

    from embedstream.vectorstore.edge_store import EdgeStore

    settings = isolated_settings(kafka_bootstrap, "kill9")
    ensure_topics(settings.kafka, partitions=2)
    topic, group = settings.kafka.topic_chunks_bulk, settings.kafka.group_bulk
    events = _chunk_events(600, "k")
    _publish(settings, topic, [encode(e) for e in events])
    store_path = tmp_path / "edge"  # the embedded store: owned by the worker process while it runs
    progress = _GroupProgress(settings, topic, group)
    log_path = tmp_path / "workers.log"
    first = _spawn_worker(settings, store_path, _free_port(), log_path)
    try:
        # the first batch is committed: the worker is now embedding the next one
        wait_for(lambda: first.poll() is not None or progress.committed() > 0, 120, "the first commit")
        assert first.poll() is None, log_path.read_text()[-3000:]
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        committed_at_kill = progress.committed()
        assert 0 < committed_at_kill < len(events), committed_at_kill
        dead = EdgeStore(store_path)  # the owner lock died with the process
        written_at_kill = dead.count(settings.qdrant.collection)
        dead.close()
        assert committed_at_kill <= written_at_kill < len(events)  # committed implies written, not conversely
        print(f"\nkill -9: {committed_at_kill} committed, {written_at_kill} written of {len(events)}")

        metrics_port = _free_port()
        second = _spawn_worker(settings, store_path, metrics_port, log_path)
        try:
            wait_for(lambda: second.poll() is not None or progress.committed() == len(events), 120,
                     "committed offsets reaching the log end")
            assert second.poll() is None, log_path.read_text()[-3000:]
            assert progress.end() == len(events)
            # it resumed exactly at the committed offsets: the uncommitted tail, nothing more, nothing less
            # (chunks written but not yet committed at the kill are found unchanged, not embedded again)
            assert _chunks_handled(metrics_port) == len(events) - committed_at_kill
            print(f"restarted worker handled {len(events) - committed_at_kill}")
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0, log_path.read_text()[-3000:]
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(10)
        progress.close()
    store = EdgeStore(store_path)
    try:
        assert store.count(settings.qdrant.collection) == len(events)
        _assert_exactly(store.scroll(settings.qdrant.collection), events)
    finally:
        store.close()


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test alone (it gets restarted), on a free port pair and its own data dir."""
    import os

    from embedstream import devkafka

    port = int(os.environ.get("EMBEDSTREAM_TEST_KAFKA_RESTART_PORT", "0"))
    if not port:  # its own range of the run's port table (tests/ports.py)
        base = ports.port(ports.RESTART_BROKER)
        port = next(p for p in range(base, base + 40, 2)
                    if devkafka.port_free("127.0.0.1", p) and devkafka.port_free("127.0.0.1", p + 1))
    data_dir = str(tmp_path / "kafka-restart")
    info = devkafka.start(port=port, data_dir=data_dir)
    yield port, data_dir, info.bootstrap
    devkafka.stop(port=port, data_dir=data_dir)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_broker_restart_while_producing_and_consuming_loses_nothing(own_broker, minilm_engine):
    from embedstream import devkafka

    port, data_dir, bootstrap = own_broker
    settings = isolated_settings(bootstrap, "restart")
    ensure_topics(settings.kafka, partitions=2)
    topic = settings.kafka.topic_chunks_bulk
    events = _chunk_events(400, "r")
    store = memory_store()
    collection = settings.qdrant.collection
    count = lambda: store.count(collection) if store.collection_exists(collection) else 0  # noqa: E731
    producer = _SteadyProducer(settings, topic, [encode(e) for e in events], rate_per_s=25)
    running = RunningWorker(settings, minilm_engine, store, lanes=("bulk",))
    with running as worker:
        producer.thread.start()
        wait_for(lambda: count() >= 50, 60, "the worker indexing")
        started = time.monotonic()
        devkafka.stop(port=port, data_dir=data_dir)  # clean stop; producer and worker keep going
        # down for longer than the clients' 30 s request timeout: commits and sends time out meanwhile
        time.sleep(_BROKER_DOWN_S)
        devkafka.start(port=port, data_dir=data_dir)
        restart_s = time.monotonic() - started
        produced_during = producer.sent
        producer.thread.join(180)
        assert producer.error is None, repr(producer.error)
        assert running.thread.is_alive(), "the worker died during the broker restart"
        wait_for(lambda: count() == len(events), 120, "every chunk indexed after the restart")
        end = _committed_to_the_end(settings, topic, settings.kafka.group_bulk)
        assert running.thread.is_alive()
        print(f"\nbroker restart took {restart_s:.1f} s at {produced_during}/{len(events)} produced; "
              f"{producer.resent} sends retried; log end {end}; embedded {worker.metrics.texts.labels(lane='bulk', kind='chunk')._value.get():.0f}")
    assert end >= len(events)  # a retried send may have landed twice: the sink absorbs it
    _assert_exactly(store.scroll(collection), events)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_second_worker_joins_and_leaves_mid_stream_loses_nothing(kafka_bootstrap, minilm_engine):
    from embedstream.engine.engine import Engine

    settings = isolated_settings(kafka_bootstrap, "rebalance")
    ensure_topics(settings.kafka, partitions=4)
    topic = settings.kafka.topic_chunks_bulk
    events = _chunk_events(480, "b")
    store = memory_store()  # one locked store shared by both workers
    collection = settings.qdrant.collection
    count = lambda: store.count(collection) if store.collection_exists(collection) else 0  # noqa: E731
    embedded = lambda w: w.metrics.texts.labels(lane="bulk", kind="chunk")._value.get()  # noqa: E731
    producer = _SteadyProducer(settings, topic, [encode(e) for e in events], rate_per_s=30)
    first = RunningWorker(settings, minilm_engine, store, lanes=("bulk",))
    second = RunningWorker(settings, Engine.from_name("all-MiniLM-L6-v2"), store, lanes=("bulk",))
    with first as one:
        producer.thread.start()
        wait_for(lambda: count() >= 60, 60, "the first worker indexing")
        joined_at = producer.sent
        with second as two:  # joins: the group rebalances the 4 partitions over both
            wait_for(lambda: len(two.lanes["bulk"].consumer.assignment()) > 0 and embedded(two) >= 80, 60,
                     "the second worker taking partitions and indexing")
            assert 0 < len(one.lanes["bulk"].consumer.assignment()) < 4
        # the second worker stopped and left the group mid-stream: its partitions go back to the first
        left_at = producer.sent
        assert left_at < len(events), "the second worker should leave while events are still produced"
        producer.thread.join(120)
        assert producer.error is None, repr(producer.error)
        wait_for(lambda: count() == len(events), 120, "every chunk indexed")
        end = _committed_to_the_end(settings, topic, settings.kafka.group_bulk)
        assert first.thread.is_alive(), "the first worker died in a rebalance"
        assert len(one.lanes["bulk"].consumer.assignment()) == 4
        print(f"\njoined at {joined_at}, left at {left_at} of {len(events)} produced; embedded "
              f"{embedded(one):.0f} + {embedded(two):.0f} (redelivered {embedded(one) + embedded(two) - end:.0f})")
    assert end == len(events)
    _assert_exactly(store.scroll(collection), events)
