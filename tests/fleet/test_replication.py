"""Replication that stays what was asked (issue #41), on real 3-broker clusters: a topic created while a broker
is down is never created with fewer replicas (the controller places the third on the registered broker that is
down; where it cannot, too few brokers registered, creation waits for the broker or fails naming the topic, the
factor and the brokers alive), and the project's topics below the settings are reported by `embedstream dev
kafka status` and by a worker's /readyz (reported, readiness unchanged).

Before the fix, ensure_topics counted the brokers the cluster listed: with one of three never registered it
created the topic with replication factor 2 and min.insync.replicas 1, for good, and nothing looked at existing
topics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import ports
import pytest
from conftest import isolated_settings, wait_for
from process_rig import http_status, popen

from embedstream.producers.topics import TopicsError, ensure_topics, replication_report

def _topic_state(settings, topic: str):
    (found,) = replication_report(settings.kafka, [topic])
    return found.replicas, found.min_insync


def _exists(settings, topic: str) -> bool:
    return replication_report(settings.kafka, [topic]) != []


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("healed")
def test_a_topic_created_while_a_broker_is_down_gets_every_replica(cluster):
    """Kafka 4's controller places the third replica on the registered broker that is down; it catches up on its
    return. Three copies, two in sync: writes go on, nothing is created smaller."""
    settings = isolated_settings(cluster.bootstrap, "rfdown")
    k = settings.kafka
    ensure_topics(k, topics=[k.topic_dead_letters])
    node = cluster.control.node_leading_most([k.topic_dead_letters])
    cluster.control.kill(node)
    wait_for(lambda: len(_brokers(settings)) == 2, 120, "the killed node fenced")  # broker.session.timeout.ms, 9 s
    assert ensure_topics(k, topics=[k.topic_chunks_bulk], timeout_s=60) == [k.topic_chunks_bulk]
    assert _topic_state(settings, k.topic_chunks_bulk) == (3, 2)
    cluster.control.start(node)
    cluster.control.wait_in_sync([k.topic_chunks_bulk])


def _late_cluster(port: int, root: Path, started: tuple[int, ...]) -> None:
    """Nodes ``started`` of a 3-node cluster; the others never started, so never registered (a broker down when
    the cluster formed, or a new one not up yet). Two of three voters are a quorum."""
    from embedstream.devkafka.broker import await_node, launch_node
    from embedstream.devkafka.cluster import cluster_overrides, node_layout, node_port
    from embedstream.devkafka.jars import kafka_version
    from embedstream.devkafka.storage import random_cluster_id, read_cluster_id, server_properties

    cluster_id = read_cluster_id(node_layout(root, 1)) or random_cluster_id()
    launched = {}
    for node in started:
        layout = node_layout(root, node)
        layout.root.mkdir(parents=True, exist_ok=True)
        config = server_properties("127.0.0.1", node_port(port, node), layout, cluster_overrides("127.0.0.1", port, node, 3))
        launched[node] = launch_node(layout, config, kafka_version(), None, host="127.0.0.1", port=node_port(port, node),
                                     cluster_id=cluster_id)
    for node, (pid, libs) in launched.items():
        await_node(pid, libs, "127.0.0.1", node_port(port, node), node_layout(root, node), 300, brokers=len(started))


@pytest.mark.timeout(900)
def test_a_topic_created_while_a_broker_never_registered_waits_for_it_or_fails_naming_why(tmp_path):
    """Fewer brokers registered than the factor: the controller cannot place three replicas. Before, the brokers
    alive were counted and the topic got replication factor 2 and min.insync.replicas 1, for good."""
    from embedstream import devkafka
    from embedstream.devkafka.cluster import node_port

    port, root = ports.port(ports.FLEET_LATE_CLUSTER), tmp_path / "late-cluster"
    _late_cluster(port, root, (1, 2))
    try:
        bootstrap = f"127.0.0.1:{node_port(port, 1)},127.0.0.1:{node_port(port, 2)}"
        settings = isolated_settings(bootstrap, "rflate")
        first, second = settings.kafka.topic_chunks_bulk, settings.kafka.topic_chunks_online
        started = time.monotonic()
        with pytest.raises(TopicsError) as short:
            ensure_topics(settings.kafka, topics=[first], timeout_s=5)
        message = str(short.value)
        assert short.value.code == "replication_unavailable" and short.value.retriable, message
        assert repr(first) in message and "replication factor 3" in message and "2 broker(s) alive (1, 2)" in message
        assert "offsets.topic.replication.factor=3" in message, message  # where the 3 comes from
        assert time.monotonic() - started < 60
        assert not _exists(settings, first)  # nothing created with fewer replicas

        created: list = []
        waiting = threading.Thread(target=lambda: created.extend(ensure_topics(settings.kafka, topics=[second],
                                                                               timeout_s=300)))
        waiting.start()
        time.sleep(3)
        assert waiting.is_alive() and not _exists(settings, second)  # waiting for the third broker
        _late_cluster(port, root, (3,))
        waiting.join(300)
        assert not waiting.is_alive() and created == [second]
        assert _topic_state(settings, second) == (3, 2)
        print(f"\nrefused after 5 s: {message}")
    finally:
        devkafka.stop(port=port, data_dir=root)


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
@pytest.mark.usefixtures("healed")
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
