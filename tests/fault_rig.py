"""Helpers of the fault tests: a store that fails on demand, publishing, committed offsets, a worker
in its own process, a steady producer."""

from __future__ import annotations

import time

from conftest import wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from embedstream.schemas import ChunkEvent
from embedstream.workers.sink import point_id


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


class OutageStore:
    """The real in-memory store behind a switch: ``refuse()`` makes every call raise a connection error (a
    crashed server), ``hang()`` makes every call block until ``restore()`` (a server that stopped answering)."""

    def __init__(self, store):
        import threading

        self.store = store
        self.mode: str | None = None
        self.calls_in_outage = 0
        self._answering = threading.Event()
        self._answering.set()

    def refuse(self) -> None:
        self.mode = "refuse"

    def hang(self) -> None:
        self.mode = "hang"
        self._answering.clear()

    def restore(self) -> None:
        self.mode = None
        self._answering.set()

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.mode is not None:
                self.calls_in_outage += 1
                if self.mode == "refuse":
                    raise ConnectionRefusedError(111, "Connection refused (simulated crashed qdrant)")
                self._answering.wait()
            return attr(*args, **kwargs)

        return call

    @property
    def raw(self):
        """The store itself, around the switch (for the test's own counts)."""
        return self.store


def _committed(settings, topic: str, group: str) -> int:
    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
    total = sum(consumer.committed(TopicPartition(topic, p)) or 0 for p in consumer.partitions_for_topic(topic))
    consumer.close()
    return total


def counting_settings(bootstrap: str, name: str):
    """A fault test's settings with ``skip_unchanged`` off: a redelivered chunk is embedded again and counted
    (``embedstream_texts_total``), so "nothing processed twice" is checked per record. With it on, a redelivery
    is a lookup that finds the point unchanged, and the store's deterministic point ids hide the duplicate."""
    from conftest import isolated_settings

    settings = isolated_settings(bootstrap, name)
    settings.worker.skip_unchanged = False
    return settings


def _publish(settings, topic: str, values: list[bytes]) -> None:
    """Every value published with the project's producer settings (librdkafka, acks=all, idempotent: a retry
    neither duplicates nor reorders), every send checked: a record the broker did not take fails the test here,
    not as a "lost" chunk later (the kafka-python producer before: futures never looked at)."""
    from confluent_kafka import Producer

    failed: list = []
    producer = Producer(settings.kafka.producer_config(**{"linger.ms": 5}))
    for i, value in enumerate(values):
        producer.produce(topic, key=f"k{i % 17}".encode(), value=value,
                         on_delivery=lambda error, _m: error is not None and failed.append(error))
        producer.poll(0)
    left = producer.flush(180)
    assert left == 0 and not failed, f"{left} unacknowledged, {len(failed)} refused of {len(values)}: {failed[:3]}"


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


def _committed_to_the_end(settings, topic: str, group: str, timeout_s: float = 60) -> int:
    """Wait until the group's committed offsets reach the log end; returns that end."""
    progress = _GroupProgress(settings, topic, group)
    try:
        wait_for(lambda: progress.committed() == progress.end(), timeout_s, "committed offsets reaching the log end")
        return progress.end()
    finally:
        progress.close()


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
    (embedstream_texts_total{kind="chunk"}) plus those needing no forward pass (embedstream_forward_passes_avoided_total)."""
    import re
    import urllib.request

    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    embedded = re.findall(r'^embedstream_texts_total\{[^}]*kind="chunk"[^}]*\} (\S+)$', body, re.M)
    return sum(float(v) for v in embedded)  # every record embedded: the workers run with skip_unchanged off


def _spawn_worker(settings, store_path, metrics_port: int, log_path):
    """`embedstream worker embed --lanes bulk` as a real process, configured by EMBEDSTREAM_* variables."""
    import os
    import subprocess
    import sys

    from process_rig import popen

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
        "EMBEDSTREAM_WORKER__SKIP_UNCHANGED": str(settings.worker.skip_unchanged).lower(),
        "TOKENIZERS_PARALLELISM": "false",
    })
    log = open(log_path, "ab")
    return popen([sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", "bulk",
                  "--metrics-port", str(metrics_port)],
                 env=env, cwd=str(store_path.parent), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


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
