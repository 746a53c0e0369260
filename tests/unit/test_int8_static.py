"""Static int8: calibrated activation ranges (cached once per model) keep MiniLM at cosine >= 0.99."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from conftest import make_engine

from embedstream.corpus import mixed_length_texts
from embedstream.config import EngineSettings
from embedstream.engine import calibrate
from embedstream.engine.backends.linear import StaticInt8Linear, onednn_int8_available
from embedstream.engine.engine import EmbedRequest, Engine

pytestmark = pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN int8 linear")


def _vectors(engine, texts) -> np.ndarray:
    results, _ = engine.embed([EmbedRequest(i, t, truncate=True) for i, t in enumerate(texts)])
    out = np.stack([r.vector.values for r in results])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).norm() / want.norm())


def test_static_int8_linear_matches_float32_with_its_epilogues():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 64) * 0.1, torch.randn(96), torch.randn(200, 64)
    residual = torch.randn(200, 96)
    exact = x @ weight.t() + bias
    inputs = [t.clone() for t in (weight, bias, x, residual)]
    for alpha, per_token, float_channels in ((None, False, 0), (0.5, False, 0), (0.5, False, 4), (None, True, 0),
                                             (0.5, True, 0), (0.5, True, 4)):
        layer = StaticInt8Linear(weight, bias, x.amin(0), x.amax(0), smooth_alpha=alpha, per_token=per_token,
                                 float_channels=float_channels)
        assert _rel_err(layer(x), exact) < 2e-2
        assert _rel_err(layer(x, "gelu"), torch.nn.functional.gelu(exact)) < 3e-2
        assert _rel_err(layer(x, "gelu_tanh"), torch.nn.functional.gelu(exact, approximate="tanh")) < 3e-2
        summed = layer.plus(x, residual)
        assert summed.dtype == torch.float32 and _rel_err(summed, exact + residual) < 2e-2
        into = residual.clone()
        layer.add_into(into, x)
        assert _rel_err(into, exact + residual) < 2e-2
    for per_token in (False, True):
        to_bf16 = StaticInt8Linear(weight, bias, x.amin(0), x.amax(0), out_dtype=torch.bfloat16, per_token=per_token,
                                   float_channels=4)
        out = to_bf16(x, "gelu")
        assert out.dtype == torch.bfloat16 and _rel_err(out, torch.nn.functional.gelu(exact)) < 3e-2
    for before, after in zip(inputs, (weight, bias, x, residual)):  # in-place epilogues never touch inputs
        assert torch.equal(before, after)


def test_float_channels_leave_the_callers_weight_alone():
    torch.manual_seed(3)
    weight, x = torch.randn(32, 48), torch.randn(50, 48)
    before = weight.clone()
    StaticInt8Linear(weight, None, x.amin(0), x.amax(0), smooth_alpha=None, per_token=True, float_channels=6)
    assert torch.equal(weight, before)


def test_per_token_scales_follow_each_rows_own_range():
    """Rows 1,000x apart in size: one calibrated scale rounds the small rows to nothing, per-row scales keep them."""
    torch.manual_seed(4)
    weight, x = torch.randn(64, 64) * 0.1, torch.randn(200, 64)
    x[::2] *= 1000
    small = slice(1, None, 2)
    exact = (x @ weight.t())[small]
    static = StaticInt8Linear(weight, None, x.amin(0), x.amax(0), smooth_alpha=None)
    token = StaticInt8Linear(weight, None, x.amin(0), x.amax(0), smooth_alpha=None, per_token=True)
    assert _rel_err(token(x)[small], exact) < 2e-2 < _rel_err(static(x)[small], exact)


def test_float_channels_take_the_outliers_smoothing_leaves():
    """A channel 300x the rest in some tokens only: smoothing by its calibrated range cannot fit both
    kinds of token; computing that channel in float keeps every row at int8's resolution."""
    torch.manual_seed(2)
    weight, x = torch.randn(64, 64) * 0.1, torch.randn(300, 64)
    x[::10, 5] *= 300
    exact = x @ weight.t()
    kwargs = dict(smooth_alpha=0.5, per_token=True)
    plain = StaticInt8Linear(weight, None, x.amin(0), x.amax(0), **kwargs)
    split = StaticInt8Linear(weight, None, x.amin(0), x.amax(0), float_channels=1, **kwargs)
    assert split.float_idx.tolist() == [5]
    assert _rel_err(split(x), exact) < 0.5 * _rel_err(plain(x), exact)


def test_smoothing_absorbs_an_outlier_channel():
    """One input channel 30x larger than the rest: a single activation scale wastes the 8 bits on it;
    SmoothQuant moves it into the weights."""
    torch.manual_seed(1)
    weight, x = torch.randn(64, 64) * 0.1, torch.randn(300, 64)
    x[:, 3] *= 30
    exact = x @ weight.t()
    plain = StaticInt8Linear(weight, None, x.amin(0), x.amax(0), smooth_alpha=None)
    smooth = StaticInt8Linear(weight, None, x.amin(0), x.amax(0), smooth_alpha=0.5)
    assert _rel_err(smooth(x), exact) < 0.5 * _rel_err(plain(x), exact)


def test_minilm_static_int8_keeps_cosine_on_the_bench_corpus(minilm_engine, monkeypatch, tmp_path):
    monkeypatch.setenv("EMBEDSTREAM_CALIBRATION_DIR", str(tmp_path))  # the installed model is never written
    tok = minilm_engine.tokenizer.tokenizer
    texts = mixed_length_texts(100, lambda s: len(tok.encode(s).ids), minilm_engine.spec.max_tokens)
    int8 = Engine(minilm_engine.spec, EngineSettings(precision="int8"))
    assert int8.runner.describe().endswith("/int8")
    assert any(isinstance(layer, StaticInt8Linear) for _, layer in int8.runner.encoder.named_linears())
    assert list(tmp_path.rglob("*.pt")), "calibration ranges were not cached in the user cache"
    cos = (_vectors(int8, texts) * _vectors(minilm_engine, texts)).sum(1)
    assert cos.min() >= 0.99, (cos.min(), cos.mean())


def test_calibration_is_cached_next_to_the_model_and_reused(tiny_bert_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model, ignore=shutil.ignore_patterns(".embedstream-calibration"))
    before = calibrate.calibrations_run
    first = make_engine(model, engine={"precision": "int8"})
    assert calibrate.calibrations_run == before + 1
    cached = list((model / ".embedstream-calibration").glob("*.pt"))
    assert len(cached) == 1
    second = make_engine(model, engine={"precision": "int8"})
    assert calibrate.calibrations_run == before + 1  # loaded, not measured again
    texts = ["the cache is reused", "a second worker starts in seconds"]
    np.testing.assert_array_equal(_vectors(first, texts), _vectors(second, texts))


def test_new_weights_get_a_new_calibration_key(tiny_bert_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model, ignore=shutil.ignore_patterns(".embedstream-calibration"))
    key = calibrate.model_key(model)
    assert calibrate.model_key(model) == key
    weights = next(p for p in model.iterdir() if p.suffix in (".safetensors", ".bin"))
    weights.write_bytes(weights.read_bytes() + b" ")
    assert calibrate.model_key(model) != key


def test_an_installed_model_is_calibrated_into_the_user_cache(minilm_engine, monkeypatch, tmp_path):
    monkeypatch.setenv("EMBEDSTREAM_CALIBRATION_DIR", str(tmp_path))
    path = calibrate.cache_file(minilm_engine.spec.path, "k")
    assert tmp_path in path.parents
