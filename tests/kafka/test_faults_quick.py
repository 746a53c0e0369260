"""Fault tolerance on the real broker: Qdrant outages and poison streams lose nothing.

Each test ends with an exact count of points and ids in the store, and checks committed offsets.
"""

from __future__ import annotations

import time

import pytest
from conftest import isolated_settings, memory_store, wait_for
from kafka import KafkaConsumer
from worker_rig import RunningWorker

from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.workers.sink import point_id
from fault_rig import FlakyStore, _chunk_events, _committed, _GroupProgress, _publish


def test_qdrant_outage_stops_commits_then_resumes_without_loss(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "outage")
    ensure_topics(settings.kafka, partitions=2)
    topic = settings.kafka.topic_chunks_bulk
    events = [ChunkEvent(doc_id=f"doc{i // 3}", chunk_id=i % 3, text=f"chunk {i} on reading files") for i in range(120)]
    _publish(settings, topic, [encode(e) for e in events])
    store = FlakyStore(memory_store())
    store.down = True
    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)) as worker:
        worker.options.sink_backoff_s = (0.1, 0.5)
        wait_for(lambda: store.failed_writes >= 3, 120, "failed writes during the outage")
        assert _committed(settings, topic, settings.kafka.group_bulk) == 0  # nothing done, nothing committed
        assert worker.metrics.sink_failures._value.get() >= 3
        store.down = False
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(events), 120, "all points")
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(events), 60, "offsets committed")
    assert {p.id for p in store.scroll("docs")} == {point_id(e.doc_id, e.chunk_id) for e in events}


@pytest.mark.timeout(120)
def test_finished_work_is_committed_when_partitions_are_revoked(kafka_bootstrap, minilm_engine):
    """A rebalance while finished work is not yet committed: the revocation commits it, the loop survives.

    The worker's steps are driven by hand so the revocation lands exactly between the sink write and
    the commit (in production: a query answered or a record dead-lettered inside the online
    batching window, just before the poll that joins a rebalance).
    """
    settings, topic, group, events, store, worker = _bulk_backlog(kafka_bootstrap, minilm_engine, "revoke", "v")
    other = None
    progress = _GroupProgress(settings, topic, group)
    try:
        _queue_everything(worker, len(events))
        while batch := worker.next_batch():
            _compute_and_write(worker, batch)  # written to the store, not committed yet
        assert store.count(settings.qdrant.collection) == len(events) and progress.committed() == 0
        other = _member(settings, group)
        _second_member_takes_a_partition(worker, other, topic)
        assert progress.committed() == len(events), "finished work was not committed on revocation"
    finally:
        if other is not None:
            other.close()
        progress.close()
        worker.close()


def _compute_and_write(worker, batch) -> None:
    """The model and output stages' work for one batch, on this thread (the steps driven by hand)."""
    for job in worker.compute(batch):
        worker.output.write(job)


def _queue_everything(worker, count: int) -> None:
    """Drive the bulk lane's intake by hand until ``count`` records are queued (none processed)."""
    lane = worker.lanes["bulk"]
    end = time.monotonic() + 60
    while (not lane.consumer.assignment() or len(lane.queue) < count) and time.monotonic() < end:
        worker.intake("bulk", 200)
    assert len(lane.queue) == count


def _second_member_takes_a_partition(worker, other, topic: str) -> None:
    """``other`` joins the worker's bulk group and polls until the worker holds one of the two partitions;
    the revocation happens inside the worker's own intake polls."""
    import threading

    consumer = worker.lanes["bulk"].consumer
    other.subscribe([topic])
    joined = threading.Event()

    def second_member() -> None:  # a second worker joining the group: the group rebalances
        while not joined.is_set():
            other.poll(timeout_ms=200)

    member = threading.Thread(target=second_member, daemon=True)
    member.start()
    end = time.monotonic() + 60
    while len(consumer.assignment()) != 1 and time.monotonic() < end:
        worker.intake("bulk", 200)
    joined.set()
    member.join(10)
    assert len(consumer.assignment()) == 1


@pytest.mark.timeout(150)
def test_queued_work_of_a_partition_revoked_and_assigned_back_is_fetched_again(kafka_bootstrap, minilm_engine):
    """Eager rebalance: every partition is revoked (queued work dropped), then some come back to the same
    member. kafka-python keeps a returning partition's fetch position, so the lane rewinds it to its first
    unfinished record; without that the dropped records were never seen again."""
    settings, topic, group, events, store, worker = _bulk_backlog(kafka_bootstrap, minilm_engine, "rewind", "w",
                                                                  group_protocol="eager")
    other = _member(settings, group)
    try:
        _queue_everything(worker, len(events))  # nothing processed or committed
        _second_member_takes_a_partition(worker, other, topic)  # revoked both, got one back: its queue dropped
        other.close()  # leaves: the group gives both partitions to the worker again
        end = time.monotonic() + 90
        while (not store.collection_exists("docs") or store.count("docs") < len(events)) and time.monotonic() < end:
            worker.intake("bulk", 200)
            while batch := worker.next_batch():
                _compute_and_write(worker, batch)
        assert store.count("docs") == len(events)
        assert {p.id for p in store.scroll("docs")} == {point_id(e.doc_id, e.chunk_id) for e in events}
    finally:
        worker.close()


def _member(settings, group: str) -> KafkaConsumer:
    """Another member of the worker's group, rebalancing as the worker does (``group_protocol``)."""
    from embedstream.workers.transport.kafka_io import kafka_python_rebalancing

    return KafkaConsumer(**settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False,
                         **kafka_python_rebalancing(settings.kafka))


def _bulk_backlog(kafka_bootstrap, engine, name: str, tag: str, **kafka_changes):
    """40 chunks on a 2-partition bulk topic and a bulk worker (not started) over a memory store."""
    from embedstream.workers.runtime import build_embed_worker

    settings = isolated_settings(kafka_bootstrap, name)
    settings.kafka = settings.kafka.model_copy(update=kafka_changes)
    ensure_topics(settings.kafka, partitions=2)
    topic, group = settings.kafka.topic_chunks_bulk, settings.kafka.group_bulk
    events = _chunk_events(40, tag)
    _publish(settings, topic, [encode(e) for e in events])
    store = memory_store()
    return settings, topic, group, events, store, build_embed_worker(settings, ("bulk",), store=store, engine=engine)
