"""Fault tolerance on the real broker: Qdrant outages and poison streams lose nothing.

Each test ends with an exact count of points and ids in the store, and checks committed offsets.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from test_pipeline_kafka import RunningWorker

from producers.publisher import ensure_topics
from schemas import ChunkEvent
from schemas.codec import encode
from workers.sink import point_id

pytestmark = pytest.mark.kafka


class FlakyStore:
    """The real in-memory store, except that writes fail while ``down`` is set (an outage)."""

    def __init__(self, store):
        self.store = store
        self.down = False
        self.failed_writes = 0

    def upsert(self, *args, **kwargs):
        if self.down:
            self.failed_writes += 1
            raise ConnectionError("qdrant unavailable (simulated outage)")
        return self.store.upsert(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def _committed(settings, topic: str, group: str) -> int:
    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
    total = sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in consumer.partitions_for_topic(topic))
    consumer.close()
    return total


def _publish(settings, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all", linger_ms=5)
    for i, value in enumerate(values):
        producer.send(topic, key=f"k{i % 17}".encode(), value=value)
    producer.flush()
    producer.close()


def test_qdrant_outage_stops_commits_then_resumes_without_loss(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "outage")
    ensure_topics(settings.kafka, partitions=2)
    topic = settings.kafka.topic_chunks_bulk
    events = [ChunkEvent(doc_id=f"doc{i // 3}", chunk_id=i % 3, text=f"chunk {i} on reading files") for i in range(120)]
    _publish(settings, topic, [encode(e) for e in events])
    store = FlakyStore(memory_store())
    store.down = True
    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)) as worker:
        worker.options.sink_backoff_s = (0.1, 0.5)
        wait_for(lambda: store.failed_writes >= 3, 120, "failed writes during the outage")
        assert _committed(settings, topic, settings.kafka.group_bulk) == 0  # nothing done, nothing committed
        assert worker.metrics.sink_failures._value.get() >= 3
        store.down = False
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(events), 120, "all points")
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(events), 60, "offsets committed")
    assert {p.id for p in store.scroll("docs")} == {point_id(e.doc_id, e.chunk_id) for e in events}


@pytest.mark.slow
def test_one_percent_poison_in_ten_thousand_events(kafka_bootstrap, minilm_engine):
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
    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)):
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(good_ids), 600, "good events")
        letters = read_dead_letters(settings, poison, timeout_s=60)
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(values), 60, "offsets committed")
    assert poison == 100 and len(letters) == poison
    assert {l.error.code for l in letters} == {"malformed_json", "invalid_event", "empty_text"}
    assert {p.id for p in store.scroll("docs")} == good_ids


# -- crashes, broker restarts and rebalances ---------------------------------------------------------
# Each test publishes N short chunks (about 35 tokens each), breaks something while they are being
# embedded, then waits until the group's committed offsets reach the log end and checks the store
# holds exactly the N expected point ids, each (doc_id, chunk_id) once.

_VOCAB = ("open read write close file path buffer stream line byte encoding text mode seek tell flush "
          "directory socket pipe lock").split()


def _chunk_events(n: int, prefix: str) -> list[ChunkEvent]:
    return [ChunkEvent(doc_id=f"{prefix}{i // 4}", chunk_id=i % 4,
                       text=f"chunk {i}: " + " ".join(_VOCAB[(i * 7 + j * 3) % len(_VOCAB)] for j in range(30)))
            for i in range(n)]


class _GroupProgress:
    """A group's committed offsets on one topic, summed over partitions, from one long-lived client."""

    def __init__(self, settings, topic: str, group: str):
        self.consumer = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
        self.partitions = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic))]

    def committed(self) -> int:
        return sum(self.consumer.committed(tp, timeout_ms=10_000) or 0 for tp in self.partitions)

    def end(self) -> int:
        return sum(self.consumer.end_offsets(self.partitions).values())

    def close(self) -> None:
        self.consumer.close()


def _assert_exactly(points, events) -> None:
    """Exactly the expected ids, and every (doc_id, chunk_id) exactly once."""
    from collections import Counter

    pairs = Counter((p.payload["doc_id"], p.payload["chunk_id"]) for p in points)
    assert len(points) == len(events)
    assert {p.id for p in points} == {point_id(e.doc_id, e.chunk_id) for e in events}
    assert set(pairs) == {(e.doc_id, e.chunk_id) for e in events}
    assert max(pairs.values()) == 1


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _chunks_handled(metrics_port: int) -> float:
    """Chunk records a worker process finished, scraped from its /metrics: embedded and written
    (embedstream_texts_total{kind="chunk"}) plus found already written (embedstream_chunks_unchanged_total)."""
    import re
    import urllib.request

    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    embedded = re.findall(r'^embedstream_texts_total\{[^}]*kind="chunk"[^}]*\} (\S+)$', body, re.M)
    unchanged = re.findall(r'^embedstream_chunks_unchanged_total\{[^}]*\} (\S+)$', body, re.M)
    return sum(float(v) for v in embedded + unchanged)


def _spawn_worker(settings, store_path, metrics_port: int, log_path):
    """`embedstream worker embed --lanes bulk` as a real process, configured by EMBEDSTREAM_* variables."""
    import os
    import subprocess
    import sys

    k = settings.kafka
    env = dict(os.environ)
    env.update({
        "EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers,
        "EMBEDSTREAM_KAFKA__TOPIC_CHUNKS_BULK": k.topic_chunks_bulk,
        "EMBEDSTREAM_KAFKA__TOPIC_DEAD_LETTERS": k.topic_dead_letters,
        "EMBEDSTREAM_KAFKA__GROUP_BULK": k.group_bulk,
        # the killed worker's partitions move after 6 s instead of the client's default 45 s
        "EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS": "6000",
        "EMBEDSTREAM_QDRANT__PATH": str(store_path),
        "TOKENIZERS_PARALLELISM": "false",
    })
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", "bulk",
                             "--metrics-port", str(metrics_port)],
                            env=env, cwd=str(store_path.parent), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)


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
    if not port:
        port = next(p for p in range(19392, 19792, 2)
                    if devkafka._port_free("127.0.0.1", p) and devkafka._port_free("127.0.0.1", p + 1))
    data_dir = str(tmp_path / "kafka-restart")
    info = devkafka.start(port=port, data_dir=data_dir)
    yield port, data_dir, info.bootstrap
    devkafka.stop(port=port, data_dir=data_dir)


_BROKER_DOWN_S = 35


class _SteadyProducer:
    """Publishes events at a steady rate in a thread, through outages: every send is retried until acked."""

    def __init__(self, settings, topic: str, values: list[bytes], rate_per_s: float):
        import threading

        self.settings, self.topic, self.values, self.interval = settings, topic, values, 1 / rate_per_s
        self.sent = 0
        self.resent = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _send(self, producer, i: int):
        from kafka.errors import KafkaTimeoutError

        while True:  # send() blocks while the broker is away and gives up after max_block_ms: try again
            try:
                return producer.send(self.topic, key=f"k{i % 17}".encode(), value=self.values[i])
            except KafkaTimeoutError:
                continue

    def _run(self) -> None:
        from kafka.errors import KafkaTimeoutError

        try:
            producer = KafkaProducer(**self.settings.kafka.client_kwargs(), acks="all", linger_ms=5,
                                     max_block_ms=10_000)
            pending = {}
            for i in range(len(self.values)):
                pending[i] = self._send(producer, i)
                self.sent = i + 1
                time.sleep(self.interval)
            deadline = time.monotonic() + 150
            while pending and time.monotonic() < deadline:
                try:
                    producer.flush(timeout=5)
                except KafkaTimeoutError:
                    pass
                for i, future in list(pending.items()):
                    if future.succeeded():
                        del pending[i]
                    elif future.failed():  # expired or rejected while the broker was away: send it again
                        self.resent += 1
                        pending[i] = self._send(producer, i)
            assert not pending, f"{len(pending)} sends never acknowledged"
            producer.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


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
        progress = _GroupProgress(settings, topic, settings.kafka.group_bulk)
        try:
            wait_for(lambda: progress.committed() == progress.end(), 60, "committed offsets reaching the log end")
            end = progress.end()
        finally:
            progress.close()
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
            wait_for(lambda: len(two.consumers["bulk"].assignment()) > 0 and embedded(two) >= 80, 60,
                     "the second worker taking partitions and indexing")
            assert 0 < len(one.consumers["bulk"].assignment()) < 4
        # the second worker stopped and left the group mid-stream: its partitions go back to the first
        left_at = producer.sent
        assert left_at < len(events), "the second worker should leave while events are still produced"
        producer.thread.join(120)
        assert producer.error is None, repr(producer.error)
        wait_for(lambda: count() == len(events), 120, "every chunk indexed")
        progress = _GroupProgress(settings, topic, settings.kafka.group_bulk)
        try:
            wait_for(lambda: progress.committed() == progress.end(), 60, "committed offsets reaching the log end")
            end = progress.end()
        finally:
            progress.close()
        assert first.thread.is_alive(), "the first worker died in a rebalance"
        assert len(one.consumers["bulk"].assignment()) == 4
        print(f"\njoined at {joined_at}, left at {left_at} of {len(events)} produced; embedded "
              f"{embedded(one):.0f} + {embedded(two):.0f} (redelivered {embedded(one) + embedded(two) - end:.0f})")
    assert end == len(events)
    _assert_exactly(store.scroll(collection), events)


@pytest.mark.timeout(120)
def test_finished_work_is_committed_when_partitions_are_revoked(kafka_bootstrap, minilm_engine):
    """A rebalance while finished work is not yet committed: the revocation commits it, the loop survives.

    The worker's steps are driven by hand so the revocation lands exactly between the sink write and
    the commit (in production: a query answered or a record dead-lettered inside the online
    batching window, just before the poll that joins a rebalance).
    """
    import threading

    from workers.runtime import build_embed_worker

    settings = isolated_settings(kafka_bootstrap, "revoke")
    ensure_topics(settings.kafka, partitions=2)
    topic, group = settings.kafka.topic_chunks_bulk, settings.kafka.group_bulk
    events = _chunk_events(40, "v")
    _publish(settings, topic, [encode(e) for e in events])
    store = memory_store()
    worker = build_embed_worker(settings, ("bulk",), store=store, engine=minilm_engine)
    other = None
    progress = _GroupProgress(settings, topic, group)
    try:
        consumer = worker.consumers["bulk"]
        end = time.monotonic() + 60
        while (not consumer.assignment() or len(worker.queues["bulk"]) < len(events)) and time.monotonic() < end:
            worker._poll("bulk", 200)
        assert len(worker.queues["bulk"]) == len(events)
        while batch := worker._next_batch():
            worker._process(batch)  # written to the store, not committed yet
        assert store.count(settings.qdrant.collection) == len(events) and progress.committed() == 0
        other = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
        other.subscribe([topic])
        joined = threading.Event()

        def second_member() -> None:  # a second worker joining the group: the group rebalances
            while not joined.is_set():
                other.poll(timeout_ms=200)

        member = threading.Thread(target=second_member, daemon=True)
        member.start()
        end = time.monotonic() + 60
        while len(consumer.assignment()) != 1 and time.monotonic() < end:
            worker._poll("bulk", 200)  # the revocation happens inside this poll
        joined.set()
        member.join(10)
        assert len(consumer.assignment()) == 1
        assert progress.committed() == len(events), "finished work was not committed on revocation"
    finally:
        if other is not None:
            other.close()
        progress.close()
        worker.close()
