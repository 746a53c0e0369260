"""The varlen attention dispatch (flash-attn -> torch varlen_attn -> grouped SDPA), checked on CPU:
the choice for every (device, dtype, head size, kernels present), the arguments each varlen kernel
gets for a packed batch (cu_seqlens int32 on the device from 0, cumulative lengths in packed order,
the longest length, causal window, GQA), and that those arguments describe the same attention the
grouped path computes."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from conftest import make_engine

from embedstream.engine import attention
from embedstream.engine.attention import (
    FLASH_ATTN,
    GROUPED_SDPA,
    TORCH_VARLEN,
    KernelsAvailable,
    attention_kernel_name,
    choose_kernel,
    grouped_sdpa,
    kernels_available,
    varlen_attention,
)
from embedstream.engine.packed import pack_sequences
from embedstream.engine.tokenize import Tokenized

BOTH = KernelsAvailable(flash_attn=True, torch_varlen=True)
FLASH_ONLY = KernelsAvailable(flash_attn=True)
TORCH_ONLY = KernelsAvailable(torch_varlen=True)
NONE = KernelsAvailable()
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


@pytest.mark.parametrize(
    ("device", "dtype", "head_dim", "available", "expected"),
    [
        ("cuda", BF16, 32, BOTH, FLASH_ATTN),  # flash-attn first when installed
        ("cuda", FP16, 64, FLASH_ONLY, FLASH_ATTN),
        ("cuda", BF16, 36, FLASH_ONLY, FLASH_ATTN),  # flash-attn pads odd head sizes itself
        ("cuda", BF16, 32, TORCH_ONLY, TORCH_VARLEN),  # no flash-attn: torch's own varlen kernel
        ("cuda", FP16, 128, TORCH_ONLY, TORCH_VARLEN),
        ("cuda", BF16, 256, TORCH_ONLY, TORCH_VARLEN),
        ("cuda", BF16, 36, TORCH_ONLY, GROUPED_SDPA),  # torch's kernel wants head size % 8 == 0
        ("cuda", BF16, 512, BOTH, GROUPED_SDPA),  # above both kernels' 256
        ("cuda", BF16, 32, NONE, GROUPED_SDPA),  # pre-Ampere GPU or no kernel built
        ("cuda", FP32, 32, BOTH, GROUPED_SDPA),  # exact float32 on a GPU: no half-precision kernel
        ("cpu", BF16, 32, BOTH, GROUPED_SDPA),  # CPU mixed precision
        ("cpu", FP32, 32, BOTH, GROUPED_SDPA),
    ],
)
def test_kernel_choice(device, dtype, head_dim, available, expected):
    assert choose_kernel(device, dtype, head_dim, available) == expected


def test_no_varlen_kernel_is_available_off_cuda():
    assert kernels_available(torch.device("cpu")) == NONE
    assert attention_kernel_name(torch.device("cpu"), BF16, 32) == GROUPED_SDPA


@pytest.mark.parametrize(
    ("capability", "flash_attn_installed", "flash_built", "probe_runs", "expected"),
    [
        ((9, 0), False, True, True, TORCH_ONLY),  # H100/H200 without the flash-attn package
        ((8, 0), True, True, True, BOTH),
        ((9, 0), False, False, True, NONE),  # a torch built without its flash kernel
        ((12, 0), False, True, False, NONE),  # a GPU where torch's varlen call raises: next kernel down
        ((7, 5), True, True, True, NONE),  # T4: neither flash kernel runs before Ampere
    ],
)
def test_cuda_availability_follows_capability_builds_and_a_probe(
    monkeypatch, capability, flash_attn_installed, flash_built, probe_runs, expected
):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.backends.cuda, "is_flash_attention_available", lambda: flash_built)
    monkeypatch.setattr(attention, "flash_attn_varlen_func", object() if flash_attn_installed else None)
    monkeypatch.setattr(attention, "_torch_varlen_runs", lambda index: probe_runs)
    assert attention._cuda_kernels_available.__wrapped__(0) == expected


def test_runner_describe_names_the_kernel_that_runs(tiny_bert_dir, monkeypatch):
    engine = make_engine(tiny_bert_dir, engine={"device": "cpu"})
    assert engine.runner.describe().split("/")[2] == GROUPED_SDPA
    monkeypatch.setattr(attention, "_cuda_kernels_available", lambda index: TORCH_ONLY)
    assert attention_kernel_name(torch.device("cuda", 0), BF16, engine.runner.encoder.head_dim) == TORCH_VARLEN


# -- packed order and cu_seqlens ---------------------------------------------------------------------


def _items(lengths: list[int]) -> list[Tokenized]:
    return [Tokenized(ids=[100 + i] * n, type_ids=[0] * n) for i, n in enumerate(lengths)]


def test_packed_order_is_the_order_of_cu_seqlens_and_of_the_equal_length_groups():
    lengths = [random.Random(7).randint(1, 40) for _ in range(60)] + [5, 5, 5, 1]
    items = _items(lengths)
    batch = pack_sequences(items)
    cu = batch.cu_seqlens.tolist()
    assert batch.cu_seqlens.dtype == torch.int32 and cu[0] == 0 and cu[-1] == batch.total_tokens
    assert [cu[k + 1] - cu[k] for k in range(len(items))] == batch.lengths == [lengths[i] for i in batch.order]
    ids = batch.input_ids.tolist()
    positions = batch.position_ids.tolist()
    for k, i in enumerate(batch.order):  # sequence k of cu_seqlens is the caller's item order[k]
        assert ids[cu[k] : cu[k + 1]] == items[i].ids
        assert positions[cu[k] : cu[k + 1]] == list(range(lengths[i]))
    k = 0
    for start, count, length in batch.groups:  # every group is a contiguous run of cu_seqlens
        assert start == cu[k] and all(cu[k + j + 1] - cu[k + j] == length for j in range(count))
        k += count
    assert k == len(items)


# -- the arguments each varlen kernel gets -------------------------------------------------------------


def _reference_varlen(q, k, v, cu, causal):
    """Attention per sequence as cu_seqlens delimits it: what a varlen kernel computes."""
    out = torch.empty_like(q)
    bounds = cu.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[s:e].transpose(0, 1) for t in (q, k, v))
        out[s:e] = F.scaled_dot_product_attention(
            qs, ks, vs, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1]
        ).transpose(0, 1)
    return out


class FakeKernel:
    """Stands in for a CUDA varlen kernel: records the call, computes what the kernel would."""

    def __init__(self, causal_of):
        self.calls: list[tuple[tuple, dict]] = []
        self.causal_of = causal_of

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        q, k, v, cu_q, _cu_k, _max_q, _max_k = args
        return _reference_varlen(q, k, v, cu_q, self.causal_of(kwargs))


def _qkv(total: int, heads: int, kv_heads: int, head_dim: int = 8):
    gen = torch.Generator().manual_seed(0)
    fused = torch.randn(total, heads + 2 * kv_heads, head_dim, generator=gen)
    return fused[:, :heads], fused[:, heads : heads + kv_heads], fused[:, heads + kv_heads :]  # strided views


def _check_varlen_args(args, batch, q):
    qa, ka, va, cu_q, cu_k, max_q, max_k = args
    assert all(t.is_contiguous() for t in (qa, ka, va))
    assert cu_q is cu_k  # one tensor: torch's cuDNN path refuses causal attention otherwise
    assert cu_q.dtype == torch.int32 and cu_q.device == q.device and cu_q.dim() == 1
    assert cu_q.tolist() == [0, *torch.tensor(batch.lengths).cumsum(0).tolist()]
    assert max_q == max_k == max(batch.lengths) and isinstance(max_q, int)


KERNELS = {
    TORCH_VARLEN: ("torch_varlen_attn", lambda kw: tuple(kw["window_size"]) == (-1, 0)),
    FLASH_ATTN: ("flash_attn_varlen_func", lambda kw: kw["causal"]),
}


@pytest.mark.parametrize("kernel", [TORCH_VARLEN, FLASH_ATTN])
@pytest.mark.parametrize(("causal", "heads", "kv_heads"), [(False, 4, 4), (True, 4, 2)])
def test_varlen_kernel_gets_the_packed_batch_and_matches_grouped_sdpa(monkeypatch, kernel, causal, heads, kv_heads):
    name, causal_of = KERNELS[kernel]
    fake = FakeKernel(causal_of)
    monkeypatch.setattr(attention, name, fake)
    monkeypatch.setattr(attention, "choose_kernel", lambda device, dtype, head_dim, available: kernel)
    batch = pack_sequences(_items([9, 3, 9, 1, 6, 3, 3]))
    q, k, v = _qkv(batch.total_tokens, heads, kv_heads)
    got = varlen_attention(q, k, v, batch, causal=causal)
    assert len(fake.calls) == 1
    args, kwargs = fake.calls[0]
    _check_varlen_args(args, batch, q)
    if kernel == TORCH_VARLEN:
        assert kwargs == {"window_size": (-1, 0) if causal else (-1, -1), "enable_gqa": heads != kv_heads}
    else:
        assert kwargs == {"causal": causal}
    want = grouped_sdpa(q, k, v, batch, causal, torch.empty(q.shape))
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(("causal", "kv_heads"), [(False, 4), (True, 2)])
def test_the_real_torch_varlen_attn_accepts_the_call(causal, kv_heads):
    """torch's own varlen_attn (meta tensors: its shape checks and backend choice, no kernel) takes the
    arguments built for a packed bf16 batch and returns [T, Hq, d]."""
    assert attention.torch_varlen_attn is not None, "the pinned torch has torch.nn.attention.varlen"
    batch = pack_sequences(_items([7, 7, 4, 2])).to(torch.device("meta"))
    q, k, v = (t.to("meta", torch.bfloat16) for t in _qkv(batch.total_tokens, 4, kv_heads, head_dim=32))
    out = attention._torch_varlen(q, k, v, batch, causal)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("causal", "kv_heads"), [(False, 4), (True, 2)])
def test_on_cuda_the_chosen_varlen_kernel_matches_grouped_sdpa(causal, kv_heads):
    device = torch.device("cuda")
    kernel = attention_kernel_name(device, BF16, 32)
    batch = pack_sequences(_items([130, 130, 64, 17, 17, 1])).to(device)
    q, k, v = (t.to(device, BF16) for t in _qkv(batch.total_tokens, 4, kv_heads, head_dim=32))
    got = varlen_attention(q, k, v, batch, causal=causal)
    want = grouped_sdpa(q, k, v, batch, causal, torch.empty(q.shape, dtype=BF16, device=device))
    assert kernel in (FLASH_ATTN, TORCH_VARLEN), f"an Ampere+ GPU should run a varlen kernel, got {kernel}"
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
