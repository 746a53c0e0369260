"""Variable-length attention over the packed layout, without computing a single pad position.

* CUDA with flash-attn installed: ``flash_attn_varlen_func`` with ``cu_seqlens`` (bf16/fp16).
* Anywhere else: scaled-dot-product attention run once per run of equal-length sequences; the
  packed batch is ordered so each run is a contiguous [n, L] block (see packed.py). Measured on a
  2-core CPU this beat nested/jagged tensors by about 5x.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from embedstream.engine.packed import PackedBatch

try:  # optional GPU kernel
    from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - missing or built for another CUDA: fall back silently
    flash_attn_varlen_func = None


def flash_available(device: torch.device) -> bool:
    return device.type == "cuda" and flash_attn_varlen_func is not None


def grouped_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, causal: bool, out: torch.Tensor
) -> torch.Tensor:
    """q: [T, Hq, d], k/v: [T, Hkv, d] (may be strided views); writes [T, Hq, d] into ``out``."""
    gqa = q.shape[1] != k.shape[1]
    for start, count, length in batch.groups:
        end = start + count * length
        qg = q[start:end].view(count, length, q.shape[1], q.shape[2]).transpose(1, 2)
        kg = k[start:end].view(count, length, k.shape[1], k.shape[2]).transpose(1, 2)
        vg = v[start:end].view(count, length, v.shape[1], v.shape[2]).transpose(1, 2)
        og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal and length > 1, enable_gqa=gqa)
        out[start:end].view(count, length, q.shape[1], q.shape[2]).copy_(og.transpose(1, 2))
    return out


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, causal: bool
) -> torch.Tensor:
    """Dispatch to the fastest exact kernel for the device; returns [T, Hq, d]."""
    if flash_available(q.device) and q.dtype in (torch.float16, torch.bfloat16):
        return flash_attn_varlen_func(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            batch.cu_seqlens,
            batch.cu_seqlens,
            batch.max_len,
            batch.max_len,
            causal=causal,
        )
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return grouped_sdpa(q, k, v, batch, causal, out)


def attention_kernel_name(device: torch.device, dtype: torch.dtype) -> str:
    if flash_available(device) and dtype in (torch.float16, torch.bfloat16):
        return "flash-attn-varlen"
    return "sdpa-grouped-by-length"
