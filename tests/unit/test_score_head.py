"""Cross-encoder scores go through the model's own classification head, whatever its architecture keeps
there (BERT: pooler + classifier; RoBERTa: a head module of its own), on the packed and the padded path."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from conftest import make_engine

from embedstream.corpus import stdlib_paragraphs
from embedstream.engine.engine import ScoreRequest


def _pairs(n: int) -> list[tuple[str, str]]:
    paras = stdlib_paragraphs()
    return [(" ".join(paras[i].split()[:12]), paras[i + 700]) for i in range(n)]


def _max_diff(engine, folder) -> float:
    from sentence_transformers import CrossEncoder

    pairs = _pairs(24)
    results, _ = engine.score([ScoreRequest(i, q, p) for i, (q, p) in enumerate(pairs)])
    assert all(r.error is None for r in results)
    ref = CrossEncoder(str(folder), device="cpu", max_length=engine.spec.max_tokens).predict(pairs)
    return float(np.abs(np.array([r.score for r in results]) - ref).max())


@pytest.fixture(scope="module")
def roberta_ce_dir(model_dir):
    return tiny_models.build_tiny_roberta_cross_encoder(model_dir / "tiny-roberta-ce")


@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_roberta_head_matches_cross_encoder(roberta_ce_dir, backend):
    engine = make_engine(roberta_ce_dir, kind="rerank", engine={"backend": backend})
    assert engine.runner.describe().startswith("packed-bert" if backend == "auto" else "hf-padded")
    assert engine.runner.head.reads == ("first" if backend == "auto" else "all")
    assert _max_diff(engine, roberta_ce_dir) <= 1e-4


def test_bert_head_on_the_padded_path_matches_cross_encoder(tiny_ce_dir):
    engine = make_engine(tiny_ce_dir, kind="rerank", engine={"backend": "hf"})
    assert engine.runner.head.reads == "all"
    assert _max_diff(engine, tiny_ce_dir) <= 1e-4
