"""backend=openvino: OpenVINO's CPU kernels behind the runner's contract, on length groups of a packed batch."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest
from conftest import make_engine

from embedstream.corpus import mixed_length_texts
from embedstream.engine.backends import openvino_encoder
from embedstream.engine.backends.linear import cpu_has_native_bf16
from embedstream.engine.backends.openvino_encoder import length_groups
from embedstream.engine.engine import EmbedRequest, ScoreRequest
from embedstream.engine.errors import ConfigError

needs_openvino = pytest.mark.skipif(openvino_encoder.missing() is not None,
                                    reason=f"{openvino_encoder.missing()}")
TEXTS = [("the quick brown fox " * (i % 23 + 1)) + f"item {i}" for i in range(60)]


def _vectors(engine, texts) -> np.ndarray:
    results, _ = engine.embed([EmbedRequest(i, t, truncate=True) for i, t in enumerate(texts)])
    out = np.stack([r.vector.values for r in results])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_length_groups_cover_every_row_once_and_bound_the_padding():
    lengths = [120, 118, 117, 90, 88, 40, 40, 39, 5, 4, 1]  # packed order: longest first
    groups = length_groups(lengths, pad_limit=0.1)
    assert [i for a, b in groups for i in range(a, b)] == list(range(len(lengths)))  # consecutive, each once
    for a, b in groups:
        padded = lengths[a] * (b - a)
        assert padded - sum(lengths[a:b]) <= 0.1 * padded
    assert len(groups) < len(lengths)  # near lengths share a group
    assert length_groups(lengths, pad_limit=0.0) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 7), (7, 8), (8, 9),
                                                     (9, 10), (10, 11)]  # no padding: equal lengths only
    assert length_groups([7], 0.1) == [(0, 1)] and length_groups([], 0.1) == []
    assert length_groups([10, 1], pad_limit=1.0) == [(0, 2)]  # any padding allowed: one group


def test_unsupported_models_and_missing_packages_are_refused_with_the_reason(tiny_qwen3_dir, monkeypatch):
    with pytest.raises(ConfigError, match="backend=openvino cannot run .*not a BERT-family encoder"):
        make_engine(tiny_qwen3_dir, pooling="last_token", engine={"backend": "openvino"})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    assert "not installed: openvino" in openvino_encoder.missing()
    assert "embedstream[openvino]" in openvino_encoder.missing()


@needs_openvino
def test_float32_matches_the_packed_path_and_pads_little(tiny_bert_dir):
    packed = make_engine(tiny_bert_dir, engine={"backend": "packed"})
    ov = make_engine(tiny_bert_dir, engine={"backend": "openvino", "threads": 1})
    assert ov.runner.describe() == "openvino/cpu/float32"
    cos = (_vectors(ov, TEXTS) * _vectors(packed, TEXTS)).sum(1)
    assert cos.min() >= 0.99999
    encoder = ov.runner.encoder
    results, timings = ov.embed([EmbedRequest(i, t) for i, t in enumerate(TEXTS)])
    assert encoder.last_padding_tokens <= openvino_encoder.PAD_LIMIT * (timings.tokens + encoder.last_padding_tokens)


@needs_openvino
@pytest.mark.skipif(not cpu_has_native_bf16(), reason="bf16 runs natively only with AVX512-BF16 / AMX")
def test_bfloat16_stays_close_to_float32(tiny_bert_dir):
    packed = make_engine(tiny_bert_dir, engine={"backend": "packed"})
    ov = make_engine(tiny_bert_dir, engine={"backend": "openvino", "precision": "bfloat16", "threads": 1})
    assert ov.runner.describe() == "openvino/cpu/bfloat16"
    assert (_vectors(ov, TEXTS) * _vectors(packed, TEXTS)).sum(1).min() >= 0.999


@needs_openvino
def test_cross_encoder_scores_through_its_own_head_match_the_packed_path(tiny_ce_dir):
    packed = make_engine(tiny_ce_dir, kind="rerank", engine={"backend": "packed"})
    ov = make_engine(tiny_ce_dir, kind="rerank", engine={"backend": "openvino", "threads": 1})
    requests = [ScoreRequest(i, "what is a fox", t) for i, t in enumerate(TEXTS[:12])]
    want = np.array([r.score for r in packed.score(requests)[0]])
    got = np.array([r.score for r in ov.score(requests)[0]])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@needs_openvino
@pytest.mark.skipif(importlib.util.find_spec("nncf") is None, reason="int8 needs nncf (the openvino extra)")
def test_int8_is_calibrated_once_cached_next_to_the_model_and_reused(tiny_bert_dir, tmp_path, monkeypatch):
    import nncf

    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model, ignore=shutil.ignore_patterns(".embedstream-calibration"))
    first = make_engine(model, engine={"backend": "openvino", "precision": "int8", "threads": 1})
    assert first.runner.describe() == "openvino/cpu/int8"
    cached = list((model / ".embedstream-calibration").rglob(f"openvino-int8-{openvino_encoder.INT8_RECIPE}.xml"))
    assert len(cached) == 1 and cached[0].with_suffix(".bin").is_file()

    def no_second_calibration(*args, **kwargs):
        raise AssertionError("the cached int8 model should have been loaded")

    monkeypatch.setattr(nncf, "quantize", no_second_calibration)
    second = make_engine(model, engine={"backend": "openvino", "precision": "int8", "threads": 1})
    np.testing.assert_allclose(_vectors(second, TEXTS), _vectors(first, TEXTS), atol=1e-6)


@needs_openvino
@pytest.mark.skipif(importlib.util.find_spec("nncf") is None, reason="int8 needs nncf (the openvino extra)")
def test_minilm_openvino_int8_keeps_cosine_on_the_bench_corpus(minilm_engine, monkeypatch, tmp_path):
    """The issue's bar: min cos >= 0.99 against float32 over the bench texts (measured 0.9986, the FFN kept in bf16)."""
    monkeypatch.setenv("EMBEDSTREAM_CALIBRATION_DIR", str(tmp_path))  # the installed model is never written
    from embedstream.config import EngineSettings
    from embedstream.engine.engine import Engine

    int8 = Engine(minilm_engine.spec, EngineSettings(backend="openvino", precision="int8"))
    tok = minilm_engine.tokenizer.tokenizer
    texts = mixed_length_texts(200, lambda s: len(tok.encode(s).ids), minilm_engine.spec.max_tokens)
    assert (_vectors(int8, texts) * _vectors(minilm_engine, texts)).sum(1).min() >= 0.99
    assert list(tmp_path.rglob("openvino-int8-*.xml")), "the int8 model was not cached in the user cache"


@pytest.mark.parametrize("flags, hint", [
    ({"avx512f", "avx512_bf16", "amx_bf16", "amx_int8"}, "f32"),  # AMX: the bf16 hint broke single texts
    ({"avx512f", "avx512_bf16", "avx512_vnni"}, "bf16"),  # AVX512-BF16 without AMX (Zen 4): min cos 0.9986
    ({"avx2", "fma"}, "f32"),  # no native bf16
])
def test_int8_float_part_runs_in_float32_on_amx(monkeypatch, flags, hint):
    monkeypatch.setattr(openvino_encoder, "cpu_flags", lambda: frozenset(flags))
    from embedstream.engine.backends import linear
    monkeypatch.setattr(linear, "cpu_flags", lambda: frozenset(flags))
    assert openvino_encoder.int8_float_hint() == hint
