"""The packed (padding-free) batch layout: all sequences concatenated into one [total_tokens] row.

Sequences are ordered by length inside the batch so that sequences of equal length sit next to each
other; attention can then run on each equal-length group as one dense [n, L] block without any
gather or padding. ``order`` maps packed position back to the caller's item order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embedstream.engine.tokenize import Tokenized


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [T] int64
    token_type_ids: torch.Tensor  # [T] int64
    position_ids: torch.Tensor  # [T] int64, restarting at 0 for every sequence
    cu_seqlens: torch.Tensor  # [B+1] int32, cumulative sequence starts
    lengths: list[int]  # per packed sequence
    groups: list[tuple[int, int, int]]  # (first token, sequence count, length) of each equal-length run
    order: list[int]  # order[k] = caller index of packed sequence k
    prompt_tokens: list[int] | None = None  # per packed sequence, only when some prompt is left out of pooling

    @property
    def total_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def max_len(self) -> int:
        return max(self.lengths)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The per-token and per-sequence tensors a forward pass reads (what moves to the device)."""
        return self.input_ids, self.token_type_ids, self.position_ids, self.cu_seqlens

    def _with(self, tensors: tuple[torch.Tensor, ...]) -> "PackedBatch":
        return PackedBatch(*tensors, self.lengths, self.groups, self.order, self.prompt_tokens)

    def to(self, device: torch.device, non_blocking: bool = True) -> "PackedBatch":
        """The same batch on ``device``; from pinned memory the copies are asynchronous."""
        return self._with(tuple(t.to(device, non_blocking=non_blocking) for t in self.tensors()))

    def pin_memory(self) -> "PackedBatch":
        """The batch in page-locked host memory (CUDA only), so host -> device copies run async."""
        return self._with(tuple(t.pin_memory() for t in self.tensors()))

    def is_pinned(self) -> bool:
        return all(t.is_pinned() for t in self.tensors())


def _host_tensor(values: list[int], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
    if not pinned:
        return torch.tensor(values, dtype=dtype)
    out = torch.empty(len(values), dtype=dtype, pin_memory=True)  # filled in place: no second host copy
    out.numpy()[:] = values
    return out


def pack_sequences(items: list[Tokenized], pin_memory: bool = False) -> PackedBatch:
    """Concatenate token ids without padding, grouping equal lengths together.

    ``pin_memory`` (for a CUDA runner: ``ModelRunner.pack``) builds the tensors straight into
    page-locked memory so their copy to the GPU is asynchronous and can overlap a forward pass."""
    if not items:
        raise ValueError("cannot pack an empty batch")
    order = sorted(range(len(items)), key=lambda i: -len(items[i]))
    ids: list[int] = []
    types: list[int] = []
    positions: list[int] = []
    lengths: list[int] = []
    groups: list[tuple[int, int, int]] = []
    for i in order:
        item = items[i]
        n = len(item)
        if groups and groups[-1][2] == n:
            start, count, _ = groups[-1]
            groups[-1] = (start, count + 1, n)
        else:
            groups.append((len(ids), 1, n))
        ids.extend(item.ids)
        types.extend(item.type_ids)
        positions.extend(range(n))
        lengths.append(n)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return PackedBatch(
        input_ids=_host_tensor(ids, torch.long, pin_memory),
        token_type_ids=_host_tensor(types, torch.long, pin_memory),
        position_ids=_host_tensor(positions, torch.long, pin_memory),
        cu_seqlens=_host_tensor(cu, torch.int32, pin_memory),
        lengths=lengths,
        groups=groups,
        order=order,
        prompt_tokens=[items[i].prompt_tokens for i in order] if any(item.prompt_tokens for item in items) else None,
    )
