"""The dev cluster itself: three nodes answering, one bootstrap list, the project's topics replicated 3 times
with min.insync.replicas 2, and a write acknowledged while one node is down."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import isolated_settings

from embedstream import devkafka
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import all_topics, ensure_topics
from embedstream.schemas import ChunkEvent

pytestmark = pytest.mark.usefixtures("healed")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "embedstream.cli", "dev", "kafka", *args],
                          capture_output=True, text=True, timeout=180)


def test_three_nodes_one_bootstrap_list(cluster):
    expected = ",".join(f"127.0.0.1:{cluster.port + 2 * i}" for i in range(3))
    assert cluster.bootstrap == expected
    state = devkafka.status(port=cluster.port, data_dir=cluster.data_dir)
    assert state["answering"] and state["brokers"] == 3 and state["bootstrap"] == expected
    assert [n["answering"] for n in state["nodes"]] == [True, True, True]
    assert len({n["data_dir"] for n in state["nodes"]}) == 3

    started = _cli("start", "--brokers", "3", "--port", str(cluster.port), "--data-dir", cluster.data_dir)
    assert started.returncode == 0, started.stderr
    assert expected in started.stdout  # running nodes reused; the list printed
    status = _cli("status", "--port", str(cluster.port), "--data-dir", cluster.data_dir)
    assert status.returncode == 0 and json.loads(status.stdout)["brokers"] == 3


def test_project_topics_get_three_replicas_two_in_sync(cluster):
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    settings = isolated_settings(cluster.bootstrap, "rf")
    ensure_topics(settings.kafka)
    admin = KafkaAdminClient(**settings.kafka.client_kwargs())
    try:
        topics = all_topics(settings.kafka)
        for topic in admin.describe_topics(topics):
            assert {len(p["replica_nodes"]) for p in topic["partitions"]} == {3}, topic["name"]
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
        found = {name: {key: _value(data) for key, data in entries.items()}
                 for by_name in described.values() for name, entries in by_name.items()}
        assert {found[t]["min.insync.replicas"] for t in topics} == {"2"}
        assert found[settings.kafka.topic_documents]["cleanup.policy"] == "compact"
    finally:
        admin.close()


def test_a_publish_is_acknowledged_with_one_node_down(cluster):
    settings = isolated_settings(cluster.bootstrap, "down")
    topic = settings.kafka.topic_chunks_bulk
    ensure_topics(settings.kafka, topics=[topic, settings.kafka.topic_documents])
    node = cluster.control.node_leading_most([topic])
    cluster.control.kill(node)
    with ChunkPublisher(settings.kafka, lane="bulk", create_topics=False) as publisher:
        for i in range(50):
            publisher.publish_chunk(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"chunk {i}"))
        publisher.flush(120)  # acks=all: two in-sync replicas suffice (min.insync.replicas 2)
    from fault_rig import _GroupProgress

    progress = _GroupProgress(settings, topic, "nobody")
    try:
        assert progress.end() == 50
    finally:
        progress.close()


def _value(data):
    return data.get("value") if isinstance(data, dict) else data
