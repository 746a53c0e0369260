"""A query served at a bulk pass's checkpoint leaves the running pass's estimate in place: an arrival while
the bulk pass still runs is judged behind it, not as if the engine were idle."""

from __future__ import annotations

import time

import pytest
from conftest import isolated_settings, make_engine, memory_store

from embedstream.producers.topics import ensure_topics
from embedstream.schemas import QueryRequest
from embedstream.schemas.codec import encode
from embedstream.schemas.events import now_ms
from embedstream.workers.admission import PREDICTED_LATE
from embedstream.workers.runtime import build_embed_worker
from fault_rig import _chunk_events, _publish


def _query(settings, name: str, deadline_in_ms: int) -> bytes:
    return encode(QueryRequest(request_id=name, text=f"what does {name} ask?", reply_to=settings.kafka.topic_replies,
                               deadline_ms=now_ms() + deadline_in_ms))


def _intake_until(worker, lane: str, wanted) -> None:
    end = time.monotonic() + 60
    while not wanted() and time.monotonic() < end:
        worker.intake(lane, 200)
    assert wanted()


@pytest.mark.timeout(120)
def test_a_query_served_at_a_checkpoint_leaves_the_running_pass_estimate_in_place(kafka_bootstrap, tiny_bert_dir):
    settings = isolated_settings(kafka_bootstrap, "runningpass")
    ensure_topics(settings.kafka, partitions=1)
    engine = make_engine(tiny_bert_dir, engine={"threads": 1})
    worker = build_embed_worker(settings, ("online", "bulk"), store=memory_store(), engine=engine)
    worker.options.skip_unchanged = False  # the bulk pass starts at once: the query is served at its checkpoint
    online, bulk = worker.lanes["online"], worker.lanes["bulk"]
    shed = worker.metrics.shed.labels(lane="online", reason=PREDICTED_LATE)
    try:
        events = _chunk_events(12, "p")
        _publish(settings, settings.kafka.topic_chunks_bulk, [encode(e) for e in events])
        _intake_until(worker, "bulk", lambda: len(bulk.queue) == len(events))
        # A known cost model: 100 ms per token, so the bulk pass is predicted to run for many seconds.
        worker.admission.model.observe(100, 10_000.0)
        worker.admission.model.observe(200, 20_000.0)
        batch = worker.next_batch()
        assert len(batch) == len(events)  # the bulk pass, formed before any query arrived
        _publish(settings, settings.kafka.topic_queries, [_query(settings, "first", 60_000)])
        _intake_until(worker, "online", lambda: len(online.queue) == 1)  # queued: judged against an idle engine

        reply, replies = online.reply, []

        def second_arrives_after_the_first_is_answered(record, request, answer, handle, *rest):
            reply(record, request, answer, handle, *rest)
            replies.append(request.request_id)
            if request.request_id == "first":  # served at a checkpoint; the bulk pass still runs
                _publish(settings, settings.kafka.topic_queries, [_query(settings, "second", 3_000)])
                _intake_until(worker, "online", lambda: "second" in replies or len(online.queue) > 0)

        online.reply = second_arrives_after_the_first_is_answered
        worker.compute(batch)
        # "second" needs ~1 s of its own compute but waits for the rest of the bulk pass (seconds): refused at once.
        assert replies[:2] == ["first", "second"] and not online.queue
        assert shed._value.get() == 1
    finally:
        worker.close()
