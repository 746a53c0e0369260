"""When a fresh online batch should wait for company, and for how long: a lane's ``LaneController``.

A batching window only pays when another request is likely to arrive inside it. Under sparse
traffic (one request now and then, the common case for a search box) waiting is pure added
latency: measured here, a fixed 2 ms window was 2.1 ms of every query's round trip. So the window
opens only while traffic is dense; otherwise the batch runs at once, and requests that arrive
during its forward pass form the next batch (continuous batching, as TEI and vLLM do).

How long the window is, is the controller's decision (``workers/admission.py``): a fixed
``batch_window_ms`` (policy ``fixed``, the old behaviour), or one steered by the lane's observed p95
against ``latency_target_ms`` and capped by the oldest request's deadline budget.
"""

from __future__ import annotations

from collections.abc import Callable

from embedstream.workers.admission import AdmissionConfig, LaneController


class BatchingWindow:
    """Tracks arrivals; says until when the oldest queued request may wait for others."""

    def __init__(self, window_ms: float = 2.0, controller: LaneController | None = None):
        self.controller = controller or LaneController("online", AdmissionConfig(policy="fixed",
                                                                                 fixed_window_ms=max(0.0, window_ms)))

    @classmethod
    def from_settings(cls, worker, lane: str = "online", target_ms: float | None = None) -> "BatchingWindow":
        """The window of ``lane`` as ``WorkerSettings`` configure it (policy, target, bounds)."""
        return cls(controller=LaneController(lane, AdmissionConfig.from_settings(worker, target_ms)))

    @property
    def window_s(self) -> float:
        return self.controller.window_ms / 1000

    def arrived(self, when: float, count: int) -> None:
        """A poll brought ``count`` new requests at ``when`` (``time.perf_counter`` seconds)."""
        self.controller.arrived(when, count)

    def deadline(self, oldest_received: float, oldest_deadline_s: float | None = None, queued_tokens: int = 0) -> float:
        """The time a batch whose oldest request arrived at ``oldest_received`` may keep gathering until."""
        return self.controller.wait_until(oldest_received, oldest_deadline_s, queued_tokens)

    def gather(self, oldest_received: float, poll: Callable[[], int], full: Callable[[], bool],
               oldest_deadline_s: float | None = None, queued_tokens: Callable[[], int] = lambda: 0) -> None:
        """Poll for more requests until the deadline passes or the batch is full.

        ``poll`` fetches briefly and returns how many records it queued; ``full`` says whether the
        queue already fills one pass; ``oldest_deadline_s`` (perf_counter seconds) bounds the wait by
        the oldest request's own deadline budget."""
        self.controller.gather(oldest_received, poll, full, oldest_deadline_s, queued_tokens)
