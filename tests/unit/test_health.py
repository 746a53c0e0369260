"""Worker HTTP endpoints: /metrics exposes the stage histograms, /readyz fails when any check fails."""

from __future__ import annotations

import json

from embedstream.workers.health import serve
from embedstream.workers.metrics import WorkerMetrics
from worker_rig import free_port, http_get


def test_endpoints_report_metrics_liveness_and_readiness():
    metrics = WorkerMetrics(model="m")
    metrics.observe_stage("forward", "online", 12.5)
    state = {"qdrant": True}

    def broken() -> bool:
        raise ConnectionError("down")

    port = free_port()
    server = serve(port, metrics.registry, alive=lambda: True,
                   checks={"qdrant": lambda: state["qdrant"], "broker": lambda: True}, host="127.0.0.1")
    try:
        code, body = http_get(port, "/metrics")
        assert code == 200 and b'embedstream_stage_duration_seconds_count{lane="online",stage="forward"} 1.0' in body
        assert http_get(port, "/healthz")[0] == 200
        code, body = http_get(port, "/readyz")
        assert code == 200 and json.loads(body)["ready"] is True
        state["qdrant"] = False
        code, body = http_get(port, "/readyz")
        assert code == 503 and json.loads(body)["checks"] == {"qdrant": False, "broker": True}
        assert http_get(port, "/nope")[0] == 404
    finally:
        server.shutdown()
    port = free_port()
    server = serve(port, metrics.registry, alive=lambda: False, checks={"broker": broken}, host="127.0.0.1")
    try:
        assert http_get(port, "/healthz")[0] == 503
        assert http_get(port, "/readyz")[0] == 503
    finally:
        server.shutdown()


def test_healthz_fails_with_the_reason_when_the_loop_is_alive_but_stuck():
    stuck = {"reason": None}
    port = free_port()
    server = serve(port, WorkerMetrics(model="m").registry, alive=lambda: True, checks={},
                   stalled=lambda: stuck["reason"])
    try:
        assert http_get(port, "/healthz") == (200, b'{"alive": true}')
        stuck["reason"] = "records waiting and none taken for 130 s"
        code, body = http_get(port, "/healthz")
        assert code == 503 and json.loads(body) == {"alive": False, "reason": stuck["reason"]}
    finally:
        server.shutdown()
