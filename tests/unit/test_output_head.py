"""The output head follows the folder's sentence-transformers module pipeline: Pooling (with include_prompt),
Dense layers, Normalize; a module it does not implement is refused by name. Reference: SentenceTransformer."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tiny_models
from conftest import make_engine
from exactness import _min_cos, _vectors

from embedstream.corpus import stdlib_paragraphs
from embedstream.config import ModelConfig
from embedstream.engine.errors import ConfigError
from embedstream.engine.model_spec import build_spec, output_dimensions

TEXTS = list(stdlib_paragraphs()[200:212])
PROMPT = "query: "


def _reference(folder, **kw) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(TEXTS, batch_size=4, **kw)


@pytest.fixture(scope="module")
def dense_dir(model_dir):
    return tiny_models.build_tiny_st_pipeline(model_dir / "st-dense", [(48, True, "GELU"), (16, False, "Identity")])


def test_dense_layers_match_sentence_transformers(dense_dir):
    engine = make_engine(dense_dir)
    assert [(d.in_features, d.out_features, d.bias) for d in engine.spec.dense] == [(32, 48, True), (48, 16, False)]
    assert engine.dimensions == 16 and output_dimensions(engine.spec) == 16
    ours = _vectors(engine, TEXTS, truncate=True)
    ref = _reference(dense_dir)
    assert ours.shape == ref.shape == (len(TEXTS), 16)
    assert _min_cos(ours, ref) >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_default_tanh_dense_without_normalize_matches_unnormalised(model_dir):
    folder = tiny_models.build_tiny_st_pipeline(model_dir / "st-tanh", [(24, True, "Tanh")], pooling="cls", normalize=False)
    engine = make_engine(folder)
    assert not engine.spec.normalize and engine.spec.pooling == "cls"
    ours = _vectors(engine, TEXTS, truncate=True)
    np.testing.assert_allclose(ours, _reference(folder), atol=1e-4)  # raw values, not only their direction


def test_residual_dense_layers_match_sentence_transformers(model_dir):
    folder = tiny_models.build_tiny_st_pipeline(model_dir / "st-residual", [(32, True, "Tanh", True),
                                                                           (20, True, "ReLU", True)])
    engine = make_engine(folder)
    assert [d.residual for d in engine.spec.dense] == [True, True] and engine.dimensions == 20
    assert _min_cos(_vectors(engine, TEXTS, truncate=True), _reference(folder)) >= 0.9999


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_include_prompt_false_leaves_the_prompt_out_like_sentence_transformers(model_dir, pooling):
    folder = tiny_models.build_tiny_st_pipeline(model_dir / f"st-noprompt-{pooling}", [], pooling=pooling,
                                                include_prompt=False)
    engine = make_engine(folder, query_prompt=PROMPT)
    assert not engine.spec.include_prompt
    ours = _vectors(engine, TEXTS, truncate=True, prompt="query")
    excluded = _reference(folder, prompt=PROMPT)
    assert _min_cos(ours, excluded) >= 0.9999
    included = _reference(tiny_models.build_tiny_st_pipeline(model_dir / f"st-prompt-{pooling}", [], pooling=pooling))
    assert _min_cos(excluded, included) < 0.9999  # the check above can tell the two apart


def test_include_prompt_true_keeps_the_prompt_in_the_mean(model_dir):
    folder = tiny_models.build_tiny_st_pipeline(model_dir / "st-withprompt", [], include_prompt=True)
    engine = make_engine(folder, query_prompt=PROMPT)
    assert _min_cos(_vectors(engine, TEXTS, truncate=True, prompt="query"), _reference(folder, prompt=PROMPT)) >= 0.9999


def _copy_with_modules(src, dst, edit) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    modules = json.loads((dst / "modules.json").read_text())
    (dst / "modules.json").write_text(json.dumps(edit(modules)))


@pytest.mark.parametrize("module_type", ["sentence_transformers.models.LayerNorm", "my_lib.heads.Whitening"])
def test_a_module_embedstream_does_not_implement_is_refused_by_name(dense_dir, tmp_path, module_type):
    def add(modules):
        return modules[:-1] + [{"idx": len(modules) - 1, "name": "x", "path": "9_X", "type": module_type},
                               {**modules[-1], "idx": len(modules)}]

    _copy_with_modules(dense_dir, tmp_path / "m", add)
    with pytest.raises(ConfigError, match=module_type.replace(".", r"\.")):
        build_spec("m", ModelConfig(path=str(tmp_path / "m")))
    with pytest.raises(ConfigError, match=module_type.rsplit(".", 1)[-1]):
        make_engine(tmp_path / "m")


def test_refusals_for_broken_pipelines(dense_dir, tmp_path):
    _copy_with_modules(dense_dir, tmp_path / "order", lambda m: [m[0], m[2], m[1], *m[3:]])
    with pytest.raises(ConfigError, match="order"):
        build_spec("m", ModelConfig(path=str(tmp_path / "order")))
    shutil.copytree(dense_dir, tmp_path / "noweights")
    for weights in (tmp_path / "noweights" / "2_Dense").glob("model.*"):
        weights.unlink()
    with pytest.raises(ConfigError, match="Dense has no weights"):
        build_spec("m", ModelConfig(path=str(tmp_path / "noweights")))
    shutil.copytree(dense_dir, tmp_path / "chain")
    cfg = json.loads((tmp_path / "chain" / "3_Dense" / "config.json").read_text())
    (tmp_path / "chain" / "3_Dense" / "config.json").write_text(json.dumps({**cfg, "in_features": 40}))
    with pytest.raises(ConfigError, match="takes 40 features but receives 48"):
        build_spec("m", ModelConfig(path=str(tmp_path / "chain")))


def test_registry_overrides_still_win_over_the_folder(dense_dir):
    spec = build_spec("m", ModelConfig(path=str(dense_dir), pooling="cls", normalize=False, matryoshka_dims=[8]))
    assert spec.pooling == "cls" and not spec.normalize and spec.matryoshka_dims == (8,)
    with pytest.raises(ConfigError, match="1..16"):
        build_spec("m", ModelConfig(path=str(dense_dir), matryoshka_dims=[32]))  # larger than the Dense output
