"""Moving packed batches to the runner's device and results back, once per batch.

On CUDA a batch is built in (or copied to) page-locked host memory and copied with
``non_blocking=True`` on a side stream; the forward waits on an event, not on the host, so the
next batch's copy can run while the current forward does (``stage`` it before ``embed``-ing the
current one, or iterate ``staged_ahead``). Results come back through one pinned, non-blocking copy
and one synchronisation per batch. On CPU every step is the identity: no pinning, no copies.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from embedstream.engine.packed import PackedBatch


@dataclass
class StagedBatch:
    """A batch whose copy to the device has been started: ``batch`` lives on the device (it is the
    host batch itself on CPU); ``ready`` is recorded on the copy stream when the copy is done."""

    batch: PackedBatch
    ready: torch.cuda.Event | None = None


class DeviceFeeder:
    """Host <-> device copies for one device (one per runner)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._copy_stream = torch.cuda.Stream(device) if self.cuda else None

    @property
    def pins_memory(self) -> bool:
        """Whether batches should be packed into page-locked memory (``pack_sequences(pin_memory=)``)."""
        return self.cuda

    def stage(self, batch: PackedBatch) -> StagedBatch:
        """Start the batch's copy to the device and return at once (the identity on CPU)."""
        if not self.cuda:
            return StagedBatch(batch)
        host = batch if batch.is_pinned() else batch.pin_memory()  # pageable memory would copy synchronously
        with torch.cuda.stream(self._copy_stream):
            moved = host.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return StagedBatch(moved, ready)

    def wait(self, staged: StagedBatch) -> PackedBatch:
        """The device batch, with the current stream ordered after its copy (the host does not wait)."""
        if staged.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(staged.ready)
            for tensor in staged.batch.tensors():  # allocated on the copy stream, read on this one
                tensor.record_stream(stream)
        return staged.batch

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on the host: one pinned non-blocking copy, then one synchronisation (CPU: itself)."""
        if not self.cuda:
            return tensor
        out = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        out.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return out

    def spans(self) -> "BatchSpans":
        return BatchSpans(self.cuda)


class BatchSpans:
    """Splits one batch's wall time in two at ``mark()`` (forward | head + copy back) without a
    synchronisation of its own: CUDA events on the GPU, ``perf_counter`` on CPU. Read ``split_ms``
    after the result is on the host."""

    def __init__(self, cuda: bool):
        self.start = self.mid = time.perf_counter()
        self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) if cuda else None
        if self.events is not None:
            self.events[0].record()

    def mark(self) -> None:
        if self.events is not None:
            self.events[1].record()
        else:
            self.mid = time.perf_counter()

    def split_ms(self) -> tuple[float, float]:
        total = (time.perf_counter() - self.start) * 1000
        if self.events is not None:
            first = self.events[0].elapsed_time(self.events[1])
        else:
            first = (self.mid - self.start) * 1000
        return first, max(total - first, 0.0)


def staged_ahead(stage: Callable[[PackedBatch], StagedBatch], batches: Iterable[PackedBatch]) -> Iterator[StagedBatch]:
    """Yield staged batches, starting batch i+1's copy before batch i is handed out, so the copy
    runs under batch i's forward: ``for staged in staged_ahead(runner.stage, batches): runner.embed(staged, t)``."""
    pending: StagedBatch | None = None
    for batch in batches:
        following = stage(batch)
        if pending is not None:
            yield pending
        pending = following
    if pending is not None:
        yield pending
