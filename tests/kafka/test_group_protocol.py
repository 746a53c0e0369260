"""The dev broker (Kafka 4.2) serves KIP-848's consumer group protocol, so the default reaches the lanes."""

from __future__ import annotations

import pytest

from embedstream.config import KafkaSettings
from embedstream.kafka_access import check_kafka_access
from embedstream.workers.transport.kafka_io import with_served_group_protocol

pytestmark = pytest.mark.kafka


def test_the_dev_broker_serves_the_consumer_group_protocol(kafka_bootstrap):
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    access = check_kafka_access(kafka, timeout_s=20)
    assert access.brokers and "consumer" in access.group_protocols  # the coordinator's rebalance protocols
    assert with_served_group_protocol(kafka, access.group_protocols).group_protocol == "consumer"


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
def test_the_rerankers_probe_counts_members_of_either_protocol(kafka_bootstrap, protocol):
    """The search lane hands reranks on only while the rerank group has members: a KIP-848 group (the
    default) must count, not only a classic one (the classic DescribeGroups says "not a classic group")."""
    import time
    import uuid

    from confluent_kafka import Consumer

    from embedstream.producers.topics import ensure_topics
    from embedstream.workers.vector_search import RerankersProbe

    name = f"probe-{protocol}-{uuid.uuid4().hex[:6]}"
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, group_rerank=name, topic_rerank=name)
    ensure_topics(kafka, topics=[name], partitions=2)
    assert not RerankersProbe(kafka, ttl_s=0).running()  # no member yet
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": name, "group.protocol": protocol})
    try:
        consumer.subscribe([name])
        end = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < end:
            consumer.poll(0.5)
        assert consumer.assignment(), "the member never joined"
        probe = RerankersProbe(kafka, ttl_s=0)
        assert probe.running()
        probe.close()
    finally:
        consumer.close()
