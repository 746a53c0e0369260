"""Admission control: refuse with 429 before a request joins a queue that is already too long.

Two signals: the gateway's own requests in flight (exact, free) and the consumer lag of the lane's
worker group on its request topics (records published but not yet committed), measured in the
background by one long-lived probe per lane so a request never waits on a broker round trip.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from confluent_kafka import Consumer, TopicPartition

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.gateway.errors import ApiError

log = logs.get("embedstream.gateway")


@dataclass
class LaneLag:
    """Records the ``group`` has not committed on ``topics`` (the worker group's backlog)."""

    group: str
    topics: list[str]
    records: int = 0
    _consumer: Consumer | None = field(default=None, repr=False)

    def measure(self, settings: KafkaSettings) -> int:
        if self._consumer is None:  # librdkafka; never subscribes: it only reads the group's committed offsets
            self._consumer = Consumer(settings.librdkafka_config(**{
                "group.id": self.group, "enable.auto.commit": False, "client.id": "embedstream-gateway-lag"}))
        listed = self._consumer.list_topics(timeout=10).topics
        parts = [TopicPartition(t, p) for t in self.topics if t in listed for p in sorted(listed[t].partitions)]
        committed = self._consumer.committed(parts, timeout=10) if parts else []
        self.records = sum(max(0, self._consumer.get_watermark_offsets(tp, timeout=10)[1] - max(tp.offset, 0))
                           for tp in committed)
        return self.records

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


class LagMonitor:
    """Measures every lane's lag each ``interval_s`` in a daemon thread; a failed probe keeps the last value."""

    def __init__(self, settings: KafkaSettings, interval_s: float, collection: str):
        from embedstream.producers.search_routing import search_group, search_topic

        self.settings = settings
        self.interval_s = interval_s
        self.lanes = {
            "embed": LaneLag(settings.group_online, [settings.topic_queries]),
            "rerank": LaneLag(settings.group_rerank, [settings.topic_rerank, settings.topic_search]),
            # the default collection's searches: its deployment's search lanes
            "search": LaneLag(search_group(settings, collection), [search_topic(settings, collection)]),
        }
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-lag", daemon=True)

    def start(self) -> LagMonitor:
        self._thread.start()
        return self

    def lag(self, lane: str) -> int:
        return self.lanes[lane].records

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, lane in self.lanes.items():
                try:
                    lane.measure(self.settings)
                except Exception as exc:  # noqa: BLE001 - a probe failure must not stop admission
                    log.warning("lag probe failed", lane=name, error=str(exc)[:300])
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for lane in self.lanes.values():
            lane.close()


class Admission:
    """Counts Kafka requests in flight per lane and refuses new ones past the bounds (event-loop only)."""

    def __init__(self, max_inflight: int, max_lag: int, retry_after_s: int, monitor: LagMonitor | None):
        self.max_inflight, self.max_lag, self.retry_after_s = max_inflight, max_lag, retry_after_s
        self.monitor = monitor
        self.inflight: dict[str, int] = {"embed": 0, "rerank": 0, "search": 0}

    def enter(self, lane: str, count: int) -> None:
        """Reserve ``count`` requests on ``lane`` or raise 429; pair with :meth:`leave`."""
        total = sum(self.inflight.values())
        if total and total + count > self.max_inflight:
            raise ApiError(429, "overloaded", f"{total} requests in flight at the gateway (limit {self.max_inflight}); "
                           f"retry later", retry_after_s=self.retry_after_s)
        lag = self.monitor.lag(lane) if self.monitor is not None else 0
        if lag > self.max_lag:
            raise ApiError(429, "overloaded", f"the {lane} lane is {lag} requests behind (limit {self.max_lag}); retry later",
                           retry_after_s=self.retry_after_s)
        self.inflight[lane] += count

    def leave(self, lane: str, count: int) -> None:
        self.inflight[lane] -= count
