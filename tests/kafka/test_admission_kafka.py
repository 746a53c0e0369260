"""Admission control in the embed worker on the real broker: overload is refused fast, never computed late."""

from __future__ import annotations

import time
import uuid

import pytest
from conftest import isolated_settings, memory_store
from worker_rig import RunningWorker

from embedstream.producers.query_client import QueryClient
from embedstream.producers.topics import ensure_topics
from embedstream.schemas.events import QueryReply, QueryRequest, now_ms

pytestmark = pytest.mark.kafka


class CountingEngine:
    """The real engine, recording every forward pass: when it ran (epoch ms) and which requests it held."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[tuple[int, set]] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def forward(self, items, *args, **kwargs):
        self.calls.append((now_ms(), {item.request.id for item in items}))
        return self.engine.forward(items, *args, **kwargs)


def _query(client: QueryClient, text: str, deadline_ms: int | None) -> QueryRequest:
    return QueryRequest(request_id=uuid.uuid4().hex, text=text, reply_to=client.reply_topic, deadline_ms=deadline_ms,
                        sent_at_ms=now_ms())


def test_three_times_the_sustainable_rate_sheds_the_excess_before_compute(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "admit")
    settings.worker.warm_up_tokens = 0
    ensure_topics(settings.kafka, partitions=1)
    engine = CountingEngine(minilm_engine)
    text = "how do I read a file line by line in python without loading all of it"
    with QueryClient(settings.kafka) as client, RunningWorker(settings, engine, memory_store(), lanes=("online",)) as worker:
        sample = worker.metrics.registry.get_sample_value
        labels = {"stage": "forward", "lane": "online"}

        def forward_s() -> tuple[float, float]:
            return (sample("embedstream_stage_duration_seconds_sum", labels) or 0.0,
                    sample("embedstream_stage_duration_seconds_count", labels) or 0.0)

        for _ in range(10):  # warm: the controller learns the pass time
            assert client.embed(text, timeout_s=30).error is None
        warm_sum, warm_count = forward_s()
        for _ in range(10):  # ... and this test, from warm passes only (the first ones ran 2-5x slower: none shed)
            assert client.embed(text, timeout_s=30).error is None
        total_sum, total_count = forward_s()
        service_s = (total_sum - warm_sum) / (total_count - warm_count)
        budget_ms = max(40, int(8 * service_s * 1000))
        deadlines: dict[str, int] = {}
        futures = []
        gap_s = service_s / 3  # three times the rate the worker computes one query at a time
        end = time.perf_counter() + 3.0
        while time.perf_counter() < end and len(futures) < 1500:
            request = _query(client, text, now_ms() + budget_ms)
            deadlines[request.request_id] = request.deadline_ms
            futures.append((request, client.submit(settings.kafka.topic_queries, request, QueryReply, timeout_s=60)))
            time.sleep(gap_s)
        replies = [(request, future.result(timeout=60)) for request, future in futures]
        # bad deadlines: in the past -> refused at once; years ahead -> capped, served; missing -> served
        past = client.request(settings.kafka.topic_queries, _query(client, text, now_ms() - 1000), QueryReply,
                              timeout_s=30)
        far = client.request(settings.kafka.topic_queries, _query(client, text, now_ms() + 10 * 365 * 86400 * 1000),
                             QueryReply, timeout_s=30)
        missing = _query(client, text, None)
        missing_reply = client.request(settings.kafka.topic_queries, missing, QueryReply, timeout_s=30)
    assert past.error is not None and past.error.code == "deadline_exceeded"
    assert far.error is None and missing_reply.error is None
    shed = {req.request_id for req, rep in replies if rep.error is not None}
    served = {req.request_id for req, rep in replies if rep.error is None}
    assert {rep.error.code for _, rep in replies if rep.error is not None} == {"deadline_exceeded"}
    assert shed and served, (len(shed), len(served))
    computed = set().union(*(ids for _, ids in engine.calls))
    assert not computed & shed  # a shed query never reached a forward pass
    for when, ids in engine.calls:  # nothing was computed once its deadline had passed
        late = [i for i in ids if i in deadlines and when >= deadlines[i]]
        assert not late, late
    reasons = ("deadline_past", "expired_in_queue", "predicted_late", "late_at_pass")
    counted = {r: sample("embedstream_shed_total", {"lane": "online", "reason": r}) or 0 for r in reasons}
    assert sum(counted.values()) == len(shed) + 1 and counted["deadline_past"] >= 1  # + the past one
    print(f"forward {service_s * 1000:.1f} ms, budget {budget_ms} ms, {len(replies)} sent, {len(shed)} shed ({counted})")
