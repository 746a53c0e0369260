"""Pooling: one vector per sequence from the packed hidden states [T, H].

CLS takes each sequence's first token, last-token its final token (decoder embedders: under causal
attention only it has seen the whole text), mean averages the real tokens (there are no others in
the packed layout, so no mask is needed).
"""

from __future__ import annotations

import torch

from embedstream.engine.packed import PackedBatch

POOLING_MODES = ("cls", "mean", "last_token")


def pool(hidden: torch.Tensor, batch: PackedBatch, mode: str) -> torch.Tensor:
    """Returns [B, H] in packed-sequence order."""
    cu = batch.cu_seqlens.to(hidden.device).long()
    if mode == "cls":
        return hidden[cu[:-1]]
    if mode == "last_token":
        return hidden[cu[1:] - 1]
    if mode == "mean":
        lengths = cu[1:] - cu[:-1]
        segment = torch.repeat_interleave(torch.arange(len(batch.lengths), device=hidden.device), lengths)
        sums = torch.zeros((len(batch.lengths), hidden.shape[1]), dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, segment, hidden.float())
        return sums / lengths.unsqueeze(1).float()
    raise ValueError(f"unknown pooling {mode!r}; expected one of {POOLING_MODES}")
