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

    def to(self, device: torch.device) -> "PackedBatch":
        return PackedBatch(
            self.input_ids.to(device, non_blocking=True),
            self.token_type_ids.to(device, non_blocking=True),
            self.position_ids.to(device, non_blocking=True),
            self.cu_seqlens.to(device, non_blocking=True),
            self.lengths,
            self.groups,
            self.order,
            self.prompt_tokens,
        )


def pack_sequences(items: list[Tokenized]) -> PackedBatch:
    """Concatenate token ids without padding, grouping equal lengths together."""
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
        input_ids=torch.tensor(ids, dtype=torch.long),
        token_type_ids=torch.tensor(types, dtype=torch.long),
        position_ids=torch.tensor(positions, dtype=torch.long),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        lengths=lengths,
        groups=groups,
        order=order,
        prompt_tokens=[items[i].prompt_tokens for i in order] if any(item.prompt_tokens for item in items) else None,
    )
