"""Padding-free forward pass for the BERT family (BERT, MiniLM, RoBERTa / XLM-R style encoders).

Every dense op (embeddings, fused QKV projection, output projections, MLP, layer norms) runs on the
packed [total_tokens, hidden] matrix, so the GEMMs see only real tokens; attention runs per run of
equal-length sequences (attention.py). Weights come from the Hugging Face module so any checkpoint
that loads there loads here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from embedstream.engine.attention import varlen_attention
from embedstream.engine.backends.linear import (
    StaticInt8Linear,
    cpu_has_native_bf16,
    make_linear,
    onednn_int8_available,
)
from embedstream.engine.packed import PackedBatch
from embedstream.engine.yield_points import checkpoint

ROW_BLOCK = 512  # tokens per dense tile: a 927-token MiniLM pass, 1 thread, 1,024 / 512 / 256 rows: bf16 160 / 141 / 149 ms,
# float32 247 / 240 / 246 ms, int8 204 / 178 / 177 ms (each tile also ends at a yield point)
SUPPORTED_MODEL_TYPES = {"bert", "roberta", "xlm-roberta", "camembert"}
HEAD_READS = "first"  # their classification heads (BERT's pooler, RoBERTa's head) read token 0 only
_ACTIVATIONS = {  # config.hidden_act -> the fused epilogue's name (linear.ACTIVATIONS)
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
LINEAR_KINDS = ("qkv", "out", "up", "down")


@dataclass(frozen=True)
class Int8Recipe:
    """How one kind of linear runs at precision int8 (linear.StaticInt8Linear's arguments)."""

    smooth_alpha: float | None = 0.5
    per_token: bool = True
    float_channels: int = 16


# Calibrated int8 per kind of linear, or None to keep the layer in float. Measured per linear on MiniLM
# (2,000 quality-bench chunks + 200 queries, mean 1 - cos vs float32 when only that linear is int8,
# static scales): FFN-down 0.5-4.7e-4 each (its GELU input has one channel up to 25 where the median
# peaks at 2), FFN-up 0.2-1.1e-4, QKV 0.1-0.9e-4, attention-out about 0.1e-4. FFN-down stays in float;
# the rest run per-token with float channels (StaticInt8Linear), all together: 8 channels 1.6e-4,
# 16 channels 1.5e-4 (weight-only int8 alone: 1.5e-4); SmoothQuant alpha 0.35 instead of 0.5: 1.7e-4.
INT8_RECIPE: dict[str, Int8Recipe | None] = {"qkv": Int8Recipe(), "out": Int8Recipe(), "up": Int8Recipe(),
                                             "down": None}


@dataclass(frozen=True)
class Int8Plan:
    """A measured int8 recipe (engine/tuner.py): which linears stay unquantised (by name, ``layers.3.down``),
    the dtype they run in, and static or per-token activation scales for the rest. None (the default) is
    ``INT8_RECIPE``: every FFN-down kept, per-token scales, bf16 where the CPU has it natively."""

    keep_float: frozenset[str]
    float_dtype: str = "float32"  # float32 | bfloat16
    per_token: bool = True

    def recipe(self, name: str) -> Int8Recipe | None:
        return None if name in self.keep_float else Int8Recipe(per_token=self.per_token)


def supports(config) -> str | None:
    """None when covered, else the reason the packed path cannot run this model."""
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not a BERT-family encoder"
    if getattr(config, "position_embedding_type", "absolute") not in (None, "absolute"):
        return f"position_embedding_type {config.position_embedding_type!r} is not supported"
    if config.hidden_act not in _ACTIVATIONS:
        return f"activation {config.hidden_act!r} is not supported"
    if getattr(config, "is_decoder", False):
        return "BERT configured as a decoder"
    return None


@dataclass
class _Layer:
    qkv: object  # fused Q, K, V projection (linear.make_linear)
    out: object
    ln1: tuple[torch.Tensor, torch.Tensor]
    up: object
    down: object
    ln2: tuple[torch.Tensor, torch.Tensor]


class PackedBertEncoder:
    """Runs a Hugging Face BERT-family base model on a PackedBatch; returns hidden states [T, H]."""

    def __init__(self, base_model, config, device: torch.device, dtype: torch.dtype, precision: str = "float32",
                 calibration: dict | None = None, plan: Int8Plan | None = None):
        """``calibration`` (calibrate.Stats, int8 only): activation ranges for static int8; without it
        int8 is dynamic quantization. ``plan``: which linears stay float and how (default ``INT8_RECIPE``)."""
        self.heads = config.num_attention_heads
        self.hidden = config.hidden_size
        self.head_dim = self.hidden // self.heads
        self.eps = config.layer_norm_eps
        self.activation = _ACTIVATIONS[config.hidden_act]
        self.row_block = ROW_BLOCK
        # RoBERTa-style position ids start after the padding index.
        self.position_offset = (config.pad_token_id + 1) if config.model_type != "bert" else 0

        def t(param: torch.Tensor) -> torch.Tensor:
            return param.detach().to(device=device, dtype=dtype).contiguous()

        emb = base_model.embeddings
        self.word = t(emb.word_embeddings.weight)
        self.position = t(emb.position_embeddings.weight)
        types = getattr(emb, "token_type_embeddings", None)
        self.token_type = t(types.weight) if types is not None else None
        self.emb_ln = (t(emb.LayerNorm.weight), t(emb.LayerNorm.bias))

        static_int8 = precision == "int8" and calibration is not None and onednn_int8_available()
        float_kept = plan.float_dtype if plan else ("bfloat16" if cpu_has_native_bf16() else "float32")

        def recipe_of(name: str) -> Int8Recipe | None:
            return plan.recipe(name) if plan else INT8_RECIPE[name.rsplit(".", 1)[-1]]

        def linear(weight: torch.Tensor, bias: torch.Tensor, name: str):
            if not static_int8:
                return make_linear(t(weight), t(bias), precision)
            kind = name.rsplit(".", 1)[-1]
            recipe = recipe_of(name)
            if recipe is None:
                return make_linear(t(weight), t(bias), float_kept)
            down = name.rsplit(".", 1)[0] + ".down"
            feeds_float = kind == "up" and recipe_of(down) is None and float_kept == "bfloat16"
            return StaticInt8Linear(t(weight), t(bias), *calibration[name], smooth_alpha=recipe.smooth_alpha,
                                    out_dtype=torch.bfloat16 if feeds_float else torch.float32,
                                    per_token=recipe.per_token, float_channels=recipe.float_channels)

        self.intermediate = config.intermediate_size
        self.layers: list[_Layer] = []
        for i, layer in enumerate(base_model.encoder.layer):
            att = layer.attention
            self.layers.append(
                _Layer(
                    qkv=linear(
                        torch.cat([att.self.query.weight, att.self.key.weight, att.self.value.weight]),
                        torch.cat([att.self.query.bias, att.self.key.bias, att.self.value.bias]),
                        f"layers.{i}.qkv",
                    ),
                    out=linear(att.output.dense.weight, att.output.dense.bias, f"layers.{i}.out"),
                    ln1=(t(att.output.LayerNorm.weight), t(att.output.LayerNorm.bias)),
                    up=linear(layer.intermediate.dense.weight, layer.intermediate.dense.bias, f"layers.{i}.up"),
                    down=linear(layer.output.dense.weight, layer.output.dense.bias, f"layers.{i}.down"),
                    ln2=(t(layer.output.LayerNorm.weight), t(layer.output.LayerNorm.bias)),
                )
            )

    def named_linears(self):
        """(name, layer) for every linear, the names calibrate.Stats is keyed by."""
        for i, layer in enumerate(self.layers):
            for kind in LINEAR_KINDS:
                yield f"layers.{i}.{kind}", getattr(layer, kind)

    def set_linear(self, name: str, linear) -> None:
        _, i, kind = name.split(".")
        setattr(self.layers[int(i)], kind, linear)

    def flops_per_token(self, length: int) -> float:
        """Multiply-adds x2 of one token in a sequence of ``length`` (linears + attention)."""
        linear = 2 * (4 * self.hidden * self.hidden + 2 * self.hidden * self.intermediate)
        attention = 4 * length * self.hidden
        return float(len(self.layers) * (linear + attention))

    @torch.inference_mode()
    def __call__(self, batch: PackedBatch) -> torch.Tensor:
        x = self.word[batch.input_ids]
        x += self.position[batch.position_ids + self.position_offset]
        if self.token_type is not None:
            x += self.token_type[batch.token_type_ids]
        x = F.layer_norm(x, (self.hidden,), *self.emb_ln, self.eps)
        total = x.shape[0]
        nxt = torch.empty_like(x) if total > self.row_block else None  # tiled layers write here
        for layer in self.layers:
            qkv = layer.qkv(x).view(total, 3, self.heads, self.head_dim)
            ctx = varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], batch, causal=False).view(total, self.hidden)
            checkpoint()
            if total <= self.row_block:
                x = self._dense_tail(layer, x, ctx)
                checkpoint()
                continue
            for s, e in _blocks(total, self.row_block):
                nxt[s:e] = self._dense_tail(layer, x[s:e], ctx[s:e])
                checkpoint()
            x, nxt = nxt, x
        return x

    def _dense_tail(self, layer: _Layer, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Output projection + residual, norm, MLP (activation fused into its first GEMM) + residual,
        norm, for one block of rows: the [block, intermediate] activation stays in cache."""
        h = layer.out.plus(ctx, x)
        x1 = F.layer_norm(h, (self.hidden,), *layer.ln1, self.eps)
        h = layer.down.plus(layer.up(x1, self.activation), x1)
        return F.layer_norm(h, (self.hidden,), *layer.ln2, self.eps)


def _blocks(total: int, block: int):
    for start in range(0, total, block):
        yield start, min(total, start + block)
