"""precision=tuned on a tiny model: measured once per host and model, cached, chosen by the floor; an explicit
precision still forces its path."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tiny_models
from conftest import make_engine
from structlog.testing import capture_logs

from embedstream.engine import tuner
from embedstream.engine.backends.linear import onednn_int8_available
from embedstream.engine.engine import EmbedRequest
from embedstream.engine.tuning import Measurement, PathSpec

PACKED = ("packed",)


@pytest.fixture()
def tiny_dir(tmp_path):
    """A fresh model folder per test: its cache (calibration, tuning) starts empty."""
    return tiny_models.build_tiny_bert(tmp_path / "tiny-tune", pooling="mean")


def _engine(folder, **engine):
    return make_engine(folder, name="tiny-tune", engine={"precision": "tuned", "threads": 1, "backend": "packed",
                                                        **engine})


def _vectors(engine, texts):
    results, _ = engine.embed([EmbedRequest(i, t) for i, t in enumerate(texts)])
    return np.stack([r.full for r in results])


def test_first_start_measures_every_path_and_later_starts_read_the_cache(tiny_dir):
    before = tuner.tunings_run
    with capture_logs() as logs:
        first = _engine(tiny_dir)
    assert tuner.tunings_run == before + 1
    measured = {m.path: m for m in first.runner.tuning.measurements}
    exact = measured[PathSpec("packed", "float32")]
    assert exact.recall_at_10 == 1.0 and exact.min_cos > 0.99999
    if onednn_int8_available():  # int8 recipes: per-token and static, with the most sensitive linears kept float
        recipes = {(p.activations, len(p.keep_float)) for p in measured if p.precision == "int8"}
        assert {("per_token", 0), ("per_token", 2), ("static", 2)} <= recipes
        assert len(first.runner.tuning.sensitivity) == 8  # 2 layers x (qkv, out, up, down)
    assert all(m.bulk_tok_s > 0 and m.query_ms > 0 and 0 <= m.recall_at_10 <= 1 for m in measured.values())
    chosen = [e for e in logs if e["event"] == "engine_path_chosen"]
    assert len(chosen) == 1 and chosen[0]["chosen"]["path"] == first.runner.choice.winner.path.label
    assert "tuned for bulk at recall@10>=0.98" in first.runner.describe()

    again = _engine(tiny_dir)
    assert tuner.tunings_run == before + 1  # read, not measured
    assert again.runner.choice.winner.path == first.runner.choice.winner.path


def _cached(folder, measurements):
    from embedstream.engine.model_spec import build_spec
    from embedstream.config import ModelConfig

    spec = build_spec("tiny-tune", ModelConfig(path=str(folder)))
    tuner.save(spec, 1, tuner.Tuning(measurements, key=tuner.host_key(1, PACKED)))


@pytest.mark.skipif(not onednn_int8_available(), reason="this torch build has no oneDNN int8 linear")
def test_the_cached_measurements_decide_and_the_floor_and_an_explicit_precision_overrule_them(tiny_dir):
    int8 = PathSpec("packed", "int8", "per_token", ("layers.1.down",), "float32")
    _cached(tiny_dir, [Measurement(PathSpec("packed", "float32"), 1000, 2.0, 1.0, 1.0),
                       Measurement(int8, 2500, 1.5, 0.99, 0.999)])
    before = tuner.tunings_run
    fast = _engine(tiny_dir)
    assert tuner.tunings_run == before
    assert fast.runner.precision == "int8" and fast.runner.path.endswith("int8 per-token, kept fp32: 1 down")
    assert "runner-up packed fp32 1,000 tok/s" in fast.runner.describe()
    kept = fast.runner.encoder.layers[1].down
    assert type(kept).__name__ == "DenseLinear"  # the kept linear runs unquantised
    assert type(fast.runner.encoder.layers[0].down).__name__ == "StaticInt8Linear"

    exact = _engine(tiny_dir, quality_floor="exact")
    assert exact.runner.precision == "float32" and exact.runner.path.endswith("/float32")
    strict = _engine(tiny_dir, quality_floor="0.995")
    assert strict.runner.precision == "float32"
    forced = make_engine(tiny_dir, name="tiny-tune", engine={"precision": "float32", "threads": 1})
    assert forced.runner.choice is None and forced.runner.path.endswith("/float32")

    texts = [f"text number {i} about foxes" for i in range(20)]
    cos = (_vectors(fast, texts) * _vectors(forced, texts)).sum(1)
    assert cos.min() > 0.95  # the int8 path still embeds the same texts (a tiny random model: loose bound)
    np.testing.assert_allclose(_vectors(exact, texts), _vectors(forced, texts), atol=1e-5)


def test_shapes_pick_from_the_same_measurements(tiny_dir):
    from embedstream.engine.engine import Engine
    from embedstream.config import EngineSettings, ModelConfig
    from embedstream.engine.model_spec import build_spec

    quick = PathSpec("packed", "int8", "static", (), "")
    _cached(tiny_dir, [Measurement(PathSpec("packed", "float32"), 3000, 1.0, 1.0, 1.0),
                       Measurement(quick, 2000, 0.5, 0.99, 0.999)])
    spec = build_spec("tiny-tune", ModelConfig(path=str(tiny_dir)))
    settings = EngineSettings(precision="tuned", threads=1, backend="packed")
    assert Engine(spec, settings, shape="bulk").runner.precision == "float32"  # more tok/s
    if onednn_int8_available():
        assert Engine(spec, settings, shape="online").runner.precision == "int8"  # lower query latency


def test_a_torn_cache_is_measured_again(tiny_dir):
    from embedstream.engine.model_spec import build_spec
    from embedstream.config import ModelConfig

    spec = build_spec("tiny-tune", ModelConfig(path=str(tiny_dir)))
    path = tuner.cache_path(spec, 1, PACKED)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    before = tuner.tunings_run
    _engine(tiny_dir)
    assert tuner.tunings_run == before + 1
    shutil.rmtree(path.parent)
