"""Replication that stays what was asked (issue #41), on the real 3-broker cluster: a topic created while a broker
is down is not created with fewer replicas (creation waits for the broker, or fails naming the topic, the factor
and the brokers alive), and the project's topics below the settings are reported by `embedstream dev kafka
status` and by a worker's /readyz (reported, readiness unchanged).

Before the fix, ensure_topics counted the brokers alive: with one of three down it created the topic with
replication factor 2 and min.insync.replicas 1, for good, and nothing looked at existing topics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import ports
import pytest
from conftest import isolated_settings, wait_for
from process_rig import http_status, popen

from embedstream.producers.topics import TopicsError, ensure_topics, replication_report

pytestmark = pytest.mark.usefixtures("healed")


def _topic_state(settings, topic: str):
    (found,) = replication_report(settings.kafka, [topic])
    return found.replicas, found.min_insync


def _exists(settings, topic: str) -> bool:
    return replication_report(settings.kafka, [topic]) != []


@pytest.mark.timeout(600)
def test_a_topic_created_while_a_broker_is_down_waits_for_it_or_fails_naming_why(cluster):
    settings = isolated_settings(cluster.bootstrap, "rfdown")
    first, second = settings.kafka.topic_chunks_bulk, settings.kafka.topic_chunks_online
    ensure_topics(settings.kafka, topics=[settings.kafka.topic_dead_letters])  # a topic on every node to pick one by
    node = cluster.control.node_leading_most([settings.kafka.topic_dead_letters])
    cluster.control.kill(node)
    # the cluster fences the dead node after broker.session.timeout.ms (9 s): until then it still counts as alive
    wait_for(lambda: len(_brokers(settings)) == 2, 120, "the killed node fenced")

    started = time.monotonic()
    with pytest.raises(TopicsError) as short:
        ensure_topics(settings.kafka, topics=[first], timeout_s=5)
    message = str(short.value)
    assert short.value.code == "replication_unavailable" and short.value.retriable, message
    assert repr(first) in message and "replication factor 3" in message and "2 broker(s) alive" in message, message
    assert "offsets.topic.replication.factor=3" in message, message  # where the 3 comes from
    assert 4 <= time.monotonic() - started < 60
    assert not _exists(settings, first)  # nothing created with fewer replicas

    created: list = []
    waiting = threading.Thread(target=lambda: created.extend(ensure_topics(settings.kafka, topics=[second],
                                                                           timeout_s=300)))
    waiting.start()
    time.sleep(3)
    assert waiting.is_alive() and not _exists(settings, second)  # still waiting for the third broker
    cluster.control.start(node)
    waiting.join(300)
    assert not waiting.is_alive() and created == [second]
    assert _topic_state(settings, second) == (3, 2)


def _brokers(settings) -> list[int]:
    from embedstream.producers.topics import _Admin

    return _Admin(settings.kafka).brokers(10)


def _env(settings) -> dict[str, str]:
    k = settings.kafka
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", EMBEDSTREAM_ENGINE__THREADS="1",
               EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS=k.bootstrap_servers)
    for field in type(k).model_fields:
        if field.startswith(("topic_", "group_")) and field not in ("group_instance_id", "group_protocol"):
            env[f"EMBEDSTREAM_KAFKA__{field.upper()}"] = getattr(k, field)
    return env


@pytest.mark.timeout(600)
def test_topics_below_the_settings_are_reported_by_status_and_readyz(cluster, tmp_path):
    settings = isolated_settings(cluster.bootstrap, "rfreport")
    k = settings.kafka
    ensure_topics(k, topics=[k.topic_dead_letters, k.topic_chunks_online])  # as asked: 3 and 2
    ensure_topics(k, topics=[k.topic_chunks_bulk], replication=2)  # made small on purpose (min.insync.replicas 1)
    assert _topic_state(settings, k.topic_chunks_bulk) == (2, 1)

    status = subprocess.run([sys.executable, "-m", "embedstream.cli", "dev", "kafka", "status", "--port",
                             str(cluster.port), "--data-dir", cluster.data_dir], capture_output=True, text=True,
                            timeout=180, env=_env(settings))
    assert status.returncode == 0, status.stderr
    state = json.loads(status.stdout)
    below = {t["topic"]: t for t in state["under_replicated"]}
    assert set(below) == {k.topic_chunks_bulk}, state
    assert below[k.topic_chunks_bulk] == {"topic": k.topic_chunks_bulk, "replicas": 2, "min_insync": 1,
                                          "wanted_replicas": 3, "wanted_min_insync": 2}

    port = ports.port(ports.FLEET_WORKERS) + 10
    log = tmp_path / "worker.log"
    env = dict(_env(settings), EMBEDSTREAM_QDRANT__PATH=str(tmp_path / "qdrant"))
    with open(log, "wb") as out:
        worker = popen([sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", "bulk", "--no-search",
                        "--metrics-port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def ready_body():
            assert worker.poll() is None, log.read_text()[-3000:]
            code, body = http_status(f"http://127.0.0.1:{port}/readyz", timeout_s=10)
            return json.loads(body) if code == 200 else None

        wait_for(lambda: (ready_body() or {}).get("under_replicated") is not None, 300, "the worker ready, with its report")
        body = ready_body()
        assert body["ready"] is True  # reported, not failing readiness
        assert [t["topic"] for t in body["under_replicated"]] == [k.topic_chunks_bulk], body
        code, metrics = http_status(f"http://127.0.0.1:{port}/metrics")
        assert code == 200 and b"embedstream_topics_under_replicated 1.0" in metrics
    finally:
        worker.terminate()
        worker.wait(60)
