"""A static member killed -9 under KIP-848: its replacement (the same group.instance.id) takes its partitions back
without waiting out the session.

Measured first (Kafka 4.2.2, librdkafka 2.16, group session 45 s): the consumer protocol's coordinator keeps the
dead member until its session expires and answers the replacement's first heartbeat UNRELEASED_INSTANCE_ID, which
librdkafka calls fatal (the replacement never consumed); under the classic protocol the replacement fenced the
old member and held its partitions 0.2 s after the kill. Refused so, a lane now removes the member holding its id
and joins again (``RdConsumer._take_over``, ``kafka_io.release_static_member``).
"""

from __future__ import annotations

import re
import signal
import time

import pytest
from conftest import isolated_settings
from process_rig import Service, command_env, http_status, wait_until
from worker_rig import free_port, publish_bulk_chunks

from embedstream.producers.topics import ensure_topics

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(420)]

SESSION_MS = 45_000  # a long session: waiting it out would be plain
WITHIN_S = 10.0  # the replacement consumes this soon after it is up


def _worker(settings, tmp_path, name: str, port: int) -> Service:
    """`embedstream worker embed --lanes bulk` as a static member (the id both workers share)."""
    k = settings.kafka
    (tmp_path / name).mkdir()
    env = command_env(tmp_path / name, k.bootstrap_servers, EMBEDSTREAM_KAFKA__TOPIC_CHUNKS_BULK=k.topic_chunks_bulk,
                      EMBEDSTREAM_KAFKA__TOPIC_DEAD_LETTERS=k.topic_dead_letters, EMBEDSTREAM_KAFKA__GROUP_BULK=k.group_bulk,
                      EMBEDSTREAM_KAFKA__GROUP_PROTOCOL="consumer", EMBEDSTREAM_KAFKA__SESSION_TIMEOUT_MS=str(SESSION_MS),
                      EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID=f"{k.group_bulk}-worker-1")
    return Service(["worker", "embed", "--lanes", "bulk", "--no-search", "--metrics-port", str(port)], env,
                   tmp_path / f"{name}.log")


def _chunks_handled(port: int) -> float:
    status, body = http_status(f"http://127.0.0.1:{port}/metrics", timeout_s=5)
    found = re.findall(r'^embedstream_texts_total\{[^}]*kind="chunk"[^}]*\} (\S+)$', body.decode(), re.M) if status else []
    return sum(float(v) for v in found)


def test_a_static_member_killed_minus_9_is_replaced_at_once(kafka_bootstrap, tmp_path):
    settings = isolated_settings(kafka_bootstrap, "static")
    ensure_topics(settings.kafka, partitions=2, topics=[settings.kafka.topic_chunks_bulk, settings.kafka.topic_dead_letters])
    first_port, second_port = free_port(), free_port()
    with _worker(settings, tmp_path, "first", first_port) as first:
        publish_bulk_chunks(settings, [f"chunk {i} before the kill" for i in range(4)])
        wait_until(lambda: _chunks_handled(first_port) == 4, 240, "the first worker consuming", (first,))
        first.proc.send_signal(signal.SIGKILL)  # no leave: the member stays in the group until its session expires
        first.proc.wait(10)
    killed = time.monotonic()
    with _worker(settings, tmp_path, "second", second_port) as second:
        wait_until(lambda: http_status(f"http://127.0.0.1:{second_port}/healthz", timeout_s=2)[0] != 0, 240,
                   "the replacement up", (second,))
        up = time.monotonic()
        publish_bulk_chunks(settings, [f"chunk {i} after the kill" for i in range(4)])
        try:
            wait_until(lambda: _chunks_handled(second_port) == 4, WITHIN_S, "the replacement consuming", (second,))
        except AssertionError:
            raise AssertionError(f"the replacement did not consume within {WITHIN_S:g} s of being up "
                                 f"({time.monotonic() - killed:.1f} s after the kill)\n{second.output()[-4000:]}") from None
        consumed = time.monotonic()
        assert second.alive(), second.output()[-4000:]
    print(f"replacement up {up - killed:.1f} s after the kill, consuming {consumed - up:.1f} s later "
          f"(session {SESSION_MS / 1000:g} s)")
    assert consumed - killed < SESSION_MS / 1000
