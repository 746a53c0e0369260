"""The dev broker (Kafka 4.2) serves KIP-848's consumer group protocol, so the default reaches the lanes."""

from __future__ import annotations

import pytest

from embedstream.config import KafkaSettings
from embedstream.kafka_auth import CONSUMER_GROUP_HEARTBEAT, check_kafka_access
from embedstream.workers.kafka_io import with_served_group_protocol

pytestmark = pytest.mark.kafka


def test_the_dev_broker_serves_the_consumer_group_protocol(kafka_bootstrap):
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    apis = check_kafka_access(kafka, timeout_s=20)
    assert CONSUMER_GROUP_HEARTBEAT in apis and 18 in apis  # and ApiVersions itself
    assert with_served_group_protocol(kafka, apis).group_protocol == "consumer"
