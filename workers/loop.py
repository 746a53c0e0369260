"""The loop every worker runs: lanes in, one step at a time, writes retried by failure kind, commits out.

A worker subclass says what one step does (``run_once``) and which lanes it reads; this base
owns the rest: the dead-letter/reply outbox, start-up (warm-up, then ready), the stop event, the
final commit and close, readiness checks, and ``write_with_retry`` which decides what a failed
write means for its records (``lane.failure_kind``): transient failures back off with every lane
paused (the group keeps the member, nothing more is fetched, nothing commits); permanent ones,
and unknown ones that outlast ``record_retry_limit_s``, come back as the reason to dead-letter.
The rerank worker and the CDC bridge run this serial loop; the embed worker runs its staged variant
(``workers/stages.py``: intake, model and output on their own threads).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from embedstream import logs
from embedstream.config import KafkaSettings, WorkerSettings
from embedstream.kafka_access import check_kafka_access
from embedstream.schemas import ErrorInfo
from embedstream.workers.transport.kafka_io import with_served_group_protocol
from embedstream.workers.transport.lane import PERMANENT, TRANSIENT, Lane, failure_kind
from embedstream.workers.transport.outbox import Outbox

log = logs.get("embedstream.worker")

ABANDONED = ErrorInfo(code="abandoned", message="the partition was revoked while the write was retried")


def new_worker_id(kind: str) -> str:
    """host-kind-thread: unique per worker in a process, readable in dead letters and client ids."""
    return f"{socket.gethostname()}-{kind}-{threading.get_ident()}"


class WorkerLoop:
    """Lanes + outbox + run/stop/close; subclasses implement ``run_once``."""

    name = "worker"

    def __init__(self, kafka: KafkaSettings, tuning: WorkerSettings, metrics, worker_id: str):
        self.tuning = tuning
        self.metrics = metrics
        self.worker_id = worker_id
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.failure: BaseException | None = None  # why the loop ended, when it did not end by stop()
        # Fail fast, naming why (KafkaAccessError): a client alone retries a refused login forever, saying
        # why only to its error callback, and a consumer denied a topic polls nothing, silently.
        access = check_kafka_access(kafka, tuning.access_check_timeout_s, topics=[kafka.topic_dead_letters])
        self.kafka = with_served_group_protocol(kafka, access.group_protocols)  # what this broker serves
        self.outbox = Outbox(kafka, worker_id, metrics)
        self.lanes: dict[str, Lane] = {}
        self.last_step = self.last_progress = time.monotonic()  # /healthz: liveness is progress

    def add_lane(self, name: str, topics: list[str], group: str, max_poll_records: int,
                 full: Callable = lambda _q: False, online: bool = False, librdkafka: bool | None = None,
                 **consumer_extra) -> Lane:
        """``online``: a latency lane, consumed with ``kafka.online_client``; otherwise ``kafka.bulk_client``
        (unless ``librdkafka`` says which)."""
        check_kafka_access(self.kafka, self.tuning.access_check_timeout_s, topics=topics)
        lane = Lane(name, self.kafka, topics, group, self.outbox, worker_id=self.worker_id,
                    max_poll_records=max_poll_records, full=full, flush_timeout_s=self.tuning.flush_timeout_s,
                    librdkafka=self._librdkafka(online) if librdkafka is None else librdkafka,
                    **consumer_extra)
        self.lanes[name] = lane
        return lane

    def _librdkafka(self, online: bool) -> bool:
        return (self.kafka.online_client if online else self.kafka.bulk_client) == "librdkafka"

    # -- what subclasses provide ----------------------------------------------------------------
    def run_once(self) -> int:
        raise NotImplementedError

    def warm_up(self) -> None:
        """Work done before the worker reports ready (e.g. building kernels for query shapes)."""

    def started_fields(self) -> dict:
        """What the start-up log line says about this worker."""
        return {}

    def readiness_checks(self) -> dict[str, Callable[[], bool]]:
        """/readyz: every lane a member of its group and its broker reachable (subclasses add their stores)."""
        return {"broker": lambda: all(lane.reachable() for lane in self.lanes.values()),
                "joined": lambda: all(lane.joined() for lane in self.lanes.values()),
                "topics": lambda: not any(lane.missing for lane in self.lanes.values())}

    def readiness_details(self) -> dict:
        """/readyz's body besides the checks: the topics each lane waits for (it serves the others meanwhile)."""
        missing = {name: lane.missing for name, lane in self.lanes.items() if lane.missing}
        return {"missing_topics": missing} if missing else {}

    def stalled(self) -> str | None:
        """Why the loop is alive but stuck, or None: /healthz fails on it (an orchestrator restarts the worker).

        Progress is a step within ``stall_timeout_s`` that took records, or found none behind the log
        end; a deliberate wait (backing off from a failed write) counts as progress. Found necessary:
        a consumer hung in kafka-python's coordinator lookup kept the loop thread alive and /readyz
        green while nothing was consumed."""
        bound = self.tuning.stall_timeout_s
        now = time.monotonic()
        if now - self.last_step > bound:
            return f"no loop step for {now - self.last_step:.0f} s"
        if now - self.last_progress > bound:
            return f"records waiting and none taken for {now - self.last_progress:.0f} s"
        return None

    def _stepped(self, taken: int) -> None:
        """After each step: taken records, or no lag anywhere, is progress."""
        self.last_step = time.monotonic()
        if taken or not any(lane.last_lag for lane in self.lanes.values()):
            self.last_progress = self.last_step

    def close_resources(self) -> None:
        """Close what the subclass owns besides lanes and outbox (stores, publishers)."""

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Loop until ``stop()``; an error that escapes a step ends the loop and is kept in ``failure``."""
        try:
            self.warm_up()
            log.info(f"{self.name} started", **self.started_fields())
            self.ready.set()
            self.last_step = self.last_progress = time.monotonic()
            self._loop()
        except BaseException as exc:
            if not self.stop_event.is_set():
                self.failure = exc
                log.error(f"{self.name} cannot continue", error=f"{type(exc).__name__}: {str(exc)[:500]}")
            raise
        finally:
            self.close()

    def _loop(self) -> None:
        """The serial loop: one ``run_once`` after another on this thread (a staged worker runs threads)."""
        while not self.stop_event.is_set():
            self._stepped(self.run_once())

    def stop(self) -> None:
        self.stop_event.set()

    def stopping(self) -> bool:
        """Whether work in progress should give up (stop asked; a staged worker: a stage failed too)."""
        return self.stop_event.is_set()

    def commit(self, wait: bool = True) -> None:
        for lane in self.lanes.values():
            lane.commit(wait)

    def close(self) -> None:
        for lane in self.lanes.values():
            lane.close()
        try:
            self.close_resources()
        finally:
            self.outbox.close()

    # -- writes ---------------------------------------------------------------------------------
    def write_with_retry(self, write: Callable[[], object], what: str, on_failure: Callable[[], None],
                         limit_s: float | None = None, abandoned: Callable[[], bool] | None = None) -> ErrorInfo | None:
        """Run ``write`` until it succeeds (None) or fails permanently for its records (the reason).

        Transient failures back off (``sink_backoff_s``) with every lane held, for as long as it
        takes; unknown ones too, until ``limit_s`` (default ``record_retry_limit_s``); a permanent
        one returns at once. ``abandoned`` (a staged worker: every record's partition was revoked)
        ends the retries with ``ABANDONED``: the new owner writes those records.
        ``on_failure`` counts each failed attempt (the sink or publish failure metric)."""
        delay, ceiling = self.tuning.sink_backoff_s
        limit_s = self.tuning.record_retry_limit_s if limit_s is None else limit_s
        first_failure: float | None = None
        held: list[tuple[Lane, list]] = []
        try:
            while True:
                try:
                    write()
                    return None
                except Exception as exc:  # noqa: BLE001 - classified below; nothing escapes but a stop
                    if self.stopping():
                        raise
                    if abandoned is not None and abandoned():
                        return ABANDONED
                    on_failure()
                    kind = failure_kind(exc)
                    first_failure = first_failure if first_failure is not None else time.monotonic()
                    lasting = time.monotonic() - first_failure >= limit_s
                    reason = f"{type(exc).__name__}: {str(exc)[:500]}"
                    if kind == PERMANENT or (kind != TRANSIENT and lasting):
                        log.warning(f"{what} failed permanently", kind=kind, error=reason)
                        code = "write_rejected" if kind == PERMANENT else "write_failed_repeatedly"
                        return ErrorInfo(code=code, message=f"{what} failed: {reason}")
                    log.warning(f"{what} failed; backing off", kind=kind, error=reason[:300], retry_in_s=delay)
                    self._wait_before_retry(delay, held)
                    delay = min(delay * 2, ceiling)
        finally:
            for lane, assigned in held:
                lane.release(assigned)

    def _wait_before_retry(self, delay: float, held: list[tuple[Lane, list]]) -> None:
        """Serial loop: every lane held (paused, membership kept by polling) while a failed write waits."""
        if not held:
            held.extend((lane, lane.hold()) for lane in self.lanes.values())
        end = time.monotonic() + delay
        while time.monotonic() < end and not self.stop_event.is_set():
            for lane, _ in held:
                lane.keep_membership()
            self._stepped(1)  # waiting out an outage on purpose is progress
