"""What a cluster asks of the project's configuration, without a broker: the dev cluster's node configs, the
topics' replication, every producer's acknowledgements, the consumer groups' rebalance protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedstream.config import KafkaSettings
from embedstream.devkafka.cluster import cluster_overrides, node_layout, node_port
from embedstream.devkafka.layout import Layout
from embedstream.devkafka.storage import server_properties
from embedstream.producers.topics import TopicsError, min_insync, replication_from, topic_configs
from embedstream.workers.transport.kafka_io import incremental, kafka_python_rebalancing, librdkafka_rebalancing


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))


def test_three_nodes_form_one_quorum_on_their_own_ports(tmp_path: Path):
    configs = [_props(server_properties("127.0.0.1", node_port(23692, n), node_layout(tmp_path, n),
                                        cluster_overrides("127.0.0.1", 23692, n, 3))) for n in (1, 2, 3)]
    assert [c["node.id"] for c in configs] == ["1", "2", "3"]
    assert {c["controller.quorum.voters"] for c in configs} == {"1@127.0.0.1:23693,2@127.0.0.1:23695,3@127.0.0.1:23697"}
    assert [c["advertised.listeners"] for c in configs] == [f"PLAINTEXT://127.0.0.1:{p}" for p in (23692, 23694, 23696)]
    assert len({c["log.dirs"] for c in configs}) == 3  # each node its own data dir
    for c in configs:  # every replicated thing: 3 copies, 2 in sync for a write to count
        assert c["default.replication.factor"] == c["offsets.topic.replication.factor"] == "3"
        assert c["transaction.state.log.replication.factor"] == "3"
        assert c["min.insync.replicas"] == c["transaction.state.log.min.isr"] == "2"
        assert c["unclean.leader.election.enable"] == "false"


def test_a_single_broker_keeps_one_replica(tmp_path: Path):
    props = _props(server_properties("127.0.0.1", 23092, Layout(tmp_path)))
    assert props["offsets.topic.replication.factor"] == props["default.replication.factor"] == "1"


@pytest.mark.parametrize(("default_rf", "offsets_rf", "replicas", "in_sync"),
                         [("1", "1", 1, 1), ("1", "3", 3, 2), ("3", "3", 3, 2), ("2", "1", 2, 1), ("5", "3", 5, 2)])
def test_topics_get_the_clusters_configured_replication(default_rf, offsets_rf, replicas, in_sync):
    """The larger of the cluster's default.replication.factor and offsets.topic.replication.factor: static configs,
    the same whichever broker is down (issue #41: it was the brokers alive, so RF 2 for good while one of 3 was down)."""
    settings = KafkaSettings()
    configs = {"default.replication.factor": default_rf, "offsets.topic.replication.factor": offsets_rf,
               "min.insync.replicas": "1"}
    wanted = replication_from(settings, configs)
    assert (wanted.replicas, wanted.min_insync) == (replicas, in_sync)
    assert min_insync(replicas) == in_sync
    assert topic_configs(settings, settings.topic_chunks_bulk, wanted).get("min.insync.replicas", "1") == str(in_sync)
    assert topic_configs(settings, settings.topic_documents, wanted)["cleanup.policy"] == "compact"
    # the settings win over the cluster
    assert replication_from(KafkaSettings(replication_factor=2), configs).replicas == 2
    assert replication_from(KafkaSettings(min_insync_replicas=1), configs).min_insync == 1


def test_replication_unreadable_is_the_brokers_default_and_a_min_insync_above_it_is_refused():
    unknown = replication_from(KafkaSettings(), None)  # no DescribeConfigs right: CreateTopics without a factor
    assert unknown.replicas is None and unknown.min_insync is None
    assert "min.insync.replicas" not in topic_configs(KafkaSettings(), "t", unknown)
    with pytest.raises(TopicsError, match="MIN_INSYNC_REPLICAS=3 is above the replication factor 2"):
        replication_from(KafkaSettings(replication_factor=2, min_insync_replicas=3), None)


def test_every_producer_waits_for_all_in_sync_replicas_idempotently():
    config = KafkaSettings(bootstrap_servers="a:1,b:2,c:3").producer_config(**{"linger.ms": 5})
    assert config["acks"] == "all" and config["enable.idempotence"] is True
    assert config["bootstrap.servers"] == "a:1,b:2,c:3" and config["linger.ms"] == 5


def test_kafka_python_bootstrap_list():
    assert KafkaSettings(bootstrap_servers="a:1,b:2").client_kwargs()["bootstrap_servers"] == ["a:1", "b:2"]


def test_rebalance_protocol_reaches_both_clients():
    consumer = KafkaSettings(group_protocol="consumer", session_timeout_ms=6000)
    assert librdkafka_rebalancing(consumer) == {"group.protocol": "consumer"}  # the session timeout is the broker's
    assert incremental(consumer)
    coop = KafkaSettings(group_protocol="cooperative-sticky", session_timeout_ms=6000)
    assert librdkafka_rebalancing(coop) == {"partition.assignment.strategy": "cooperative-sticky",
                                            "session.timeout.ms": 6000}
    assert kafka_python_rebalancing(coop)["partition_assignment_strategy"][0].name == "cooperative-sticky"
    assert kafka_python_rebalancing(consumer) == kafka_python_rebalancing(coop)  # no KIP-848 client in kafka-python
    eager = KafkaSettings(group_protocol="eager")
    assert kafka_python_rebalancing(eager) == {} and not incremental(eager)
    assert librdkafka_rebalancing(eager) == {"partition.assignment.strategy": "range,roundrobin"}


def test_the_consumer_protocol_needs_a_broker_that_serves_it():
    """KIP-848 is the default; a broker whose coordinator does not serve it (Kafka 3, or the protocol turned off) gets
    cooperative-sticky lanes instead of members that never join; not readable (no DescribeConfigs right): kept.
    Other choices are left as they are."""
    from embedstream.workers.transport.kafka_io import with_served_group_protocol

    kafka = KafkaSettings()
    assert kafka.group_protocol == "consumer"
    assert with_served_group_protocol(kafka, frozenset({"classic", "consumer"})) is kafka
    assert with_served_group_protocol(kafka, None) is kafka
    assert with_served_group_protocol(kafka, frozenset({"classic"})).group_protocol == "cooperative-sticky"
    eager = KafkaSettings(group_protocol="eager")
    assert with_served_group_protocol(eager, frozenset({"classic"})) is eager


def test_every_lane_defaults_to_librdkafka_on_the_consumer_protocol():
    """Issue #41: online, bulk and CDC lanes on librdkafka with KIP-848; kafka-python only when chosen."""
    kafka = KafkaSettings()
    assert (kafka.online_client, kafka.bulk_client, kafka.group_protocol) == ("librdkafka", "librdkafka", "consumer")
    assert KafkaSettings(bulk_client="kafka-python").bulk_client == "kafka-python"  # still a choice
