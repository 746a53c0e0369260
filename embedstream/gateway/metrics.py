"""Prometheus metrics of one gateway process, on its own registry (served at ``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("embedstream_gateway_requests_total", "HTTP requests answered", ["route", "status"], registry=r)
        self.duration = Histogram("embedstream_gateway_request_duration_seconds", "HTTP request time at the gateway",
                                  ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.inputs = Counter("embedstream_gateway_inputs_total", "Texts (or documents) carried to the lanes", ["route"],
                              registry=r)
        self.inflight = Gauge("embedstream_gateway_inflight", "Kafka requests awaiting a reply", ["lane"], registry=r)
        self.lag = Gauge("embedstream_gateway_lane_lag", "Records the lane's worker group has not committed", ["lane"],
                         registry=r)

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route=route, status=str(status)).inc()
        self.duration.labels(route=route).observe(seconds)

    def watch(self, admission) -> None:
        """Gauges read at scrape time from the admission counters and the lag monitor."""
        for lane in admission.inflight:
            self.inflight.labels(lane=lane).set_function(lambda lane=lane: admission.inflight[lane])
            if admission.monitor is not None:
                self.lag.labels(lane=lane).set_function(lambda lane=lane: admission.monitor.lag(lane))

    def render(self) -> bytes:
        return generate_latest(self.registry)
