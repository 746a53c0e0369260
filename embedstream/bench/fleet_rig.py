"""What the cluster's fault tests and ``embedstream bench fleet`` share: the nodes' leaderships and in-sync
replicas, a query load whose every request ends in a reply or a clear error, and a group's committed
progress sampled over time (the pause of an event: the longest stretch without committed progress).

No policy and no assertion here: the tests assert, the bench prints.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from embedstream import devkafka
from embedstream.config import KafkaSettings


class ClusterControl:
    """The dev cluster of one data dir: who leads what, nodes killed / stopped / started, replicas in sync."""

    def __init__(self, port: int, data_dir: str | Path, kafka: KafkaSettings):
        from kafka import KafkaAdminClient

        self.port, self.data_dir, self.kafka = port, str(data_dir), kafka
        self.brokers = devkafka.cluster_size(port, data_dir)
        self.admin = KafkaAdminClient(**kafka.client_kwargs(), client_id="embedstream-fleet-rig")

    def leaders(self, topics: list[str]) -> dict[tuple[str, int], int]:
        """(topic, partition) -> node leading it (-1: none)."""
        found = {}
        for topic in self.admin.describe_topics(topics):
            for part in topic["partitions"]:
                found[(topic["name"], part["partition_index"])] = part["leader_id"]
        return found

    def node_leading_most(self, topics: list[str]) -> int:
        """The node leading most partitions of ``topics`` (ties: the lowest node id)."""
        counts = Counter(leader for leader in self.leaders(topics).values() if leader > 0)
        return min(counts, key=lambda node: (-counts[node], node))

    def in_sync(self, topics: list[str]) -> bool:
        """Every partition of ``topics`` has all its replicas in sync and a leader."""
        for topic in self.admin.describe_topics(topics):
            for part in topic["partitions"]:
                if part["leader_id"] < 0 or set(part["isr_nodes"]) != set(part["replica_nodes"]):
                    return False
        return True

    def wait_in_sync(self, topics: list[str], timeout_s: float = 120.0) -> float:
        """Block until every replica of ``topics`` is back in sync; returns the seconds waited."""
        start = time.monotonic()
        while True:
            try:
                if self.in_sync(topics):
                    return time.monotonic() - start
            except Exception:  # noqa: BLE001 - metadata while a node rejoins: ask again
                pass
            if time.monotonic() - start > timeout_s:
                raise TimeoutError(f"replicas of {topics} not in sync after {timeout_s:g} s")
            time.sleep(0.5)

    def elect_preferred(self, topics: list[str]) -> None:
        """Move leaderships back to their preferred replicas now (the broker does it on its own within
        ``leader.imbalance.check.interval.seconds``, 300 s)."""
        self.admin.elect_leaders(0, list(topics), raise_errors=False)  # 0: preferred

    def kill(self, node: int) -> int:
        return devkafka.kill_node(self.port, self.data_dir, node)

    def stop(self, node: int) -> bool:
        return devkafka.stop_node(self.port, self.data_dir, node)

    def start(self, node: int) -> None:
        devkafka.start_node(self.port, self.data_dir, node)

    def heal(self) -> None:
        """Every node running again (after a test that killed one)."""
        for node in range(1, self.brokers + 1):
            self.start(node)

    def close(self) -> None:
        self.admin.close()


# -- a query load: every request ends in a reply or a clear error ----------------------------------
@dataclass
class Outcome:
    sent_at: float  # monotonic seconds
    # answered | refused (a reply with an error: deadline_exceeded...) | timeout | send_failed | error (anything
    # else) | pending (never settled: vanished)
    kind: str = "pending"
    latency_s: float | None = None
    detail: str = ""


class _OpenLoop:
    """Requests at a steady rate from a thread (open loop: a slow answer does not hold back the next request), each
    with its ``Outcome``; a subclass sends one (``_send``) and records how it settled."""

    def __init__(self, rate_per_s: float, timeout_s: float, texts: list[str] | None, name: str):
        self.interval, self.timeout_s = 1.0 / rate_per_s, timeout_s
        self.texts = texts or [f"how do I open file number {i} for reading" for i in range(50)]
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def _run(self) -> None:
        next_at, i = time.monotonic(), 0
        while not self._stop.is_set():
            outcome = Outcome(time.monotonic())
            self.outcomes.append(outcome)
            self._send(self.texts[i % len(self.texts)], outcome)
            i += 1
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _send(self, text: str, outcome: Outcome) -> None:
        raise NotImplementedError

    def _stop_sending(self) -> None:
        self._stop.set()
        self._thread.join(30)


class QueryLoad(_OpenLoop):
    """Queries through a ``QueryClient`` at a steady rate; each one's outcome recorded when its future settles."""

    def __init__(self, client, rate_per_s: float, timeout_s: float = 5.0, texts: list[str] | None = None):
        super().__init__(rate_per_s, timeout_s, texts, "fleet-query-load")
        self.client = client
        self._futures: list[Future] = []

    def _send(self, text: str, outcome: Outcome) -> None:
        from embedstream.schemas.events import QueryReply, QueryRequest, now_ms

        sent = now_ms()
        request = QueryRequest(request_id=uuid.uuid4().hex, text=text, reply_to=self.client.reply_topic,
                               deadline_ms=sent + int(self.timeout_s * 1000), sent_at_ms=sent)
        try:
            future = self.client.submit(self.client.settings.topic_queries, request, QueryReply,
                                        timeout_s=self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - refused at once: a clear error
            outcome.kind, outcome.detail = "send_failed", str(exc)[:200]
        else:
            future.add_done_callback(lambda f, o=outcome: self._settled(f, o))
            self._futures.append(future)

    @staticmethod
    def _settled(future: Future, outcome: Outcome) -> None:
        elapsed = time.monotonic() - outcome.sent_at
        if future.cancelled():
            outcome.kind = "error"
            return
        exc = future.exception()
        if exc is None:
            reply = future.result()
            outcome.kind = "answered" if reply.error is None else "refused"
            outcome.latency_s, outcome.detail = elapsed, "" if reply.error is None else reply.error.code
        elif isinstance(exc, TimeoutError):
            outcome.kind, outcome.detail = "timeout", str(exc)[:200]
        elif "sending request" in str(exc):
            outcome.kind, outcome.detail = "send_failed", str(exc)[:200]
        else:
            outcome.kind, outcome.detail = "error", f"{type(exc).__name__}: {str(exc)[:200]}"

    def stop(self, settle_s: float | None = None) -> list[Outcome]:
        """Stop sending; wait until every request sent has settled (its timeout, plus a grace)."""
        self._stop_sending()
        deadline = time.monotonic() + (self.timeout_s + 10.0 if settle_s is None else settle_s)
        while any(o.kind == "pending" for o in self.outcomes) and time.monotonic() < deadline:
            time.sleep(0.1)
        return list(self.outcomes)


class HttpLoad(_OpenLoop):
    """The same open-loop load through a gateway: ``POST /embed`` (TEI) at ``rate_per_s``, each request on a thread
    of a pool with ``x-request-timeout``; answered (200), refused (a 504 ``deadline_exceeded`` or another status,
    its code), timeout (no answer in ``timeout_s`` + 5 s) or error."""

    def __init__(self, url: str, rate_per_s: float, timeout_s: float = 5.0, texts: list[str] | None = None):
        from concurrent.futures import ThreadPoolExecutor

        super().__init__(rate_per_s, timeout_s, texts, "fleet-http-load")
        self.url = url.rstrip("/")
        self._pool = ThreadPoolExecutor(max(8, int(rate_per_s * (timeout_s + 5))), thread_name_prefix="http-load")

    def _send(self, text: str, outcome: Outcome) -> None:
        self._pool.submit(self._one, text, outcome)

    def _one(self, text: str, outcome: Outcome) -> None:
        import json
        import urllib.error
        import urllib.request

        request = urllib.request.Request(f"{self.url}/embed", data=json.dumps({"inputs": text}).encode(), method="POST",
                                         headers={"content-type": "application/json",
                                                  "x-request-timeout": f"{self.timeout_s:g}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s + 5) as answer:
                answer.read()
            outcome.kind, outcome.latency_s = "answered", time.monotonic() - outcome.sent_at
        except urllib.error.HTTPError as exc:
            body = exc.read().decode("utf-8", "replace")
            try:
                found = json.loads(body)
            except ValueError:
                found = {}
            code = (found.get("code") or found.get("error_type", "")) if isinstance(found, dict) else ""
            outcome.kind, outcome.detail = "refused", f"{exc.code} {code or body[:60]}"
        except TimeoutError as exc:
            outcome.kind, outcome.detail = "timeout", str(exc)[:200]
        except Exception as exc:  # noqa: BLE001 - a refused connection, a reset: a clear error
            outcome.kind, outcome.detail = "error", f"{type(exc).__name__}: {str(exc)[:200]}"

    def stop(self) -> list[Outcome]:
        self._stop_sending()
        self._pool.shutdown(wait=True)
        return list(self.outcomes)


def reply_gap(outcomes: list[Outcome], start: float, end: float) -> float:
    """The longest stretch within [start, end] in which no answer arrived (s): how long a fault froze replies."""
    arrivals = sorted(o.sent_at + o.latency_s for o in outcomes
                      if o.kind == "answered" and o.latency_s is not None and start <= o.sent_at + o.latency_s <= end)
    edges = [start, *arrivals, end]
    return max(b - a for a, b in zip(edges, edges[1:]))


def kinds(outcomes: list[Outcome]) -> dict[str, int]:
    return dict(Counter(o.kind for o in outcomes))


def reasons(outcomes: list[Outcome]) -> dict[str, int]:
    """What the queries that were not answered got, by kind and reason (the first words of the error)."""
    import re

    return dict(Counter(f"{o.kind}: {re.sub(r'[0-9a-f]{32}', '<id>', o.detail)[:70]}" for o in outcomes
                        if o.kind != "answered"))


def answered_in_time(outcomes: list[Outcome], timeout_s: float) -> int:
    """Queries answered (a reply without error) within ``timeout_s`` of their send."""
    return sum(1 for o in outcomes if o.kind == "answered" and o.latency_s is not None and o.latency_s <= timeout_s)


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def window_p(outcomes: list[Outcome], start: float, end: float, q: float) -> float | None:
    """The q-th percentile latency (s) of the queries sent in [start, end) that were answered."""
    return percentile([o.latency_s for o in outcomes if start <= o.sent_at < end and o.kind == "answered"], q)


def timeline(outcomes: list[Outcome], start: float, end: float, step_s: float = 1.0) -> list[str]:
    """Per ``step_s`` window of send times from ``start``: "t+<s>: <answered>/<sent> p99 <ms>" (what a fault did)."""
    out = []
    for at in np.arange(start, end, step_s):
        sent = [o for o in outcomes if at <= o.sent_at < at + step_s]
        answered = [o.latency_s for o in sent if o.kind == "answered"]
        p99 = f"{np.percentile(answered, 99) * 1000:.0f}" if answered else "-"
        out.append(f"t{at - start:+.0f}: {len(answered)}/{len(sent)} p99 {p99}")
    return out


def recovery_s(outcomes: list[Outcome], fault_at: float, target_s: float, window_s: float = 2.0,
               min_answered: float = 0.9, hold_s: float | None = None) -> float | None:
    """Seconds after ``fault_at`` from which every ``window_s`` window of queries (by send time) has its answered
    p99 under ``target_s`` and at least ``min_answered`` of its queries answered (a timeout counts as a miss), until
    the load ended (``hold_s``: for that long; a loaded host's later hiccup is no part of the fault); None when the
    load ended before that."""
    last = max((o.sent_at for o in outcomes), default=fault_at)
    starts = np.arange(fault_at, last - window_s + 1e-9, window_s)
    good = []
    for start in starts:
        sent = [o for o in outcomes if start <= o.sent_at < start + window_s]
        answered = [o.latency_s for o in sent if o.kind == "answered"]
        ok = bool(sent) and len(answered) >= min_answered * len(sent) and np.percentile(answered, 99) <= target_s
        good.append(ok)
    span = None if hold_s is None else max(1, int(round(hold_s / window_s)))
    for i in range(len(good)):
        held = good[i:] if span is None else good[i:i + span]
        if held and all(held) and (span is None or len(held) == span):
            return float(starts[i] - fault_at)
    return None


# -- a group's committed progress over time ------------------------------------------------------
@dataclass
class Progress:
    """Samples a group's committed offsets on one topic, per partition, every ``every_s``."""

    kafka: KafkaSettings
    topic: str
    group: str
    every_s: float = 0.25
    samples: list[tuple[float, tuple[int, ...]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self._consumer = KafkaConsumer(**self.kafka.client_kwargs(), group_id=self.group, enable_auto_commit=False)
        self.partitions = [TopicPartition(self.topic, p) for p in sorted(self._consumer.partitions_for_topic(self.topic))]
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one client, asked from the sampling thread and the caller's
        self._thread = threading.Thread(target=self._run, name="fleet-progress", daemon=True)

    def offsets(self) -> tuple[int, ...]:
        with self._lock:
            return tuple(self._consumer.committed(tp, timeout_ms=10_000) or 0 for tp in self.partitions)

    def committed(self) -> int:
        return sum(self.offsets())

    def ends(self) -> tuple[int, ...]:
        with self._lock:
            found = self._consumer.end_offsets(self.partitions)
        return tuple(found[tp] for tp in self.partitions)

    def end(self) -> int:
        return sum(self.ends())

    def start(self) -> Progress:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.monotonic(), self.offsets()))
            except Exception:  # noqa: BLE001 - a broker away: no sample (a gap reads as a pause)
                pass
            self._stop.wait(self.every_s)

    def longest_pause(self, start: float, end: float) -> float:
        """The longest stretch within [start, end] without the group's committed offsets moving at all (seconds)."""
        return _longest_still([(t, (sum(o),)) for t, o in self.samples], start, end)

    def longest_stall(self, start: float, end: float) -> float:
        """The longest stretch within [start, end] without some one partition's committed offset moving."""
        width = len(self.partitions)
        return max((_longest_still([(t, (o[i],)) for t, o in self.samples], start, end) for i in range(width)),
                   default=0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        with self._lock:
            self._consumer.close()


def _longest_still(samples: list[tuple[float, tuple[int, ...]]], start: float, end: float) -> float:
    points = [(t, o) for t, o in samples if start <= t <= end]
    if not points:
        return end - start
    longest, since, last = 0.0, start, points[0][1]
    for t, offsets in points[1:]:
        if offsets > last:
            longest, since, last = max(longest, t - since), t, offsets
    return max(longest, points[-1][0] - since)
