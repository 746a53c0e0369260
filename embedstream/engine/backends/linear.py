"""The dense layers of the packed backends, in the precision the runner was asked for.

``float32``: one addmm with the bias fused (exact); also bf16 weights on CUDA, where the whole model
runs in bf16. ``bfloat16`` on CPU is mixed precision: bf16 GEMMs and attention (AVX512-BF16 / AMX
run them about 4x faster than fp32) while the residual stream and layer norms stay float32, which
keeps MiniLM's vectors at cosine >= 0.9999 of float32 where an all-bf16 model dips below it.
``int8``: dynamic quantization — weights int8 with one scale per output channel (per-tensor scales
lose too much: min cosine 0.87 on MiniLM), activations quantized per call, int32 accumulation,
float32 out (fbgemm; VNNI where the CPU has it). Everything between the GEMMs stays float32.
"""

from __future__ import annotations

import functools
import warnings

import torch

PRECISIONS = ("auto", "float32", "bfloat16", "int8")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where /proc/cpuinfo is not readable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16() -> bool:
    """bf16 dot products in hardware (AVX512-BF16 or AMX); without them bf16 is emulated and slow."""
    return bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})


def cpu_has_vnni() -> bool:
    """8-bit dot products without 16-bit saturation, so activations may use the full 8-bit range."""
    return bool(cpu_flags() & {"avx512_vnni", "avx_vnni", "amx_int8"})


class DenseLinear:
    """y = x W^T + b as one GEMM with the bias fused, written into ``out`` when given."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight_t = weight.t()
        self.bias = bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.bias is None:
            return torch.mm(x, self.weight_t, out=out)
        return torch.addmm(self.bias, x, self.weight_t, out=out)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        """residual += x W^T + b, the residual add done by the GEMM itself."""
        residual.addmm_(x, self.weight_t)
        if self.bias is not None:
            residual += self.bias


class Int8Linear:
    """Dynamically quantized linear: int8 per-channel weights packed once for fbgemm."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        weight = weight.detach().float().cpu()
        self.out_features = weight.shape[0]
        scales = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12).double()
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are "deprecated" but still the fbgemm entry point
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.detach().float())
        # Without VNNI, u8 x s8 pairs are summed in 16 bits: 7-bit activations keep that from saturating.
        self.reduce_range = not cpu_has_vnni()

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)
        if out is None:
            return y
        out.copy_(y)
        return out

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        residual += self(x)


class Bf16Linear:
    """bf16 GEMM for a float32 model: inputs cast to bf16, output bf16 (or cast into ``out``)."""

    compute_dtype = torch.bfloat16

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight_t = weight.to(torch.bfloat16).t()
        self.bias = None if bias is None else bias.to(torch.bfloat16)
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        x = x.to(torch.bfloat16)
        target = out if out is not None and out.dtype == torch.bfloat16 else None
        y = torch.mm(x, self.weight_t, out=target) if self.bias is None else torch.addmm(self.bias, x, self.weight_t, out=target)
        if out is not None and target is None:
            out.copy_(y)
            return out
        return y

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        residual += self(x)


def compute_dtype(precision: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype the GEMMs and attention run in for a model whose residual stream is ``dtype``."""
    return torch.bfloat16 if precision == "bfloat16" else dtype


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, precision: str):
    """The dense layer for ``precision`` (weights already on the runner's device and dtype)."""
    if precision == "int8":
        return Int8Linear(weight, bias)
    if precision == "bfloat16" and weight.dtype != torch.bfloat16:
        return Bf16Linear(weight, bias)
    return DenseLinear(weight, bias)
