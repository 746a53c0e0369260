"""The SPLADE head: a masked-LM head over packed hidden states, pooled to one weight per vocabulary term.

``w[v] = max over the sequence's tokens of log(1 + relu(logit[token, v]))`` (SPLADE-max; special
tokens included, as the reference implementations mask only padding), computed as
``log(1 + relu(max logit))`` (the same number: the function is monotonic). The runner applies
:class:`SpladeHead` to the packed hidden states (``runner.py``), in row blocks so a [tokens, vocabulary]
matrix never exists whole (8,192 tokens x 30,522 terms would be 1 GB). The encoder that uses it is
``splade.py``.
"""

from __future__ import annotations

import torch

from embedstream.engine.errors import ConfigError
from embedstream.engine.model_spec import ModelSpec
from embedstream.engine.packed import PackedBatch

ROW_BLOCK = 512  # tokens per head tile: 512 x 30,522 float32 logits = 62 MB


def check_masked_lm(spec: ModelSpec) -> None:
    """Refuse, before loading, a folder that has no masked-LM head (a dense-only encoder)."""
    archs = spec.hf_config.get("architectures") or []
    if not any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
        raise ConfigError(
            f"sparse model {spec.name!r} ({spec.path}) has no masked-LM head (architectures: {archs or 'none'}); "
            f"SPLADE needs a *ForMaskedLM model, e.g. splade-tiny")


def masked_lm_head(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """The module that turns a *ForMaskedLM's hidden states into vocabulary logits (BERT's ``cls``,
    RoBERTa's ``lm_head``): its one child besides the base model."""
    heads = [module for child, module in model.named_children() if child != model.base_model_prefix]
    if len(heads) != 1:
        raise ConfigError(f"sparse model {name!r}: cannot tell its masked-LM head among {[n for n, _ in model.named_children()]}")
    return heads[0]


class SpladeHead:
    """Packed hidden states [T, H] -> SPLADE weights [B, vocabulary] (float32, packed order)."""

    def __init__(self, model: torch.nn.Module, spec: ModelSpec):
        self.head = masked_lm_head(model, spec.name)
        self.vocab_size = int(model.config.vocab_size)
        self.dimensions = self.vocab_size

    def project(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """log(1 + relu(.)) is monotonic, so the max of the weights is the weight of the max logit: each
        sequence's logits are max-reduced first and the weight taken on [B, V] only, never on [T, V].
        Sequences of one length sit together (``batch.groups``): a run of them reduces as one
        [n, length, V] block, ``ROW_BLOCK`` tokens at a time."""
        out = torch.empty(len(batch.lengths), self.vocab_size, device=hidden.device, dtype=torch.float32)
        row = 0
        for first, count, length in batch.groups:
            step = max(1, ROW_BLOCK // length)
            for at in range(0, count, step):
                n = min(step, count - at)
                start = first + at * length
                logits = self.head(hidden[start:start + n * length]).float()
                out[row:row + n] = logits.view(n, length, -1).amax(dim=1)
                row += n
        return torch.log1p(torch.relu(out))
