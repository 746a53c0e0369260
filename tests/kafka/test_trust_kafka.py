"""A producer's event is a claim, not an instruction (issue #13), on the real broker: the embed worker refuses
collections and reply topics producers may not name, and stores the hash of the text it embedded."""

from __future__ import annotations

import json

import pytest
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from fault_rig import _committed
from kafka.admin import KafkaAdminClient
from worker_rig import RunningWorker

from embedstream.producers.query_client import QueryClient
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent, DocumentDelete, QueryRequest
from embedstream.schemas.codec import encode
from embedstream.schemas.events import content_hash

from test_worker_robustness import _send

pytestmark = pytest.mark.kafka


def _with_field(event, **fields) -> bytes:
    """The event as JSON with fields set as a producer may send them (claims the model would recompute)."""
    body = json.loads(encode(event))
    body.update(fields)
    return json.dumps(body).encode()


def test_refused_collections_and_reply_topics_are_dead_lettered_and_never_used(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "trust")
    ensure_topics(settings.kafka, partitions=1)
    chunks, queries = settings.kafka.topic_chunks_online, settings.kafka.topic_queries
    elsewhere = "someone-elses-topic"
    chunk_values = [
        encode(ChunkEvent(doc_id="g0", chunk_id=0, text="a good chunk about files")),
        encode(ChunkEvent(doc_id="a", chunk_id=0, text="make me a collection", collection="attacker-made-1")),
        encode(DocumentDelete(doc_id="a", collection="attacker-made-2")),
        encode(ChunkEvent(doc_id="g1", chunk_id=0, text="another good chunk about sockets")),
    ]
    query_value = _with_field(QueryRequest(request_id="q-bad", text="reply elsewhere", reply_to="x"), reply_to=elsewhere)
    store = memory_store()
    running = RunningWorker(settings, minilm_engine, store, lanes=("online",))
    with QueryClient(settings.kafka) as client, running as worker:
        _send(settings, chunks, chunk_values)
        _send(settings, queries, [query_value])
        letters = read_dead_letters(settings, 3, timeout_s=120)
        good = client.embed("are queries with a good reply topic still answered?", timeout_s=60)
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == 2, 60, "the good chunks")
        wait_for(lambda: _committed(settings, chunks, settings.kafka.group_online) == len(chunk_values), 30, "commits")
        assert running.thread.is_alive() and worker.failure is None
    assert good.error is None
    codes = sorted((letter.source_topic, letter.offset, letter.error.code) for letter in letters)
    assert codes == [(chunks, 1, "collection_not_allowed"), (chunks, 2, "collection_not_allowed"),
                     (queries, 0, "reply_to_not_allowed")]
    assert not store.collection_exists("attacker-made-1") and not store.collection_exists("attacker-made-2")
    admin = KafkaAdminClient(**settings.kafka.client_kwargs())
    assert elsewhere not in admin.list_topics()
    admin.close()


def test_a_stale_content_hash_does_not_keep_old_text(kafka_bootstrap, minilm_engine):
    """New text under the old text's hash is embedded again: the stored hash is the worker's own."""
    settings = isolated_settings(kafka_bootstrap, "stalehash")
    ensure_topics(settings.kafka, partitions=1)
    topic = settings.kafka.topic_chunks_bulk
    old, new = "the old text about reading files", "the new text about opening sockets"
    store = memory_store()

    def stored_text() -> str | None:
        points = list(store.scroll("docs")) if store.collection_exists("docs") else []
        return points[0].payload["text"] if points else None

    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)) as worker:
        _send(settings, topic, [encode(ChunkEvent(doc_id="h", chunk_id=0, text=old))])
        wait_for(lambda: stored_text() == old, 120, "the old text indexed")
        _send(settings, topic, [_with_field(ChunkEvent(doc_id="h", chunk_id=0, text=new), content_hash=content_hash(old))])
        wait_for(lambda: stored_text() == new, 60, "the new text indexed despite the old hash")
        assert worker.failure is None
    (point,) = store.scroll("docs")
    assert point.payload["content_hash"] == content_hash(new)
