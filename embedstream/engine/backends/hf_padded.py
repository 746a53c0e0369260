"""Fallback for architectures the packed paths do not cover: a plain Hugging Face forward.

Batches are padded to their longest sequence (the batcher already groups similar lengths), run
with an attention mask, and the real tokens are gathered back into the packed [T, H] layout so
that pooling and heads are shared with the packed paths.
"""

from __future__ import annotations

import torch

from embedstream.engine.packed import PackedBatch


class PaddedHFEncoder:
    """Runs any AutoModel base on a PackedBatch by padding it; reports its padding cost."""

    def __init__(self, base_model, config, pad_token_id: int | None, left_padding: bool = False):
        self.model = base_model
        self.config = config
        self.pad_id = pad_token_id if pad_token_id is not None else 0
        self.left = left_padding
        self.last_padding_tokens = 0

    def flops_per_token(self, length: int) -> float:
        params = sum(p.numel() for n, p in self.model.named_parameters() if "embed" not in n)
        return 2.0 * params

    @torch.inference_mode()
    def __call__(self, batch: PackedBatch) -> torch.Tensor:
        lengths = batch.lengths
        width = max(lengths)
        count = len(lengths)
        device = batch.input_ids.device
        ids = torch.full((count, width), self.pad_id, dtype=torch.long, device=device)
        types = torch.zeros((count, width), dtype=torch.long, device=device)
        mask = torch.zeros((count, width), dtype=torch.long, device=device)
        cu = batch.cu_seqlens.tolist()
        for row, n in enumerate(lengths):
            cols = slice(width - n, width) if self.left else slice(0, n)
            ids[row, cols] = batch.input_ids[cu[row] : cu[row + 1]]
            types[row, cols] = batch.token_type_ids[cu[row] : cu[row + 1]]
            mask[row, cols] = 1
        self.last_padding_tokens = count * width - sum(lengths)
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if getattr(self.config, "type_vocab_size", 0) and self.config.type_vocab_size > 1:
            kwargs["token_type_ids"] = types
        hidden = self.model(**kwargs).last_hidden_state
        return hidden[mask.bool()]
