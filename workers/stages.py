"""A worker run as overlapped stages: intake, model, output, each on its own thread.

The serial loop (``WorkerLoop``) polls, decodes, tokenises, runs the model, writes and commits one
step after another, so the model idles while the host works. A staged worker runs the same steps
as three threads joined by bounded queues:

* **intake** (the thread that calls ``run``): everything that touches the Kafka consumers, which are
  not thread-safe: poll, decode, validate, tokenise, push into the lane queues, pause partitions
  while a queue is over its bound (polling on, so the group keeps the member), commit what finished,
  and the rebalance callbacks;
* **model**: one thread owns the device: forms batches, runs the forward pass, answers queries,
  hands chunks and deletes on;
* **output**: writes to the sink in log order and marks records finished only after the write.

Backpressure runs end to end through the bounded queues: a slow sink fills the output queue, the
model stage blocks on it, the lane queues fill, intake pauses its partitions. No stage but intake
touches a consumer. An exception that escapes a stage ends the worker with the reason, as one that
escapes a serial step does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from embedstream import logs
from embedstream.workers.loop import WorkerLoop

log = logs.get("embedstream.worker")

STAGE_JOIN_TIMEOUT_S = 30.0  # a stage finishing its step at stop (a forward pass, one write)


class Stage:
    """One worker stage on its own thread: ``step`` again and again until the worker halts.

    ``step`` returns whether it did work. The thread records when its current step began (for
    /healthz: a stage stuck inside one step is a stalled worker) and the error that ended it."""

    def __init__(self, name: str, step: Callable[[], object], halted: Callable[[], bool],
                 on_failure: Callable[[Stage, BaseException], None]):
        self.name = name
        self._step = step
        self._halted = halted
        self._on_failure = on_failure
        self.step_started: float | None = None  # time.monotonic() of the step in progress
        self.thread = threading.Thread(target=self._run, name=f"embedstream-{name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def touch(self) -> None:
        """The step is waiting on purpose (backing off from a failed write): not stuck."""
        if self.step_started is not None:
            self.step_started = time.monotonic()

    def _run(self) -> None:
        try:
            while not self._halted():
                self.step_started = time.monotonic()
                self._step()
                self.step_started = None
        except BaseException as exc:  # noqa: BLE001 - reported to the worker, which ends with the reason
            self.step_started = None
            self._on_failure(self, exc)

    def join(self, timeout_s: float) -> bool:
        """Whether the thread ended within ``timeout_s``."""
        if self.thread.ident is None:
            return True
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


class StagedWorkerLoop(WorkerLoop):
    """``WorkerLoop`` whose ``run_once`` is the intake step, with downstream stages on threads.

    Subclasses build their stages in ``stages()`` (each a ``Stage``); ``run_once`` does the intake.
    Stop: intake stops polling, each stage ends its step and, if it drains, what is queued for it
    (``drained``); the lanes then commit what finished and close."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._halt = threading.Event()  # a stage failed: every other stage gives up too
        self._stage_failure: BaseException | None = None
        self.running_stages: list[Stage] = []

    # -- what subclasses provide ----------------------------------------------------------------
    def stages(self) -> list[Stage]:
        raise NotImplementedError

    def new_stage(self, name: str, step: Callable[[], object], halted: Callable[[], bool] | None = None) -> Stage:
        """A stage that runs ``step`` until the worker stops (or until ``halted`` says so)."""
        return Stage(name, step, halted or self.stopping, self._stage_failed)

    # -- lifecycle ------------------------------------------------------------------------------
    def stopping(self) -> bool:
        return self.stop_event.is_set() or self._halt.is_set()

    def _stage_failed(self, stage: Stage, exc: BaseException) -> None:
        if self.stopping():
            log.info(f"{stage.name} stage stopped while its step was in progress",
                     error=f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        log.error(f"{self.name}: {stage.name} stage failed", error=f"{type(exc).__name__}: {str(exc)[:500]}")
        self._stage_failure = exc
        self._halt.set()

    def _loop(self) -> None:
        """Start the stages, run intake on this thread; a stage's failure ends the loop with its error."""
        self.running_stages = self.stages()
        for stage in self.running_stages:
            stage.start()
        try:
            while not self.stop_event.is_set():
                if self._stage_failure is not None:
                    raise self._stage_failure
                self._stepped(self.run_once())
        except BaseException:
            self._halt.set()  # intake or a stage failed: no stage drains
            raise
        finally:
            for stage in self.running_stages:
                if not stage.join(STAGE_JOIN_TIMEOUT_S):
                    log.error(f"{stage.name} stage did not stop in time; closing without it",
                              timeout_s=STAGE_JOIN_TIMEOUT_S)
        if self._stage_failure is not None:
            raise self._stage_failure

    # -- health ---------------------------------------------------------------------------------
    def progressed(self) -> None:
        """A stage moved records on (or waits out a failed write on purpose): /healthz's progress."""
        self.last_progress = time.monotonic()

    def stalled(self) -> str | None:
        """The intake's own checks, and any stage stuck inside one step longer than ``stall_timeout_s``."""
        bound = self.tuning.stall_timeout_s
        now = time.monotonic()
        for stage in self.running_stages:
            started = stage.step_started
            if started is not None and now - started > bound:
                return f"no loop step for {now - started:.0f} s ({stage.name} stage)"
        return super().stalled()

    def current_stage(self) -> Stage | None:
        me = threading.current_thread()
        return next((stage for stage in self.running_stages if stage.thread is me), None)

    def _wait_before_retry(self, delay: float, held: list) -> None:
        """A stage's failed write waits without touching a consumer: the bounded queues hold intake back."""
        stage = self.current_stage()
        if stage is None:  # a step driven by hand on the intake thread: the serial way
            return super()._wait_before_retry(delay, held)
        end = time.monotonic() + delay
        while not self.stopping() and (left := end - time.monotonic()) > 0:
            self._halt.wait(min(left, 0.5))
            stage.touch()
            self.progressed()  # waiting out an outage on purpose is progress
