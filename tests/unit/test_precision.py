"""Precision modes: exact float32 by default, mixed bf16 and dynamic int8 on request, refused where unsupported."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_engine

from embedstream.corpus import stdlib_paragraphs
from embedstream.config import EngineSettings
from embedstream.engine.backends.linear import DenseLinear, Int8Linear, make_linear
from embedstream.engine.engine import EmbedRequest, Engine
from embedstream.engine.errors import ConfigError
from embedstream.engine.runner import pick_precision


def _vectors(engine, texts) -> np.ndarray:
    results, _ = engine.embed([EmbedRequest(i, t, truncate=True) for i, t in enumerate(texts)])
    assert all(r.error is None for r in results), [r.error for r in results if r.error][:3]
    out = np.stack([r.vector.values for r in results])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _min_cos(a: np.ndarray, b: np.ndarray) -> float:
    return float((a * b).sum(1).min())


def test_auto_is_exact_float32_on_cpu_and_bf16_on_cuda():
    assert pick_precision("auto", torch.device("cpu")) == ("float32", torch.float32)
    assert pick_precision("auto", torch.device("cuda")) == ("bfloat16", torch.bfloat16)
    # On CPU bf16 is mixed precision: the residual stream (the model's dtype) stays float32.
    assert pick_precision("bfloat16", torch.device("cpu")) == ("bfloat16", torch.float32)


@pytest.mark.parametrize("native", [True, False])
def test_fast_is_bf16_only_where_the_hardware_computes_it(monkeypatch, native):
    from embedstream.engine import runner

    monkeypatch.setattr(runner, "cpu_has_native_bf16", lambda: native)
    expected = ("bfloat16", torch.float32) if native else ("float32", torch.float32)
    assert pick_precision("fast", torch.device("cpu")) == expected
    assert pick_precision("fast", torch.device("cuda")) == ("bfloat16", torch.bfloat16)


def test_int8_on_cuda_and_unknown_precisions_are_refused():
    with pytest.raises(ConfigError, match="int8 runs on CPU"):
        pick_precision("int8", torch.device("cuda"))
    with pytest.raises(ConfigError, match="precision must be one of"):
        pick_precision("fp8", torch.device("cpu"))


def test_linear_kinds_agree_with_a_float32_matmul():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 64) * 0.1, torch.randn(96), torch.randn(40, 64)
    residual = torch.randn(40, 96)
    exact = x @ weight.t() + bias
    for precision, tol in (("float32", 1e-5), ("bfloat16", 2e-2), ("int8", 3e-2)):
        layer = make_linear(weight, bias, precision)
        assert isinstance(layer, Int8Linear if precision == "int8" else DenseLinear)

        def close(got: torch.Tensor, want: torch.Tensor) -> None:
            assert (got.float() - want).norm() / want.norm() < tol, precision

        close(layer(x), exact)
        close(layer(x, "gelu"), torch.nn.functional.gelu(exact))
        close(layer(x, "gelu_tanh"), torch.nn.functional.gelu(exact, approximate="tanh"))
        close(layer(x, "relu"), torch.relu(exact))
        summed = layer.plus(x, residual)
        assert summed.dtype == residual.dtype
        close(summed, exact + residual)
        into = residual.clone()
        layer.add_into(into, x)
        close(into, exact + residual)


def test_float32_linear_without_onednn_matches_the_packed_one():
    torch.manual_seed(1)
    weight, bias, x = torch.randn(48, 32), torch.randn(48), torch.randn(10, 32)
    packed, plain = DenseLinear(weight, bias), DenseLinear(weight, bias)
    plain.packed, plain.weight_t = None, weight.t()
    for activation in (None, "gelu"):
        torch.testing.assert_close(packed(x, activation), plain(x, activation), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed.plus(x, x[:, :1].expand(10, 48).contiguous()),
                               plain.plus(x, x[:, :1].expand(10, 48).contiguous()), rtol=1e-5, atol=1e-5)


def test_minilm_mixed_bf16_keeps_cosine_and_int8_stays_close(minilm_engine):
    texts = list(stdlib_paragraphs()[:120])
    reference = _vectors(minilm_engine, texts)
    bf16 = Engine(minilm_engine.spec, EngineSettings(precision="bfloat16"))
    int8 = Engine(minilm_engine.spec, EngineSettings(precision="int8"))
    assert bf16.runner.describe().endswith(("/bfloat16", "/bfloat16-emulated"))
    assert int8.runner.describe().endswith("/int8")
    assert _min_cos(_vectors(bf16, texts), reference) >= 0.9999
    assert _min_cos(_vectors(int8, texts), reference) >= 0.97


def test_decoder_runs_in_every_cpu_precision(tiny_qwen3_dir):
    texts = list(stdlib_paragraphs()[300:340])
    reference = _vectors(make_engine(tiny_qwen3_dir), texts)
    for precision, floor in (("bfloat16", 0.999), ("int8", 0.97)):
        engine = make_engine(tiny_qwen3_dir, engine={"precision": precision})
        assert engine.runner.describe().startswith("packed-decoder")
        assert _min_cos(_vectors(engine, texts), reference) >= floor


def test_int8_refuses_the_padded_fallback(tiny_bert_dir):
    with pytest.raises(ConfigError, match="int8 needs the packed path.*backend=hf"):
        make_engine(tiny_bert_dir, engine={"backend": "hf", "precision": "int8"})


def test_warm_up_runs_every_query_length_and_changes_no_result(tiny_bert_dir, tiny_ce_dir):
    engine = make_engine(tiny_bert_dir)
    texts = list(stdlib_paragraphs()[:8])
    before = _vectors(engine, texts)
    assert engine.warm_up(12) == 12
    assert engine.warm_up(10**6) == engine.spec.max_tokens  # capped at the model's limit
    np.testing.assert_allclose(_vectors(engine, texts), before, atol=1e-6)
    assert make_engine(tiny_ce_dir, kind="rerank").warm_up(5) == 5
