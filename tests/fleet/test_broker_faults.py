"""Broker faults on the real 3-broker cluster: a leader killed -9 under the bulk lane and under 20 QPS of
queries, that broker back, and a rolling restart of all three while indexing and querying.

Each ends with the index exact (every chunk once), every worker thread alive, and every query answered or
failed with a clear error (none vanishes). Bounds are generous (a loaded 2-vCPU machine); what was measured
is printed, and ``embedstream bench fleet`` tabulates it.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from conftest import memory_store, wait_for
from fault_rig import _assert_exactly, _chunk_events, _committed_to_the_end, _publish, _SteadyProducer, counting_settings
from gateway_rig import MODEL, background_gateway
from worker_rig import RunningWorker

from embedstream.bench.fleet_rig import (HttpLoad, QueryLoad, answered_in_time, kinds, reasons, recovery_s, reply_gap,
                                         timeline, window_p)
from embedstream.gateway import GatewayOptions
from embedstream.producers.query_client import QueryClient
from embedstream.producers.topics import ensure_topics
from embedstream.schemas.codec import encode

pytestmark = pytest.mark.usefixtures("healed")

SETTLED = {"answered", "refused", "timeout", "send_failed"}  # a reply, or a clear error: never "pending" (vanished)
# Queries: answered p99 back under twice its pre-kill value, and staying there HOLD_S, this soon after a kill -9 of the
# leader of most query and reply partitions. Measured 4.0 s, 6.0 s when the node was also the active controller
# (docs/fleet.md; 2 s windows): the dev cluster fences a dead node after 2.5 s (devkafka FAILOVER), and until then no
# partition with it in sync moves its high watermark. On Kafka's 9 s fence: 12-24 s (the previous code; this bound
# was 90 s). Held HOLD_S, not to the load's end: a later hiccup of a loaded host made it 24 s once, no failover's doing.
# How fast is measured, not asserted (`bench fleet --failover`): at load 4-8 beside a full suite run the gateway's took
# 12 s once. The bound here says it recovers at all; what fails the previous code is ANSWERED_IN_TIME (87-91 %).
RECOVERY_BOUND_S = 30.0
HOLD_S = 10.0
ANSWERED_IN_TIME = 0.99  # of the queries, answered within their deadline (a reply, no error, under timeout_s)


TIMEOUT_S = 5.0  # each query's deadline


def _count(store, collection: str) -> int:
    return store.count(collection) if store.collection_exists(collection) else 0


class _WindowWatch:
    """The most records a lane had handed out and not committed, sampled every 50 ms (the in-flight window)."""

    def __init__(self, lane):
        self.lane, self.most = lane, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.most = max(self.most, self.lane.offsets.window())

    def close(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.most


@pytest.mark.timeout(420)
def test_bulk_leader_killed_mid_backlog_then_back_indexes_every_chunk_once(cluster, minilm_engine):
    control = cluster.control
    settings = counting_settings(cluster.bootstrap, "lead")
    ensure_topics(settings.kafka, partitions=4)
    topic, collection = settings.kafka.topic_chunks_bulk, settings.qdrant.collection
    events = _chunk_events(480, "L")
    before, during, after = events[:240], events[240:360], events[360:]
    _publish(settings, topic, [encode(e) for e in before])
    store = memory_store()
    running = RunningWorker(settings, minilm_engine, store, lanes=("bulk",))
    with running as worker:
        watch = _WindowWatch(worker.lanes["bulk"])
        wait_for(lambda: _count(store, collection) >= 60, 180, "the worker indexing")
        node = control.node_leading_most([topic])
        control.kill(node)  # (a) kill -9 of the node leading most bulk partitions, mid-backlog
        killed_at, at_kill = time.monotonic(), _count(store, collection)
        _publish(settings, topic, [encode(e) for e in during])  # acks=all: two of three replicas are left
        wait_for(lambda: _count(store, collection) == len(before) + len(during) or not running.thread.is_alive(),
                 240, "every chunk indexed while the leader is down")
        down_s = time.monotonic() - killed_at
        assert running.thread.is_alive(), "the worker exited when the leader died"
        _committed_to_the_end(settings, topic, settings.kafka.group_bulk, timeout_s=120)

        control.start(node)  # (c) that broker back: it catches up, then leads its partitions again
        control.wait_in_sync([topic])
        control.elect_preferred([topic])
        _publish(settings, topic, [encode(e) for e in after])
        wait_for(lambda: _count(store, collection) == len(events), 240, "the chunks published after its return")
        end = _committed_to_the_end(settings, topic, settings.kafka.group_bulk, timeout_s=120)
        window = watch.close()
        assert running.thread.is_alive(), "the worker exited when the broker came back"
        embedded = worker.metrics.texts.labels(lane="bulk", kind="chunk")._value.get()
    print(f"\nleader node {node} killed at {at_kill}/{len(before)} indexed, {len(during)} more published; all "
          f"indexed {down_s:.1f} s after the kill with it down; back, then {len(after)} more: embedded "
          f"{embedded:.0f} of {len(events)} (in-flight window up to {window})")
    assert end == len(events)
    assert embedded - len(events) <= window  # nothing embedded again beyond what was in flight
    _assert_exactly(store.scroll(collection), events)


@pytest.mark.timeout(300)
def test_query_leader_killed_during_20_qps_every_query_answered_or_timed_out(cluster, minilm_engine):
    settings = counting_settings(cluster.bootstrap, "qlead")
    ensure_topics(settings.kafka, partitions=4)
    k = settings.kafka
    with RunningWorker(settings, minilm_engine, memory_store(), lanes=("online",)), QueryClient(k) as client:
        wait_for(lambda: _answered(client), 120, "the online worker answering")
        load = QueryLoad(client, rate_per_s=20, timeout_s=TIMEOUT_S)
        outcomes, node, killed_at = _leader_killed_under(load, cluster.control, [k.topic_queries, k.topic_replies])
    _assert_rode_out(outcomes, node, killed_at, f"QueryClient, {client.retries} sent again")


@pytest.mark.timeout(300)
def test_query_leader_killed_during_20_qps_through_the_gateway_every_request_answered(cluster, minilm_engine):
    settings = counting_settings(cluster.bootstrap, "glead")
    ensure_topics(settings.kafka, partitions=4)
    k = settings.kafka
    with RunningWorker(settings, minilm_engine, memory_store(), lanes=("online",)), \
            background_gateway(settings, GatewayOptions(model=MODEL)) as gateway:
        wait_for(lambda: _http_answered(gateway.url), 120, "the gateway answering")
        replies = httpx.get(f"{gateway.url}/info", timeout=10).json()["topics"]["replies"]  # the gateway's own
        assert replies.startswith(f"{k.topic_replies}.")
        load = HttpLoad(gateway.url, rate_per_s=20, timeout_s=TIMEOUT_S)
        outcomes, node, killed_at = _leader_killed_under(load, cluster.control, [k.topic_queries, replies])
    _assert_rode_out(outcomes, node, killed_at, "gateway")


def _leader_killed_under(load, control, topics: list[str]) -> tuple[list, int, float]:
    """(b) kill -9 of the node leading most of ``topics``' partitions 10 s into ``load``; 50 s more of it."""
    load.start()
    time.sleep(10)
    node = control.node_leading_most(topics)
    killed_at = time.monotonic()
    control.kill(node)
    time.sleep(50)
    return load.stop(), node, killed_at


def _assert_rode_out(outcomes: list, node: int, killed_at: float, what: str) -> None:
    counts = kinds(outcomes)
    before = window_p(outcomes, killed_at - 10, killed_at, 99)
    target = max(2 * before, 0.25)
    recovered = recovery_s(outcomes, killed_at, target, hold_s=HOLD_S)
    in_time = answered_in_time(outcomes, TIMEOUT_S)
    print(f"\n{what}: {len(outcomes)} queries, node {node} killed after 10 s: {counts}, {in_time} answered within "
          f"{TIMEOUT_S:g} s; answered p99 {before * 1000:.0f} ms before, back under {target * 1000:.0f} ms {recovered} s "
          f"after the kill; replies stopped for {reply_gap(outcomes, killed_at, killed_at + 20):.1f} s; not answered: "
          f"{reasons(outcomes)}\n" + "; ".join(timeline(outcomes, killed_at - 2, killed_at + 12)))
    assert set(counts) <= SETTLED, [o for o in outcomes if o.kind not in SETTLED][:5]
    assert in_time >= ANSWERED_IN_TIME * len(outcomes)
    assert recovered is not None and recovered <= RECOVERY_BOUND_S


def _http_answered(url: str) -> bool:
    import urllib.request

    try:
        request = urllib.request.Request(f"{url}/embed", data=b'{"inputs": "warm up"}', method="POST",
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status == 200
    except Exception:  # noqa: BLE001 - not answering yet
        return False


def _answered(client) -> bool:
    try:
        return client.embed("warm up", timeout_s=5).error is None
    except TimeoutError:
        return False


@pytest.mark.timeout(600)
def test_rolling_restart_of_all_brokers_while_indexing_and_querying(cluster, minilm_engine):
    control = cluster.control
    settings = counting_settings(cluster.bootstrap, "roll")
    ensure_topics(settings.kafka, partitions=4)
    k, collection = settings.kafka, settings.qdrant.collection
    topics = [k.topic_chunks_bulk, k.topic_queries, k.topic_replies]
    events = _chunk_events(600, "R")
    _publish(settings, k.topic_chunks_bulk, [encode(e) for e in events[:200]])
    producer = _SteadyProducer(settings, k.topic_chunks_bulk, [encode(e) for e in events[200:]], rate_per_s=8)
    store = memory_store()
    running = RunningWorker(settings, minilm_engine, store, lanes=("online", "bulk"))
    with running, QueryClient(k) as client:
        wait_for(lambda: _answered(client), 120, "the online lane answering")
        load = QueryLoad(client, rate_per_s=5, timeout_s=5.0).start()
        producer.thread.start()
        took = []
        for node in (1, 2, 3):  # (d) one node at a time: clean stop, start, replicas back in sync
            started = time.monotonic()
            control.stop(node)
            control.start(node)
            control.wait_in_sync(topics)
            took.append(time.monotonic() - started)
            assert running.thread.is_alive(), f"the worker exited while node {node} restarted"
        outcomes = load.stop()
        producer.thread.join(240)
        assert producer.error is None, repr(producer.error)
        wait_for(lambda: _count(store, collection) == len(events), 300, "every chunk indexed")
        end = _committed_to_the_end(settings, k.topic_chunks_bulk, k.group_bulk, timeout_s=120)
        assert running.thread.is_alive(), "the worker exited during the rolling restart"
    counts = kinds(outcomes)
    print(f"\nrolling restart: nodes took {[round(t, 1) for t in took]} s; {len(outcomes)} queries {counts} "
          f"{reasons(outcomes)}; "
          f"{producer.resent} sends retried; log end {end}")
    assert set(counts) <= SETTLED
    assert counts.get("answered", 0) >= 0.8 * len(outcomes)  # leaderships move before a node stops
    assert end >= len(events)  # a retried send may have landed twice: the sink absorbs it
    _assert_exactly(store.scroll(collection), events)
