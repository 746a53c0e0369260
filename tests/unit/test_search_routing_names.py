"""Where a search goes (producers/search_routing.py): one topic and one group per collection, versions with their
collection, the sender's default for a search naming none, names that fit Kafka's limit."""

from __future__ import annotations

from embedstream.config import KafkaSettings, QdrantSettings, Settings
from embedstream.producers.search_routing import (is_query_topic, online_topics, query_topic, route, search_group,
                                                  search_topic, serves)
from embedstream.producers.topics import deployment_topics, is_project_topic
from embedstream.schemas.bounds import MAX_TOPIC_CHARS
from embedstream.schemas.rerank import SearchRequest

KAFKA = KafkaSettings()


def test_each_collection_has_its_own_topic_and_group_and_its_versions_share_them():
    assert search_topic(KAFKA, "docs_u8") == "embedstream.search.docs_u8"
    assert search_group(KAFKA, "docs_u8") == "embedstream-search.docs_u8"
    assert search_topic(KAFKA, "docs_scalar") != search_topic(KAFKA, "docs_u8")
    assert search_topic(KAFKA, "docs_v3") == search_topic(KAFKA, "docs") and search_group(KAFKA, "docs_v3") == \
        search_group(KAFKA, "docs")
    assert serves("docs", "docs_v2") and serves("docs", None) and not serves("docs_scalar", "docs_u8")
    assert is_project_topic(KAFKA, search_topic(KAFKA, "docs_u8")) and not is_project_topic(KAFKA, "other.search")
    settings = Settings(qdrant=QdrantSettings(collection="docs_u8"))
    assert deployment_topics(settings)[-3:] == ["embedstream.search.docs_u8", "embedstream.queries.docs_u8",
                                                "embedstream.claims"]


def test_a_searchs_query_embedding_goes_to_its_collections_own_queries_topic():
    """Read by the owner's online lane only (issue #41): on the shared queries topic every deployment embedded it."""
    assert query_topic(KAFKA, "docs_u8") == "embedstream.queries.docs_u8" == query_topic(KAFKA, "docs_u8_v2")
    assert online_topics(KAFKA, "docs_u8") == ["embedstream.chunks.online", "embedstream.queries",
                                               "embedstream.queries.docs_u8"]
    assert is_query_topic(KAFKA, "embedstream.queries") and is_query_topic(KAFKA, "embedstream.queries.docs_u8")
    assert not is_query_topic(KAFKA, "embedstream.chunks.online")
    assert is_project_topic(KAFKA, "embedstream.queries.docs_u8")


def test_a_search_naming_no_collection_goes_to_the_senders_default():
    request = SearchRequest(request_id="r", query="q", reply_to="embedstream.replies")
    topic, sent = route(KAFKA, "docs_scalar", request)
    assert topic == "embedstream.search.docs_scalar" and sent.collection == "docs_scalar"
    topic, sent = route(KAFKA, "docs_scalar", request.model_copy(update={"collection": "docs_u8"}))
    assert topic == "embedstream.search.docs_u8" and sent.collection == "docs_u8"


def test_a_collection_name_too_long_for_a_topic_keeps_its_start_and_a_digest():
    long_a, long_b = "c" * 250 + "a", "c" * 250 + "b"
    assert len(search_topic(KAFKA, long_a)) == MAX_TOPIC_CHARS
    assert search_topic(KAFKA, long_a) != search_topic(KAFKA, long_b)
    assert search_topic(KAFKA, long_a).startswith("embedstream.search.ccc")
