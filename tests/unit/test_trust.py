"""The trust boundary: the worker's own content hash, and allow-lists for collections and reply topics."""

from __future__ import annotations

import hashlib

import pytest

from embedstream.config import Settings
from embedstream.schemas import ChunkEvent, DocumentDelete, QueryRequest, RerankRequest, SearchRequest, decode
from embedstream.workers.trust import (
    TrustError,
    TrustPolicy,
    TrustSettings,
    check_trust,
    collection_refusal,
    content_hash,
    reply_to_refusal,
    with_worker_hash,
)

POLICY = TrustPolicy.build("docs", "embedstream.replies",
                           TrustSettings(collections=["tenant-a"], reply_topics=["gateway.out"], reply_topic_prefixes=["rpc."]))
ADVERSARIAL_NAMES = ["../../etc/x y", "attacker-made-1", "bad topic!", "x" * 300, "__consumer_offsets", "", ".", "..",
                     "docs/../x", "docs\n", "docs\x00", "ｄocs"]


def test_content_hash_is_sha256_of_the_text():
    assert content_hash("Grüße ✓") == hashlib.sha256("Grüße ✓".encode()).hexdigest()
    assert content_hash("a") != content_hash("b")


def test_a_producers_stale_hash_is_replaced_by_the_workers():
    old_hash = content_hash("old text")
    event = decode(f'{{"doc_id":"d","chunk_id":0,"text":"new text","content_hash":"{old_hash}"}}'.encode(), ChunkEvent)
    assert event.content_hash == old_hash  # the decoder keeps the producer's claim...
    trusted = with_worker_hash(event)
    assert trusted.content_hash == content_hash("new text") != old_hash  # ...the worker does not believe it
    assert trusted.text == "new text" and event.content_hash == old_hash  # a copy: the decoded event is untouched
    honest = decode(b'{"doc_id":"d","chunk_id":0,"text":"t"}', ChunkEvent)
    assert with_worker_hash(honest) is honest


@pytest.mark.parametrize("name", ["docs", "docs_v1", "docs_v2", "docs_v123", "tenant-a", "tenant-a_v7", None])
def test_allowed_collections(name):
    assert collection_refusal(name, POLICY) is None


@pytest.mark.parametrize("name", ADVERSARIAL_NAMES + ["docs_v0", "docs_vx", "docs_v1_v2", "docs2", "tenant-b", "Docs"])
def test_refused_collections_say_why(name):
    reason = collection_refusal(name, POLICY)
    assert reason and reason.startswith("collection ")
    assert len(reason) < 400  # a 300-character name is shown cut short
    if name == "attacker-made-1":
        assert "not allowed" in reason and "'docs'" in reason
    if name == "../../etc/x y":
        assert "not a valid collection name" in reason


@pytest.mark.parametrize("topic", ["embedstream.replies", "embedstream.replies-private", "embedstream.replies.gw1",
                                   "gateway.out", "rpc.client-7"])
def test_allowed_reply_topics(topic):
    assert reply_to_refusal(topic, POLICY) is None


@pytest.mark.parametrize("topic", ADVERSARIAL_NAMES + ["embedstream.queries", "embedstream.dead-letters", "rpc",
                                                       "__embedstream.replies", "gateway.out2"])
def test_refused_reply_topics_say_why(topic):
    reason = reply_to_refusal(topic, POLICY)
    assert reason and reason.startswith("reply_to ") and len(reason) < 400
    if topic == "__consumer_offsets":
        assert "internal" in reason
    if topic in ("bad topic!", "x" * 300, "../../etc/x y"):
        assert "Kafka topic name" in reason


def test_a_private_prefix_does_not_allow_internal_topics():
    policy = TrustPolicy.build("docs", "__replies")  # a replies topic named like an internal one is still refused
    assert "internal" in reply_to_refusal("__replies", policy)


def test_policy_from_settings_defaults_to_the_configured_names():
    settings = Settings()
    policy = TrustPolicy.from_settings(settings)
    assert policy.collection == settings.qdrant.collection and policy.replies_topic == settings.kafka.topic_replies
    assert collection_refusal(f"{settings.qdrant.collection}_v2", policy) is None
    assert collection_refusal("attacker-made-1", policy) is not None
    assert reply_to_refusal(settings.kafka.topic_replies, policy) is None
    assert reply_to_refusal("attacker-made-1", policy) is not None


def test_admit_checks_reply_to_before_the_collection_and_hashes_chunks():
    stale = ChunkEvent(doc_id="d", chunk_id=0, text="new", content_hash=content_hash("old"))
    assert check_trust(stale, POLICY).content_hash == content_hash("new")
    with pytest.raises(TrustError) as err:
        check_trust(ChunkEvent(doc_id="d", chunk_id=0, text="t", collection="attacker-made-1"), POLICY)
    assert err.value.code == "collection_not_allowed"
    with pytest.raises(TrustError) as err:
        check_trust(DocumentDelete(doc_id="d", collection="attacker-made-1"), POLICY)
    assert err.value.code == "collection_not_allowed"

    search = SearchRequest(request_id="s", query="q", collection="attacker-made-1", reply_to="__consumer_offsets")
    with pytest.raises(TrustError) as err:
        check_trust(search, POLICY)
    assert err.value.code == "reply_to_not_allowed" and not err.value.may_reply  # never answer there
    with pytest.raises(TrustError) as err:
        check_trust(search.model_copy(update={"reply_to": "embedstream.replies"}), POLICY)
    assert err.value.code == "collection_not_allowed" and err.value.may_reply  # the reply topic is safe

    for request in (QueryRequest(request_id="q", text="t", reply_to="attacker-made-1"),
                    RerankRequest(request_id="r", query="q", reply_to="attacker-made-1")):
        with pytest.raises(TrustError) as err:
            check_trust(request, POLICY)
        assert err.value.code == "reply_to_not_allowed" and "attacker-made-1" in err.value.message
    fine = QueryRequest(request_id="q", text="t", reply_to="embedstream.replies")
    assert check_trust(fine, POLICY) is fine
    assert check_trust(DocumentDelete(doc_id="d"), POLICY).doc_id == "d"


def test_trust_error_is_a_coded_error_for_dead_letters():
    error = TrustError("collection_not_allowed", "collection 'x' is not allowed")
    assert error.to_error_info().code == "collection_not_allowed" and str(error) == "collection 'x' is not allowed"
