"""HTTP endpoints of a worker: /metrics (Prometheus), /healthz (loop alive and making progress), /readyz (can serve).

Alive means the loop thread runs and is not stuck (``stalled`` names why it is: no step, or records
waiting and none taken, for too long). Ready means: model loaded, every lane a member of its group,
broker and Qdrant reachable; checks are callables so each worker kind supplies its own. Served from
a daemon thread with the standard library only.

``/readyz`` also *reports*, without failing on it, the worker's topics whose replication factor or
``min.insync.replicas`` is below the settings (:class:`PeriodicReport`, ``producers/topics.replication_status``;
gauge ``embedstream_topics_under_replicated``). Report only, because readiness gates what a restart or an
orchestrator can fix and what it must not make worse: a topic created small stays small whatever the pod
does (a reassignment fixes it, not a restart), every worker of every lane would go unready at once (a
rolling upgrade stalls, a PodDisruptionBudget blocks every eviction), and the worker still serves every
record correctly. What it risks is durability, which is an alert's job (the gauge), not the probe's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Gauge, generate_latest


class PeriodicReport:
    """A report computed off the request path every ``interval_s`` by a daemon thread (``stop()`` ends it);
    ``/readyz`` shows its last result. ``report()`` returns a dict; a list under ``count_key`` sets the gauge
    ``gauge_name`` (its length) on ``registry``."""

    def __init__(self, report: Callable[[], dict], interval_s: float = 60.0, registry: CollectorRegistry | None = None,
                 gauge_name: str = "embedstream_topics_under_replicated", count_key: str = "under_replicated"):
        self._report, self.interval_s, self.count_key = report, interval_s, count_key
        self.last: dict = {}
        self._stop = threading.Event()
        self._gauge = Gauge(gauge_name, "Project topics whose replication factor or min.insync.replicas is below the "
                            "settings (reported by /readyz, not failing it)", registry=registry) if registry else None
        self._thread = threading.Thread(target=self._run, daemon=True, name="readyz-report")

    def start(self) -> "PeriodicReport":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.last = self._report()
            except Exception as exc:  # noqa: BLE001 - a report says what it could not tell
                self.last = {"report_failed": f"{type(exc).__name__}: {str(exc)[:300]}"}
            if self._gauge is not None and isinstance(self.last.get(self.count_key), list):
                self._gauge.set(len(self.last[self.count_key]))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()


def serve(port: int, registry: CollectorRegistry, alive: Callable[[], bool],
          checks: dict[str, Callable[[], bool]], host: str = "127.0.0.1",
          stalled: Callable[[], str | None] = lambda: None,
          details: Callable[[], dict] = dict) -> ThreadingHTTPServer:
    """Start the endpoints in a daemon thread; returns the server (``shutdown()`` to stop).

    ``details`` adds what /readyz should say besides the checks (the topics a lane waits for)."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                reason = stalled() if alive() else "the loop thread has ended"
                body = {"alive": reason is None, **({"reason": reason} if reason else {})}
                self._send(503 if reason else 200, json.dumps(body).encode())
            elif self.path == "/readyz":
                results = {}
                for name, check in checks.items():
                    try:
                        results[name] = bool(check())
                    except Exception:  # noqa: BLE001 - a failing probe means "not ready"
                        results[name] = False
                ok = all(results.values())
                try:
                    extra = details()
                except Exception:  # noqa: BLE001 - the checks already say what matters
                    extra = {}
                self._send(200 if ok else 503, json.dumps({"ready": ok, "checks": results, **extra}).encode())
            else:
                self._send(404, b'{"error": "not found"}')

        def log_message(self, *args) -> None:  # probes are frequent: keep the logs for real events
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name=f"health-{port}").start()
    return server
