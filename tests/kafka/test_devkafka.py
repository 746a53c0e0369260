"""The local dev broker starts, serves clients, and keeps its data across stop/start.

Runs a private broker on a free non-default port with a tmp data dir, so it never
touches a developer's broker on 9092. First run also resolves the jars (~30 s with an
empty ~/.m2); afterwards each start is a JVM boot (~10-15 s on 2 cores).
"""

from __future__ import annotations

import shutil
import time
import uuid

import pytest

from embedstream import devkafka

import ports

kafka = pytest.importorskip("kafka")

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(300),  # generous: includes a possible first-time jar download
    pytest.mark.skipif(shutil.which("java") is None, reason="java not installed"),
]


def _free_port_pair() -> int:
    """First port p with p and p+1 both bindable (the broker uses p+1 for its controller).

    Starts above this run's shared broker (``EMBEDSTREAM_TEST_KAFKA_PORT`` and the next port), so
    parallel runs with their own ports do not race for the same pair.
    """
    start = ports.port(ports.DEVKAFKA)
    stop = start + 300
    for port in range(start, stop, 2):
        if all(_bindable(p) for p in (port, port + 1)):
            return port
    pytest.skip(f"no free port pair in {start}..{stop}")


def _bindable(port: int) -> bool:
    return devkafka.port_free("127.0.0.1", port)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    try:
        for value in values:
            producer.send(topic, value=value, key=value)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=5)


def _consume_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 30.0) -> list[bytes]:
    """Read the topic from the beginning until `expected` records arrived (or timeout)."""
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=10,
    )
    seen: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                seen.extend(r.value for r in records)
    finally:
        consumer.close()
    return seen


def test_start_produce_consume_stop_restart_keeps_data(tmp_path):
    port = _free_port_pair()
    data_dir = tmp_path / "kafka"
    topic = f"devkafka-{uuid.uuid4().hex[:8]}"
    values = [f"msg-{i}".encode() for i in range(5)]
    try:
        t0 = time.monotonic()
        info = devkafka.start(port=port, data_dir=data_dir)
        first_start_s = time.monotonic() - t0
        assert info.bootstrap == f"127.0.0.1:{port}"
        assert info.cluster_id
        assert devkafka.start(port=port, data_dir=data_dir).pid == info.pid  # idempotent

        state = devkafka.status(port=port, data_dir=data_dir)
        assert state["running"] and state["answering"]
        assert state["pid"] == info.pid
        assert state["bootstrap"] == info.bootstrap
        assert (data_dir / "broker.pid").is_file()

        _produce(info.bootstrap, topic, values)
        assert sorted(_consume_all(info.bootstrap, topic, len(values))) == values

        assert devkafka.stop(port=port, data_dir=data_dir) is True
        state = devkafka.status(port=port, data_dir=data_dir)
        assert not state["running"] and state["pid"] is None
        assert not (data_dir / "broker.pid").exists()
        assert devkafka.stop(port=port, data_dir=data_dir) is False  # already stopped

        t0 = time.monotonic()
        again = devkafka.start(port=port, data_dir=data_dir)
        warm_start_s = time.monotonic() - t0
        assert again.pid != info.pid
        assert again.cluster_id == info.cluster_id  # not reformatted
        assert sorted(_consume_all(again.bootstrap, topic, len(values))) == values
        print(f"\ndev broker start: first {first_start_s:.1f} s, restart {warm_start_s:.1f} s")
    finally:
        devkafka.stop(port=port, data_dir=data_dir)
    assert not devkafka.status(port=port, data_dir=data_dir)["running"]
