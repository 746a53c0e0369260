"""SPLADE: a masked-LM head over the packed hidden states, pooled to one weight per vocabulary term.

``w[v] = max over the sequence's tokens of log(1 + relu(logit[token, v]))`` (SPLADE-max; special
tokens included, as the reference implementations mask only padding), computed as
``log(1 + relu(max logit))`` (the same number: the function is monotonic). The model is any
``*ForMaskedLM`` folder: the runner loads it with its head and runs the encoder on the packed layout
like the dense models (``runner.py``, ``backends/``); :class:`SpladeHead` is the head the runner
applies to the packed hidden states, in row blocks so a [tokens, vocabulary] matrix never exists
whole (8,192 tokens x 30,522 terms would be 1 GB).

The encoder reuses the dense model's tokens of a text when both tokenizers are the same one (same
fingerprint) and no prompt came before the text; otherwise it tokenizes the text with its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from embedstream.engine.batcher import BatchLimits, pack
from embedstream.engine.errors import ConfigError, EngineError
from embedstream.engine.model_spec import ModelSpec, resolve_model
from embedstream.engine.packed import PackedBatch
from embedstream.engine.runner import ForwardTimings, ModelRunner
from embedstream.engine.sparse import SparseEncoder, text_of
from embedstream.engine.tokenize import TextTokenizer, Tokenized, load_tokenizer, st_lowercase
from embedstream.vectors import SparseVector

if TYPE_CHECKING:
    from embedstream.config import Settings
    from embedstream.engine.engine import Prepared

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

class SpladeEncoder(SparseEncoder):
    """SPLADE vectors on the packed path, in the engine's batches (see the module docstring)."""

    kind = "splade"

    def __init__(self, spec: ModelSpec, runner: ModelRunner, limits: BatchLimits,
                 dense_tokenizer: TextTokenizer | None = None):
        self.spec = spec
        self.model = spec.name
        self.runner = runner
        self.limits = limits
        self.tokenizer = TextTokenizer(load_tokenizer(spec.path), spec.max_tokens, st_lowercase(spec.path))
        self.shares_tokens = (dense_tokenizer is not None and dense_tokenizer.fingerprint() == self.tokenizer.fingerprint()
                              and dense_tokenizer.max_tokens <= spec.max_tokens)

    @classmethod
    def from_name(cls, name: str, settings: Settings, dense_tokenizer: TextTokenizer | None = None,
                  dense_max_tokens: int | None = None) -> "SpladeEncoder":
        spec = resolve_model(name, settings.models)
        spec = spec if spec.kind == "splade" else _as_splade(spec)
        check_masked_lm(spec)
        if dense_max_tokens is not None and spec.max_tokens < dense_max_tokens:
            raise ConfigError(f"sparse model {spec.name!r} takes {spec.max_tokens} tokens, fewer than the dense model's "
                              f"{dense_max_tokens}: chunks the dense model embeds whole would be cut")
        e = settings.engine
        runner = ModelRunner(spec, e.device, "auto" if e.backend == "openvino" else e.backend, e.threads, e.precision)
        limits = BatchLimits.for_model(e.max_batch_tokens, e.max_batch_requests, spec.max_tokens)
        return cls(spec, runner, limits, dense_tokenizer)

    def describe(self) -> str:
        return f"splade ({self.model}, {self.runner.describe()})"

    def _vectors(self, tokens: list[Tokenized]) -> list[SparseVector]:
        """SPLADE vectors of tokenized texts, in order, through the token-budget batcher."""
        out: list[SparseVector | None] = [None] * len(tokens)
        for group in pack([len(t) for t in tokens], self.limits, False):
            batch = self.runner.pack([tokens[i] for i in group])
            weights = self.runner.embed(self.runner.stage(batch), ForwardTimings()).numpy()
            for packed_pos, member in enumerate(batch.order):
                out[group[member]] = SparseVector.from_dense(weights[packed_pos])
        return out  # type: ignore[return-value]

    def encode(self, items: list[Prepared], queries: list[bool], bare: list[bool]) -> list[SparseVector | None]:
        tokens: list[Tokenized | None] = [item.tokens if own and self.shares_tokens else None
                                          for item, own in zip(items, bare)]
        redo = [i for i, t in enumerate(tokens) if t is None]
        if redo:
            may_cut = [bool(items[i].tokens.truncated) for i in redo]  # cut only where the dense input was cut
            for i, tok in zip(redo, self.tokenizer.encode_many([text_of(items[i], None) for i in redo], may_cut)):
                tokens[i] = None if isinstance(tok, EngineError) else tok
        ready = [i for i, t in enumerate(tokens) if t is not None]
        out: list[SparseVector | None] = [None] * len(items)
        for i, vector in zip(ready, self._vectors([tokens[i] for i in ready])):
            out[i] = vector
        return out

    def encode_texts(self, texts: list[str], query: bool) -> list[SparseVector]:
        tokens = self.tokenizer.encode_many(texts, [False] * len(texts))
        bad = next((t for t in tokens if isinstance(t, EngineError)), None)
        if bad is not None:
            raise bad
        return self._vectors(tokens)  # type: ignore[arg-type]


def _as_splade(spec: ModelSpec) -> ModelSpec:
    return replace(spec, kind="splade")
