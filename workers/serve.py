"""Run a worker as a process: health/metrics server, signals, GC freeze, exit status.

The loop runs in a thread; SIGTERM/SIGINT stop it after a final commit of finished work. A worker
whose loop ended on an error exits non-zero with the reason (an orchestrator restarts it and the
log says why), instead of a silent exit 0.
"""

from __future__ import annotations

import signal
import sys
import threading

from embedstream import logs
from embedstream.gcfreeze import freeze_startup_objects
from embedstream.workers.health import serve
from embedstream.workers.loop import WorkerLoop

log = logs.get("embedstream.worker")


def run_until_signalled(worker: WorkerLoop, metrics_port: int | None, host: str | None = None) -> None:
    """Serve /healthz /readyz /metrics, run the loop in a thread, stop cleanly on SIGTERM/SIGINT.

    The endpoints listen on ``host``, default ``EMBEDSTREAM_WORKER__HEALTH_HOST`` (127.0.0.1; compose: 0.0.0.0).
    Raises ``SystemExit`` with the reason when the loop ended on an error rather than a signal."""
    thread = threading.Thread(target=worker.run, name=worker.name)
    server = None
    if metrics_port:
        checks = {"model": lambda: worker.ready.is_set(), **worker.readiness_checks()}
        server = serve(metrics_port, worker.metrics.registry, alive=lambda: thread.is_alive(), checks=checks,
                       host=host or worker.tuning.health_host, stalled=worker.stalled,
                       details=worker.readiness_details)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: worker.stop())
    sys.setswitchinterval(worker.tuning.gil_switch_interval_ms / 1000)
    frozen = freeze_startup_objects()  # the model is loaded: no full GC walks it mid-request
    log.info("startup objects frozen for the garbage collector", objects=frozen)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    if server:
        server.shutdown()
    if worker.failure is not None:
        failure = worker.failure
        raise SystemExit(f"{worker.name} stopped on an error: {type(failure).__name__}: {str(failure)[:500]}")
    log.info(f"{worker.name} stopped")
