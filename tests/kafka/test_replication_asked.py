"""Replication that stays what was asked (issue #41), on the single test broker: a replication factor the cluster
cannot give is refused with the reason, never lowered, and a worker whose lane cannot create its topic for that
reason goes on serving the topics that exist (it tries again later) instead of stopping."""

from __future__ import annotations

import time

import pytest
from conftest import isolated_settings, memory_store, wait_for
from worker_rig import RunningWorker

from embedstream.producers.query_client import QueryClient
from embedstream.producers.search_routing import query_topic
from embedstream.producers.topics import TopicsError, ensure_topics, replication_report

pytestmark = pytest.mark.kafka


def test_a_factor_the_cluster_cannot_give_is_refused_naming_why(kafka_bootstrap):
    settings = isolated_settings(kafka_bootstrap, "rf3")
    settings.kafka.replication_factor = 3
    started = time.monotonic()
    with pytest.raises(TopicsError) as refused:
        ensure_topics(settings.kafka, topics=[settings.kafka.topic_chunks_bulk], timeout_s=3)
    message = str(refused.value)
    assert refused.value.code == "replication_unavailable" and refused.value.retriable
    assert f"{settings.kafka.topic_chunks_bulk!r} with replication factor 3 (EMBEDSTREAM_KAFKA__REPLICATION_FACTOR)" \
        in message and "1 broker(s) alive (1)" in message, message
    assert time.monotonic() - started < 30
    assert replication_report(settings.kafka.model_copy(update={"replication_factor": 1}),
                              [settings.kafka.topic_chunks_bulk]) == []  # not created with fewer


@pytest.mark.timeout(300)
def test_a_lane_that_cannot_create_its_topic_serves_the_others_and_looks_again(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "rflane")
    k = settings.kafka
    ensure_topics(k, partitions=1, replication=1, topics=[k.topic_queries, k.topic_replies, k.topic_dead_letters,
                                                          query_topic(k, settings.qdrant.collection)])
    k.replication_factor = 3  # what the single broker cannot give: the online chunk topic stays missing
    with RunningWorker(settings, minilm_engine, memory_store(), lanes=("online",)) as worker:
        with QueryClient(k) as client:
            assert client.embed("served while a topic cannot be made", timeout_s=60).error is None
        wait_for(lambda: worker.readiness_details().get("missing_topics"), 30, "the missing topic reported")
        assert worker.readiness_details() == {"missing_topics": {"online": [k.topic_chunks_online]}}
        time.sleep(3)  # it looked again meanwhile, and stayed up
        assert worker.failure is None and worker.lanes["online"]._may_create
