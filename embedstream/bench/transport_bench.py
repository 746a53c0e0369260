"""`embedstream bench transport`: one request-reply round trip through the broker, per Kafka client.

A client sends a small record and waits for its echo; the echo is another process that consumes the
request topic and produces to the reply topic (a worker with no model). Each pair of clients
(kafka-python or librdkafka on either side) answers the same number of requests, one at a time, with
a gap between them (an online lane's traffic, not a throughput test). Why it exists: the online path
is two such trips, and an online query's whole budget is 30 ms.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass

LIBS = ("kafka-python", "librdkafka")
_READY = "ready"


@dataclass
class TransportRow:
    client: str
    server: str
    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    lost: int


class _Kafka:
    """A consumer of one topic (assigned all its partitions at their end) and a producer, in either library."""

    def __init__(self, lib: str, bootstrap: str, topic: str):
        self.lib = lib
        if lib == "kafka-python":
            from kafka import KafkaConsumer, KafkaProducer, TopicPartition

            self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=10, enable_auto_commit=False)
            parts = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic) or [0])]
            self.consumer.assign(parts)
            self.consumer.seek_to_end()
            for tp in parts:
                self.consumer.position(tp)
            self.producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1, enable_idempotence=False)
        else:
            from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

            self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"transport-{uuid.uuid4().hex}",
                                      "enable.auto.commit": False, "fetch.wait.max.ms": 10})
            meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
            self.consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in sorted(meta.partitions)])
            self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": 1,
                                      "socket.nagle.disable": True})

    def poll(self, timeout_s: float) -> list[bytes]:
        if self.lib == "kafka-python":
            return [r.value for records in self.consumer.poll(timeout_ms=int(timeout_s * 1000)).values() for r in records]
        first = self.consumer.poll(timeout_s)
        if first is None:
            return []
        return [m.value() for m in [first, *self.consumer.consume(100, 0)] if m.error() is None]

    def send(self, topic: str, value: bytes) -> None:
        if self.lib == "kafka-python":
            self.producer.send(topic, value)
        else:
            self.producer.produce(topic, value)
            self.producer.poll(0)

    def close(self) -> None:
        self.consumer.close()
        if self.lib == "kafka-python":
            self.producer.close(timeout=5)
        else:
            self.producer.flush(5)


def echo(lib: str, bootstrap: str, requests: str, replies: str, seconds: float) -> None:
    """The server side: every request straight back on the reply topic, until ``seconds`` pass."""
    kafka = _Kafka(lib, bootstrap, requests)
    kafka.poll(0.5)  # the assignment's end offsets resolved before the client starts
    print(_READY, flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for value in kafka.poll(0.1):
            kafka.send(replies, value)
    kafka.close()


def _one_pair(client: str, server: str, bootstrap: str, count: int, gap_s: float, warmup: int) -> TransportRow:
    from embedstream.config import KafkaSettings
    from embedstream.producers.topics import ensure_topics

    prefix = f"transport-{uuid.uuid4().hex[:6]}"
    requests, replies = f"{prefix}.requests", f"{prefix}.replies"
    ensure_topics(KafkaSettings(bootstrap_servers=bootstrap), 1, topics=[requests, replies])
    seconds = (count + warmup) * (gap_s + 0.05) + 60
    proc = subprocess.Popen([sys.executable, "-m", "embedstream.bench.transport_bench", server, bootstrap, requests,
                             replies, str(seconds)], stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != _READY:
            raise RuntimeError(f"the {server} echo did not start")
        kafka = _Kafka(client, bootstrap, replies)
        times, lost = [], 0
        for i in range(count + warmup):
            key = f"{i}-{uuid.uuid4().hex}".encode()
            started = time.perf_counter()
            kafka.send(requests, key)
            while key not in kafka.poll(0.05):
                if time.perf_counter() - started > 5:
                    lost += 1
                    break
            else:
                if i >= warmup:
                    times.append((time.perf_counter() - started) * 1000)
            time.sleep(gap_s)
        kafka.close()
    finally:
        proc.terminate()
        proc.wait(10)
    times.sort()
    at = lambda q: times[min(len(times) - 1, int(q * len(times)))] if times else float("nan")  # noqa: E731
    return TransportRow(client, server, len(times), statistics.median(times) if times else float("nan"),
                        at(0.95), at(0.99), lost)


def run(port: int, count: int = 200, gap_ms: float = 20.0, warmup: int = 30) -> list[TransportRow]:
    """Every client × server pair in turn against one broker (started if none answers on ``port``)."""
    from embedstream import devkafka

    bootstrap = devkafka.start(port=port).bootstrap
    return [_one_pair(client, server, bootstrap, count, gap_ms / 1000, warmup) for client in LIBS for server in LIBS]


def print_table(rows: list[TransportRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    from embedstream.bench.latency_bench import cpu_line

    base = next((r.p50_ms for r in rows if r.client == r.server == "kafka-python"), None)
    table = Table(title="bench transport: one request-reply round trip through the broker (echo in another process)")
    for column in ("client", "echo server", "round trips", "p50 ms", "p95 ms", "p99 ms", "lost", "p50 vs kafka-python"):
        table.add_column(column)
    for r in rows:
        table.add_row(r.client, r.server, str(r.count), f"{r.p50_ms:.2f}", f"{r.p95_ms:.2f}", f"{r.p99_ms:.2f}",
                      str(r.lost), f"{base / r.p50_ms:.2f}x" if base else "")
    console = Console(width=120)
    console.print(cpu_line())
    console.print(table)


if __name__ == "__main__":
    echo(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    os._exit(0)
