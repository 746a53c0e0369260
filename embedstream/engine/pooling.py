"""Pooling: one vector per sequence from the packed hidden states [T, H].

CLS takes each sequence's first token, last-token its final token (decoder embedders: under causal
attention only it has seen the whole text), mean averages the real tokens (there are no others in
the packed layout, so no mask is needed).

A model saved with ``include_prompt=False`` leaves its prompt out, as sentence-transformers does:
mean averages the tokens after the prompt and CLS reads the first token after it, for every
sequence that has tokens beyond its prompt (``batch.prompt_tokens``, counted by the tokenizer).
"""

from __future__ import annotations

import torch

from embedstream.engine.packed import PackedBatch

POOLING_MODES = ("cls", "mean", "last_token")


def _prompt_skip(batch: PackedBatch, lengths: torch.Tensor) -> torch.Tensor:
    """Per sequence, the leading tokens pooling leaves out: its prompt, where tokens follow it."""
    skip = torch.tensor(batch.prompt_tokens, dtype=torch.long, device=lengths.device)
    return torch.where(lengths > skip, skip, torch.zeros_like(skip))


def pool(hidden: torch.Tensor, batch: PackedBatch, mode: str, include_prompt: bool = True) -> torch.Tensor:
    """Returns [B, H] in packed-sequence order."""
    cu = batch.cu_seqlens.to(hidden.device).long()
    lengths = cu[1:] - cu[:-1]
    skip = None if include_prompt or not batch.prompt_tokens else _prompt_skip(batch, lengths)
    if mode == "cls":
        return hidden[cu[:-1] if skip is None else cu[:-1] + skip]
    if mode == "last_token":
        return hidden[cu[1:] - 1]
    if mode == "mean":
        count = len(batch.lengths)
        segment = torch.repeat_interleave(torch.arange(count, device=hidden.device), lengths, output_size=hidden.shape[0])
        tokens = hidden.float()
        if skip is not None:
            keep = batch.position_ids.to(hidden.device) >= skip[segment]
            segment, tokens, lengths = segment[keep], tokens[keep], lengths - skip
        sums = torch.zeros((count, hidden.shape[1]), dtype=torch.float32, device=hidden.device)
        sums.index_add_(0, segment, tokens)
        return sums / lengths.unsqueeze(1).float()
    raise ValueError(f"unknown pooling {mode!r}; expected one of {POOLING_MODES}")
