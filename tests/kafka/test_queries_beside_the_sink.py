"""Queries never wait on the sink: with the vector store down or hanging, queries are answered within their
deadline while bulk waits, and bulk resumes exactly (nothing lost, nothing twice) when the store returns."""

from __future__ import annotations

import pytest
from conftest import isolated_settings, make_engine, memory_store, wait_for
from worker_rig import RunningWorker

from embedstream.producers.query_client import QueryClient
from embedstream.producers.topics import ensure_topics
from embedstream.schemas.codec import encode
from fault_rig import OutageStore, _assert_exactly, _chunk_events, _committed_to_the_end, _publish

QUERY_DEADLINE_S = 5.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("outage", ["refuse", "hang"])
def test_queries_are_answered_while_the_sink_is_out_and_bulk_resumes_exactly(kafka_bootstrap, tiny_bert_dir, outage):
    settings = isolated_settings(kafka_bootstrap, f"sink{outage}")
    ensure_topics(settings.kafka, partitions=2)
    topic = settings.kafka.topic_chunks_bulk
    engine = make_engine(tiny_bert_dir, engine={"threads": 1})
    first, later = _chunk_events(40, "a"), _chunk_events(160, "b")
    store = OutageStore(memory_store())
    collection = settings.qdrant.collection
    count = lambda: store.raw.count(collection) if store.raw.collection_exists(collection) else 0  # noqa: E731
    with QueryClient(settings.kafka) as client, RunningWorker(settings, engine, store) as worker:
        worker.options.sink_backoff_s = (0.1, 0.5)
        try:
            _publish(settings, topic, [encode(e) for e in first])
            wait_for(lambda: count() == len(first), 120, "the first chunks written")
            assert client.embed("warm the online lane up", timeout_s=60).error is None
            getattr(store, outage)()
            # new documents and the first ones again (their unchanged-chunk lookups reach the store too)
            _publish(settings, topic, [encode(e) for e in later + first])
            wait_for(lambda: store.calls_in_outage >= 1, 60, "the worker reaching the store during the outage")
            for k in range(10):
                reply = client.embed(f"how do I read file number {k}?", timeout_s=QUERY_DEADLINE_S)
                assert reply.error is None, reply.error
            assert count() == len(first)  # bulk waits for the store
        finally:
            store.restore()
        wait_for(lambda: count() == len(first) + len(later), 120, "every chunk written once the store is back")
        _committed_to_the_end(settings, topic, settings.kafka.group_bulk, 120)
        assert worker.failure is None
    _assert_exactly(store.raw.scroll(collection), first + later)
