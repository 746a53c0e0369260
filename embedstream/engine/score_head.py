"""A cross-encoder's scoring head, run the way its own Hugging Face class runs it.

A ``*ForSequenceClassification`` model is a base model (at ``model.base_model_prefix``) plus a head:
BERT's pooler (inside the base) then ``dropout`` + ``classifier``; RoBERTa / XLM-R's
``classifier`` (dense, tanh, projection on the first token); decoders' ``score`` on the last
non-padding token; DeBERTa's own ``pooler`` + ``classifier``; and so on. Rather than re-write each
one, the base model inside the loaded classification model is replaced by a stand-in that returns
hidden states the engine computed (packed, padding-free), plus the base's own pooler output when
the architecture has one, and the class's ``forward`` runs as it was written: whatever head, token
choice and pooler it uses.

What the stand-in hands over depends on which tokens the head can read (``reads``):
``"first"`` (BERT-family heads read token 0 only), ``"last"`` (decoder heads read the last token)
or ``"all"`` (any other architecture: every sequence padded back to [B, L, H], with its mask).
"""

from __future__ import annotations

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling

from embedstream.engine.errors import ConfigError
from embedstream.engine.packed import PackedBatch

HEAD_READS = ("first", "last", "all")


class _EncodedBase(torch.nn.Module):
    """Stands in for the base model: returns the hidden states it was handed (and its pooler's output)."""

    def __init__(self, pooler: torch.nn.Module | None):
        super().__init__()
        self.pooler = pooler
        self.hidden: torch.Tensor | None = None

    def forward(self, *args, **kwargs) -> BaseModelOutputWithPooling:
        hidden, self.hidden = self.hidden, None
        pooled = self.pooler(hidden) if self.pooler is not None else None
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled)


class ScoreHead:
    """Relevance scores [B] from packed hidden states, through the model's own classification head."""

    def __init__(self, model: torch.nn.Module, reads: str, activation: str, name: str):
        if reads not in HEAD_READS:
            raise ValueError(f"reads must be one of {HEAD_READS}, got {reads!r}")
        prefix = getattr(model, "base_model_prefix", "")
        base = getattr(model, prefix, None) if prefix else None
        if base is None or base is model:
            raise ConfigError(f"{name}: {type(model).__name__} has no base model under a head; not a cross-encoder")
        self.stand_in = _EncodedBase(getattr(base, "pooler", None))
        setattr(model, prefix, self.stand_in)  # the head now reads what the engine computed
        self.model = model
        self.reads = reads
        self.sigmoid = activation == "sigmoid"
        self.name = name
        self.pad_id = getattr(model.config, "pad_token_id", None) or 0

    def _inputs(self, hidden: torch.Tensor, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(hidden [B, L, H], input ids [B, L], attention mask [B, L]) for the head's class."""
        cu = batch.cu_seqlens.to(hidden.device).long()
        ids = batch.input_ids.to(hidden.device)
        if self.reads != "all":
            rows = cu[:-1] if self.reads == "first" else cu[1:] - 1
            return hidden[rows].unsqueeze(1), ids[rows].unsqueeze(1), torch.ones_like(ids[rows]).unsqueeze(1)
        lengths = cu[1:] - cu[:-1]
        width = int(lengths.max())
        mask = torch.arange(width, device=hidden.device).unsqueeze(0) < lengths.unsqueeze(1)
        padded = hidden.new_zeros((len(batch.lengths), width, hidden.shape[-1]))
        padded[mask] = hidden
        padded_ids = torch.full(mask.shape, self.pad_id, dtype=ids.dtype, device=ids.device)
        padded_ids[mask] = ids
        return padded, padded_ids, mask.long()

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """Scores [B] in packed order: raw logits or their sigmoid, as the model config says."""
        states, ids, mask = self._inputs(hidden, batch)
        self.stand_in.hidden = states
        logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
        if logits.shape[-1] != 1:
            raise ConfigError(f"{self.name}: reranker heads must have one label, found {logits.shape[-1]}")
        scores = logits[:, 0]
        return torch.sigmoid(scores) if self.sigmoid else scores
