"""SPLADE: the sparse encoder that runs a masked-LM model on the packed path, one weight per vocabulary term.

The model is any ``*ForMaskedLM`` folder: the runner loads it with its head and runs the encoder on the
packed layout like the dense models (``runner.py``, ``backends/``) and applies
:class:`~embedstream.engine.splade_head.SpladeHead` (the SPLADE-max pooling) to the hidden states.

The encoder reuses the dense model's tokens of a text when both tokenizers are the same one (same
fingerprint) and no prompt came before the text; otherwise it tokenizes the text with its own.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from embedstream.engine.batcher import BatchLimits, pack
from embedstream.engine.errors import ConfigError, EngineError
from embedstream.engine.identity import model_identity
from embedstream.engine.model_spec import ModelSpec, resolve_model
from embedstream.engine.runner import ForwardTimings, ModelRunner
from embedstream.engine.splade_head import check_masked_lm
from embedstream.engine.sparse import SparseEncoder, text_of
from embedstream.engine.tokenize import TextTokenizer, Tokenized, load_tokenizer, st_lowercase
from embedstream.vectors import SparseVector

if TYPE_CHECKING:
    from embedstream.config import Settings
    from embedstream.engine.prepared import Prepared


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

    def identity(self) -> tuple[dict, dict]:
        model = model_identity(self.spec)
        return {"kind": self.kind, **model.space}, dict(model.values)

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
