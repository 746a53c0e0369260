"""Padding-free forward pass for decoder embedders (Qwen3 / Qwen2 / Llama / Mistral style).

Causal attention per sequence on the packed layout, rotary positions restarting at 0 for every
sequence, grouped-query attention, fused QKV and gate/up projections. The model's own rotary
module supplies cos/sin so any RoPE scaling the config declares is honoured.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from embedstream.engine.attention import varlen_attention
from embedstream.engine.backends.bert import ROW_BLOCK
from embedstream.engine.backends.linear import make_linear
from embedstream.engine.packed import PackedBatch
from embedstream.engine.yield_points import checkpoint

SUPPORTED_MODEL_TYPES = {"qwen3", "qwen2", "llama", "mistral"}
HEAD_READS = "last"  # sequence-classification heads read the last token (the one that saw everything)


def supports(config) -> str | None:
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {config.model_type!r} is not a supported decoder"
    if getattr(config, "use_sliding_window", False) or (
        config.model_type == "mistral" and getattr(config, "sliding_window", None)
    ):
        return "sliding-window attention is not supported by the packed path"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not supported"
    return None


@dataclass
class _Layer:
    norm1: torch.nn.Module
    qkv: object  # fused Q, K, V projection (linear.make_linear)
    q_norm: torch.nn.Module | None
    k_norm: torch.nn.Module | None
    o: object
    norm2: torch.nn.Module
    gate_up: object
    down: object


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PackedDecoder:
    """Runs a Hugging Face decoder base model on a PackedBatch; returns final hidden states [T, H]."""

    def __init__(self, base_model, config, device: torch.device, dtype: torch.dtype, precision: str = "float32"):
        self.hidden = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or self.hidden // self.heads
        self.rotary = base_model.rotary_emb.to(device)
        self.embed = base_model.embed_tokens.weight.detach().to(device=device, dtype=dtype)
        self.final_norm = base_model.norm.to(device=device, dtype=dtype)
        self.intermediate = config.intermediate_size

        def t(param: torch.Tensor | None) -> torch.Tensor | None:
            return None if param is None else param.detach().to(device=device, dtype=dtype).contiguous()

        self.layers: list[_Layer] = []
        for layer in base_model.layers:
            att, mlp = layer.self_attn, layer.mlp
            biases = [att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]
            self.layers.append(
                _Layer(
                    norm1=layer.input_layernorm.to(device=device, dtype=dtype),
                    qkv=make_linear(
                        t(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight])),
                        t(torch.cat(biases)) if all(b is not None for b in biases) else None,
                        precision,
                    ),
                    q_norm=getattr(att, "q_norm", None),
                    k_norm=getattr(att, "k_norm", None),
                    o=make_linear(t(att.o_proj.weight), None, precision),
                    norm2=layer.post_attention_layernorm.to(device=device, dtype=dtype),
                    gate_up=make_linear(t(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])), None, precision),
                    down=make_linear(t(mlp.down_proj.weight), None, precision),
                )
            )
            if att.o_proj.bias is not None:
                raise ValueError("o_proj bias is not supported by the packed decoder")

    def flops_per_token(self, length: int) -> float:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        linear = 2 * (self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate)
        attention = 2 * length * q  # causal: half of the 4*L*q of full attention
        return float(len(self.layers) * (linear + attention))

    @torch.inference_mode()
    def __call__(self, batch: PackedBatch) -> torch.Tensor:
        x = self.embed[batch.input_ids]
        total = x.shape[0]
        cos, sin = self.rotary(x.unsqueeze(0), batch.position_ids.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1).to(x.dtype), sin[0].unsqueeze(1).to(x.dtype)  # [T, 1, d]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for layer in self.layers:
            h = layer.norm1(x)
            qkv = layer.qkv(h)
            q = qkv[:, :q_size].reshape(total, self.heads, self.head_dim)
            k = qkv[:, q_size : q_size + kv_size].reshape(total, self.kv_heads, self.head_dim)
            v = qkv[:, q_size + kv_size :].reshape(total, self.kv_heads, self.head_dim)
            if layer.q_norm is not None:
                q, k = layer.q_norm(q), layer.k_norm(k)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            dtype = v.dtype  # bf16 under mixed precision, where the norms and rotary ran in float32
            ctx = varlen_attention(q.to(dtype), k.to(dtype), v, batch, causal=True)
            layer.o.add_into(x, ctx.reshape(total, q_size))
            checkpoint()
            for start in range(0, total, ROW_BLOCK):  # the MLP per block of rows: activations stay in cache
                rows = x[start : start + ROW_BLOCK]
                gate, up = layer.gate_up(layer.norm2(rows)).split(self.intermediate, dim=-1)
                layer.down.add_into(rows, F.silu(gate) * up)  # residual added in the GEMM
                checkpoint()
        return self.final_norm(x)
