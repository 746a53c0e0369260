"""Variable-length attention over the packed layout, without computing a single pad position.

Kernels, first usable wins (``choose_kernel``, a pure function of device, dtype, head size and
which kernels this process can run):

1. ``flash-attn-varlen``: the flash-attn package's ``flash_attn_varlen_func`` (CUDA, fp16/bf16,
   head size <= 256), when it is installed (optional: it rarely installs cleanly).
2. ``torch-varlen-attn``: torch's own ``torch.nn.attention.varlen.varlen_attn`` (in the pinned torch;
   cuDNN or torch's bundled flash kernel, whichever torch picks; CUDA, fp16/bf16, head size a
   multiple of 8 up to 256, an Ampere or newer GPU).
3. ``sdpa-grouped-by-length``: scaled-dot-product attention run once per run of equal-length
   sequences; the packed batch is ordered so each run is a contiguous [n, L] block (see packed.py).
   Measured on a 2-core CPU this beat nested/jagged tensors by about 5x. Every float32 path and
   every CPU path runs here.

The varlen kernels take the packed [T, H, d] tensors with ``cu_seqlens`` (int32, on the device,
[0, l0, l0+l1, ...] in packed order) and the longest length; packed.py's order (longest first,
equal lengths adjacent) is one valid sequence order for them as for the grouped path.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from embedstream.engine.packed import PackedBatch

try:  # optional GPU kernel
    from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - missing or built for another CUDA: fall back silently
    flash_attn_varlen_func = None

TORCH_VARLEN_INSTALLED = importlib.util.find_spec("torch.nn.attention.varlen") is not None  # older torch: not


def torch_varlen_attn(*args, **kwargs):
    """torch's own varlen kernel (``torch.nn.attention.varlen.varlen_attn``), imported on first use: the
    import pulls in torch._dynamo and triton, which a CPU process never runs and whose nanobind objects
    print ~40 "leaked instance/type/function" lines at interpreter exit."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(*args, **kwargs)

FLASH_ATTN = "flash-attn-varlen"
TORCH_VARLEN = "torch-varlen-attn"
GROUPED_SDPA = "sdpa-grouped-by-length"
HALF_DTYPES = (torch.float16, torch.bfloat16)
MAX_VARLEN_HEAD_DIM = 256  # both flash kernels' limit
MIN_VARLEN_CAPABILITY = (8, 0)  # flash-attn 2 and torch's flash kernel: Ampere or newer


@dataclass(frozen=True)
class KernelsAvailable:
    """Which varlen kernels this process can run on one device."""

    flash_attn: bool = False
    torch_varlen: bool = False


NO_VARLEN_KERNELS = KernelsAvailable()


def choose_kernel(device_type: str, dtype: torch.dtype, head_dim: int, available: KernelsAvailable) -> str:
    """The attention kernel for one (device, dtype, head size): flash-attn, then torch varlen_attn,
    then grouped SDPA (everything on CPU, float32 anywhere, head sizes the varlen kernels refuse)."""
    if device_type != "cuda" or dtype not in HALF_DTYPES or head_dim > MAX_VARLEN_HEAD_DIM:
        return GROUPED_SDPA
    if available.flash_attn:
        return FLASH_ATTN
    if available.torch_varlen and head_dim % 8 == 0:
        return TORCH_VARLEN
    return GROUPED_SDPA


def _torch_varlen_runs(index: int) -> bool:
    """One tiny bf16 call on the GPU: torch picks cuDNN or its flash kernel by GPU and build and raises
    where neither runs, which must mean the next kernel down rather than a failing worker."""
    device = torch.device("cuda", index)
    q = torch.zeros(4, 2, 32, dtype=torch.bfloat16, device=device)
    cu = torch.tensor([0, 3, 4], dtype=torch.int32, device=device)
    try:
        torch_varlen_attn(q, q, q, cu, cu, 3, 3)
    except (RuntimeError, ValueError):
        return False
    return True


@lru_cache(maxsize=16)
def _cuda_kernels_available(index: int) -> KernelsAvailable:
    if torch.cuda.get_device_capability(index) < MIN_VARLEN_CAPABILITY:
        return KernelsAvailable()
    flash_built = torch.backends.cuda.is_flash_attention_available()
    torch_varlen = TORCH_VARLEN_INSTALLED and flash_built and _torch_varlen_runs(index)
    return KernelsAvailable(flash_attn_varlen_func is not None, torch_varlen)


def kernels_available(device: torch.device) -> KernelsAvailable:
    """The varlen kernels usable on ``device`` (none off CUDA); cached per GPU."""
    if device.type != "cuda":
        return NO_VARLEN_KERNELS
    return _cuda_kernels_available(torch.cuda.current_device() if device.index is None else device.index)


def flash_available(device: torch.device) -> bool:
    return kernels_available(device).flash_attn


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


def varlen_args(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch) -> tuple:
    """The positional arguments both varlen kernels take: q, k, v (contiguous), cu_seqlens for q and
    for k (the same int32 tensor on the device), and the longest length for q and for k."""
    return q.contiguous(), k.contiguous(), v.contiguous(), batch.cu_seqlens, batch.cu_seqlens, batch.max_len, batch.max_len


def _torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, causal: bool) -> torch.Tensor:
    """torch's varlen_attn: causal is the window (-1, 0); the same cu_seqlens tensor for q and k lets
    torch pick cuDNN for causal too (it refuses two tensors there); GQA through ``enable_gqa``."""
    out = torch_varlen_attn(
        *varlen_args(q, k, v, batch), window_size=(-1, 0) if causal else (-1, -1), enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.contiguous()  # a no-op for [T, H, d] output; callers view it as [T, H * d]


def varlen_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch, causal: bool
) -> torch.Tensor:
    """Dispatch to the first usable exact kernel (``choose_kernel``); returns [T, Hq, d].

    On CUDA ``batch`` must already be on the device (the runner stages it): cu_seqlens is read there."""
    kernel = choose_kernel(q.device.type, q.dtype, q.shape[-1], kernels_available(q.device))
    if kernel == FLASH_ATTN:
        return flash_attn_varlen_func(*varlen_args(q, k, v, batch), causal=causal)
    if kernel == TORCH_VARLEN:
        return _torch_varlen(q, k, v, batch, causal)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    return grouped_sdpa(q, k, v, batch, causal, out)


def attention_kernel_name(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """The kernel ``varlen_attention`` runs for this model: what ``runner.describe()`` names."""
    return choose_kernel(device.type, dtype, head_dim, kernels_available(device))
