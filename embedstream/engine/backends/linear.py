"""The dense layers of the packed backends, in the precision the runner was asked for.

``float32``: one GEMM with bias (and activation or residual) fused, exact to rounding; on CPU the
weights are packed once for oneDNN. On CUDA the same class runs bf16 weights in an all-bf16 model.
``bfloat16`` on CPU is mixed precision: bf16 GEMMs and attention (AVX512-BF16 / AMX
run them about 4x faster than fp32) while the residual stream and layer norms stay float32, which
keeps MiniLM's vectors at cosine >= 0.9999 of float32 where an all-bf16 model dips below it.
``int8``: dynamic quantization — weights int8 with one scale per output channel (per-tensor scales
lose too much: min cosine 0.87 on MiniLM), activations quantized per call, int32 accumulation,
float32 out (fbgemm; VNNI where the CPU has it). Everything between the GEMMs stays float32.
``StaticInt8Linear`` is the calibrated variant the BERT path uses for int8 (see its docstring).
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

PRECISIONS = ("auto", "fast", "tuned", "float32", "bfloat16", "int8")


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


# Activations the GEMM can apply in its epilogue: name -> (oneDNN attr, algorithm, eager fallback).
ACTIVATIONS = {
    "gelu": ("gelu", "none", lambda y: F.gelu(y)),
    "gelu_tanh": ("gelu", "tanh", lambda y: F.gelu(y, approximate="tanh")),
    "relu": ("relu", "", F.relu),
}


def onednn_available() -> bool:
    """oneDNN's packed-weight linear (x86 PyTorch builds have it)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class DenseLinear:
    """y = act(x W^T + b) [+ residual], one GEMM with bias, activation and residual fused.

    On CPU the weight is packed once for oneDNN: unlike MKL's sgemm (which repacks the weight on
    every call and, on AMD, runs its AVX2 code) the packed oneDNN GEMM uses the CPU's widest
    vectors; measured here 2.0-2.5x faster at 1,024 rows and 2-4x at 16 (a single query), with the
    same float32 results to rounding. ``compute_dtype`` bf16 on a float32 model is the mixed mode:
    inputs cast to bf16, output bf16 (residual sums come back in the residual's dtype).
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, compute_dtype: torch.dtype | None = None):
        self.compute_dtype = compute_dtype or weight.dtype
        weight = weight.to(self.compute_dtype)
        self.bias = None if bias is None else bias.to(self.compute_dtype)
        self.packed = None
        if weight.device.type == "cpu" and self.compute_dtype in (torch.float32, torch.bfloat16) and onednn_available():
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), None)
            except RuntimeError:  # a build or shape oneDNN refuses: the plain GEMM still works
                self.packed = None
        self.weight_t = None if self.packed is not None else weight.t()

    def __call__(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        x = x.to(self.compute_dtype)
        if self.packed is not None:
            attr, algorithm, _ = ACTIVATIONS[activation] if activation else ("none", "", None)
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, attr, [], algorithm)
        y = torch.mm(x, self.weight_t) if self.bias is None else torch.addmm(self.bias, x, self.weight_t)
        return ACTIVATIONS[activation][2](y) if activation else y

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """x W^T + b + residual, in the residual's dtype; the add is fused where dtypes agree."""
        x = x.to(self.compute_dtype)
        if residual.dtype == self.compute_dtype:
            if self.packed is not None:
                return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.packed, self.bias, "add")
            if self.bias is None:
                return torch.addmm(residual, x, self.weight_t)
            return torch.addmm(residual, x, self.weight_t).add_(self.bias)
        return self(x).to(residual.dtype).add_(residual)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        """residual += x W^T + b (in place: callers hold views of it)."""
        if self.packed is None and residual.dtype == self.compute_dtype:
            residual.addmm_(x.to(self.compute_dtype), self.weight_t)
            if self.bias is not None:
                residual += self.bias
            return
        residual += self(x)


class Int8Linear:
    """Dynamically quantized linear: int8 per-channel weights packed once for fbgemm."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        weight = weight.detach().float().cpu()
        # Without VNNI, u8 x s8 pairs are summed in 16 bits (vpmaddubsw): 8-bit activations against 7-bit
        # weights (+-63) cannot saturate it. Measured on a tiny Qwen3 (min cos to float32 over 40 texts):
        # 7-bit weights 0.985, 7-bit activations (fbgemm's reduce_range) 0.965, both 8-bit (saturating) 0.922.
        levels = 127.0 if cpu_has_vnni() else 63.0
        scales = (weight.abs().amax(dim=1) / levels).clamp(min=1e-12).double()
        zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are "deprecated" but still the fbgemm entry point
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.detach().float())

    def __call__(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        y = torch.ops.quantized.linear_dynamic(x.float().contiguous(), self.packed, False)
        return ACTIVATIONS[activation][2](y) if activation else y

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self(x).to(residual.dtype).add_(residual)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        residual += self(x)


def onednn_int8_available() -> bool:
    """oneDNN's u8 x s8 linear with fused epilogues (x86 PyTorch builds; VNNI where the CPU has it)."""
    return hasattr(torch.ops, "onednn") and hasattr(torch.ops.onednn, "qlinear_pointwise")


class StaticInt8Linear:
    """Calibrated int8: s8 per-channel weights, u8 activations, int32 accumulation, float out (oneDNN qlinear).

    ``smooth_alpha`` (SmoothQuant) migrates the activation outliers into the weights: input channel j is
    divided by s_j = max|x_j|^a / max|W_j|^(1-a) and weight column j multiplied by it. The division is a
    multiply before the quantize (torch's per-channel quantize, which could fold it, took 4-28 ms where
    the per-tensor one takes 0.5-2 ms on a [2048, 384] block here).

    Activation scales, two modes:
    * static (default): one scale calibrated ahead of time, bias / activation / residual fused into
      the GEMM;
    * ``per_token``: each row gets its own symmetric scale at call time (:meth:`_token_gemm`), and the
      ``float_channels`` input channels with the largest smoothed ranges skip int8 altogether: their
      slice of the input and of the weight runs as a float32 GEMM of width k added to the int8 result.

    Measured on MiniLM (2,000 quality-bench chunks + 200 queries, FFN-down in float, mean 1 - cos vs
    float32 / recall@10 of int8 documents and queries): static per-tensor 8.7e-4 / 0.963; per-token
    5.2e-4 / 0.971; per-token with 8 float channels 1.6e-4 / 0.979, with 16 1.5e-4 / 0.983 (weight-only
    int8 alone 1.5e-4): after smoothing, a handful of LayerNorm channels still set each token's range.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, x_min: torch.Tensor, x_max: torch.Tensor,
                 smooth_alpha: float | None = 0.5, out_dtype: torch.dtype = torch.float32, per_token: bool = False,
                 float_channels: int = 0):
        """``out_dtype`` bf16 when the next layer is a bf16 GEMM: oneDNN writes bf16 itself, which saves
        that layer a cast pass over the (widest, [T, intermediate]) activation."""
        self.out_dtype = out_dtype
        self.per_token = per_token
        weight = weight.detach().float().cpu().clone()  # columns are zeroed below: never the model's own
        x_min, x_max = x_min.float(), x_max.float()
        smooth = None
        if smooth_alpha is not None:
            x_absmax = torch.maximum(x_min.abs(), x_max.abs()).clamp(min=1e-5)
            w_absmax = weight.abs().amax(0).clamp(min=1e-5)
            smooth = (x_absmax.pow(smooth_alpha) / w_absmax.pow(1 - smooth_alpha)).clamp(min=1e-5)
            weight = weight * smooth
            x_min, x_max = x_min / smooth, x_max / smooth
        self.inverse_smooth = None if smooth is None else (1.0 / smooth)
        self.float_idx = self.float_weight_t = None
        if float_channels > 0:
            ranges = torch.maximum(x_min.abs(), x_max.abs())
            self.float_idx = torch.topk(ranges, min(float_channels, ranges.numel())).indices.sort().values
            # The float GEMM reads the raw input: its weight columns are the unsmoothed ones.
            unsmooth = 1.0 if smooth is None else smooth[self.float_idx]
            self.float_weight_t = (weight[:, self.float_idx] / unsmooth).t().contiguous()
            weight[:, self.float_idx] = 0.0
            # The smoothing multiply zeroes those channels for the int8 GEMM at no extra pass.
            self.inverse_smooth = torch.ones_like(x_min) if smooth is None else self.inverse_smooth
            self.inverse_smooth[self.float_idx] = 0.0
            x_min, x_max = x_min.clone(), x_max.clone()
            x_min[self.float_idx] = x_max[self.float_idx] = 0.0
        # Without VNNI the u8 x s8 products are summed in pairs into int16 (vpmaddubsw), which saturates at
        # full 8-bit range on both sides: one operand gives up a bit. Per-token activations keep 7 bits (codes
        # 0..127, like fbgemm's reduce_range), static ones keep 8 and the weights take 7 (+-63). Measured on
        # this AMD Zen 3 (AVX2) host: relative error of a random [200, 64] x [64, 96] product 0.060 -> 0.0125;
        # all-MiniLM-L6-v2 on the tuner's set, min cos vs float32 (7-bit activations / 7-bit weights / neither):
        # per-token with FFN-down float 0.99945 / 0.99899 / 0.99794, static all int8 0.99635 / 0.99785 / 0.99837
        # (the saturating one keeps min cos here, but its errors are the unit test's 0.06).
        narrow = None if cpu_has_vnni() else ("activations" if per_token else "weights")
        levels = 127.0 if narrow == "activations" else 255.0
        self.half = 63.0 if narrow == "activations" else 127.0  # per-token: symmetric codes around zero point half + 1
        w_max = 63.0 if narrow == "weights" else 127.0
        low, high = min(float(x_min.min()), 0.0), max(float(x_max.max()), 0.0)
        self.x_scale = max(high - low, 1e-8) / levels
        self.x_zero_point = int(min(levels, max(0, round(-low / self.x_scale))))
        self.w_scales = (weight.abs().amax(1) / w_max).clamp(min=1e-12)
        qweight = torch.round(weight / self.w_scales[:, None]).clamp(-w_max, w_max).to(torch.int8)
        self.w_zero_points = torch.zeros(weight.shape[0], dtype=torch.int32)
        self.packed = torch.ops.onednn.qlinear_prepack(qweight, None)
        self.bias = None if bias is None else bias.detach().float().cpu()
        self._shift = torch.tensor([self.half + 1.5])

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """u8 codes of x at the calibrated scale (values outside the calibrated range saturate)."""
        x = x.float().contiguous() if self.inverse_smooth is None else x.float() * self.inverse_smooth
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q = torch.quantize_per_tensor(x, self.x_scale, self.x_zero_point, torch.quint8)
        # The codes as a plain uint8 tensor over the same storage: int_repr() would copy them (a
        # profiled 6.5% of the int8 forward at 2 threads).
        return torch.empty(0, dtype=torch.uint8).set_(q.untyped_storage(), 0, q.shape, q.stride())

    def _float_part(self, x: torch.Tensor, base: torch.Tensor | None) -> torch.Tensor | None:
        """base + x[:, float channels] W[:, float channels]^T as a new float32 tensor, or ``base`` itself
        when there are no float channels."""
        if self.float_idx is None:
            return base
        kept = x.float().index_select(1, self.float_idx)
        if base is None:
            return kept @ self.float_weight_t
        return torch.addmm(base.float(), kept, self.float_weight_t)

    def _token_gemm(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """float32 x W^T + b [+ residual] with per-row activation scales and the float channels.

        Passes over the input: smooth, min/max, scale-and-shift, cast to u8; over the output: the
        float-channel GEMM (or bias) written once, then one multiply-add of the int8 result."""
        owned = self.float_idx is not None  # _float_part wrote a new tensor: ours to update in place
        base = self._float_part(x, residual if residual is not None else self.bias)
        if residual is not None and self.bias is not None:
            base, owned = (base.add_(self.bias) if owned else base + self.bias), True
        x = x.float() * self.inverse_smooth if self.inverse_smooth is not None else x.float().clone()
        low, high = torch.aminmax(x, dim=1, keepdim=True)
        absmax = torch.maximum(high, low.neg()).clamp_(min=1e-8)
        # symmetric codes at zero point h + 1 (h = 127, or 63 without VNNI):
        # trunc(x * h / absmax + h + 1.5) == round(x * h / absmax) + h + 1
        codes = torch.addcmul(self._shift, x, self.half / absmax).to(torch.uint8)
        acc = torch.ops.onednn.qlinear_pointwise(
            codes, 1.0, int(self.half) + 1, self.packed, self.w_scales, self.w_zero_points, None, 1.0, 0,
            torch.float32, "none", [], "none",
        )
        scale = absmax.div_(self.half)
        if base is None:
            return acc.mul_(scale)
        return base.addcmul_(acc, scale) if owned else torch.addcmul(base, acc, scale)

    def __call__(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        attr, algorithm, eager = ACTIVATIONS[activation] if activation else ("none", "", None)
        if self.per_token:
            y = self._token_gemm(x)
            return (eager(y) if eager else y).to(self.out_dtype)
        if self.float_idx is not None:  # the float channels' GEMM joins as the epilogue's addend
            return self._static_binary(x, self._float_part(x, self.bias), None, self.out_dtype, activation)
        return torch.ops.onednn.qlinear_pointwise(
            self.quantize(x), self.x_scale, self.x_zero_point, self.packed, self.w_scales, self.w_zero_points,
            self.bias, 1.0, 0, self.out_dtype, attr, [], algorithm or "none",
        )

    def _static_binary(self, x: torch.Tensor, other: torch.Tensor, bias: torch.Tensor | None,
                       out_dtype: torch.dtype, activation: str | None = None) -> torch.Tensor:
        """act(int8 GEMM + bias + other): the add in oneDNN's epilogue (float32 ``other``); the
        activation after it runs eagerly (oneDNN refuses GELU after a binary add)."""
        y = torch.ops.onednn.qlinear_pointwise.binary(
            self.quantize(x), self.x_scale, self.x_zero_point, self.packed, self.w_scales, self.w_zero_points,
            other.contiguous(), bias, 1.0, 0, torch.float32, 1.0, 0, "add", 1.0, "none", [], "",
        )
        if activation:
            y = ACTIVATIONS[activation][2](y)
        return y if out_dtype == torch.float32 else y.to(out_dtype)

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        if self.per_token:
            return self._token_gemm(x, residual).to(residual.dtype)
        if residual.dtype != torch.float32:
            return self(x).to(residual.dtype).add_(residual)
        return self._static_binary(x, self._float_part(x, residual), self.bias, torch.float32)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        residual += self(x)


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, precision: str):
    """The dense layer for ``precision`` (weights already on the runner's device and dtype)."""
    if precision == "int8":
        return Int8Linear(weight, bias)
    if precision == "bfloat16":
        return DenseLinear(weight, bias, torch.bfloat16)
    return DenseLinear(weight, bias)
