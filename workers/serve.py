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
from embedstream.producers.topics import is_project_topic, replication_status
from embedstream.workers.health import PeriodicReport, serve
from embedstream.workers.loop import WorkerLoop

log = logs.get("embedstream.worker")


def run_until_signalled(worker: WorkerLoop, metrics_port: int | None, host: str | None = None,
                        companions: tuple[WorkerLoop, ...] = ()) -> None:
    """Serve /healthz /readyz /metrics, run the loop in a thread, stop cleanly on SIGTERM/SIGINT.

    ``companions`` are loops of the same process with their own lanes (the embed worker's search lane),
    each on its own thread: one ending stops them all, and readiness and liveness cover them too.
    The endpoints listen on ``host``, default ``EMBEDSTREAM_WORKER__HEALTH_HOST`` (127.0.0.1; compose: 0.0.0.0).
    Raises ``SystemExit`` with the reason when a loop ended on an error rather than a signal."""
    loops = (worker, *companions)
    threads = [threading.Thread(target=loop.run, name=loop.name) for loop in loops]
    server = None
    if metrics_port:
        checks = {"model": lambda: worker.ready.is_set(), **worker.readiness_checks()}
        for companion in companions:
            checks.update({f"{companion.name}: {name}": check for name, check in companion.readiness_checks().items()})

        kafka = worker.kafka  # the project's topics this process reads or dead-letters to: their replication
        topics = sorted({kafka.topic_dead_letters, *(t for loop in loops for lane in loop.lanes.values()
                                                     for t in lane.topics if is_project_topic(kafka, t))})
        replication = PeriodicReport(lambda: replication_status(kafka, topics), registry=worker.metrics.registry).start()

        def details() -> dict:
            merged: dict = dict(replication.last)  # reported, never failing readiness (workers/health.py says why)
            for loop in loops:
                for key, value in loop.readiness_details().items():
                    merged.setdefault(key, {}).update(value)
            return merged

        def stalled() -> str | None:
            return next((reason for loop in loops if (reason := loop.stalled()) is not None), None)

        server = serve(metrics_port, worker.metrics.registry, alive=lambda: all(t.is_alive() for t in threads),
                       checks=checks, host=host or worker.tuning.health_host, stalled=stalled, details=details)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: [loop.stop() for loop in loops])
    sys.setswitchinterval(worker.tuning.gil_switch_interval_ms / 1000)
    frozen = freeze_startup_objects()  # the model is loaded: no full GC walks it mid-request
    log.info("startup objects frozen for the garbage collector", objects=frozen)
    for thread in threads:
        thread.start()
    while all(thread.is_alive() for thread in threads):
        threads[0].join(0.5)
    for loop in loops:  # one ended (a signal, or an error): the others stop too
        loop.stop()
    for thread in threads:
        thread.join()
    if server:
        server.shutdown()
        replication.stop()
    for loop in loops:
        if loop.failure is not None:
            failure = loop.failure
            raise SystemExit(f"{loop.name} stopped on an error: {type(failure).__name__}: {str(failure)[:500]}")
    log.info(f"{worker.name} stopped")
