"""Sparse encoders: SPLADE on the packed path against a padded transformers reference, BM25's weights,
the engine's rows carrying their sparse vector, and refusals at start."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from embedstream.corpus import stdlib_paragraphs
from embedstream.config import ModelConfig, Settings
from embedstream.engine.engine import EmbedRequest, Engine
from embedstream.engine.errors import ConfigError
from embedstream.engine.model_spec import resolve_path
from embedstream.engine.splade import SpladeEncoder
from embedstream.vectors import SparseVector, sparse_of

SPLADE_TINY = resolve_path("package:cognition/model")


def _mixed_texts() -> list[str]:
    paragraphs = stdlib_paragraphs()
    texts = ["a", "os.path.join(a, b)", "Return the lowest index in the string where substring sub is found."]
    texts += [" ".join(paragraphs[i].split()[: 5 + 37 * i]) for i in range(6)]  # 5 .. 190 words
    return texts


def _reference(folder: Path, texts: list[str], max_len: int = 512) -> list[SparseVector]:
    """The straightforward SPLADE: padded batch, the transformers masked-LM forward, log(1 + relu),
    padding masked, max over tokens."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForMaskedLM.from_pretrained(str(folder)).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**batch).logits
    weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"][..., None]
    return [SparseVector.from_dense(row) for row in weights.amax(dim=1).numpy()]


def _splade_settings(model: str = "splade-tiny", **sparse) -> Settings:
    settings = Settings()
    settings.engine.threads = 1
    settings.sparse.kind = "splade"
    settings.sparse.model = model
    for key, value in sparse.items():
        setattr(settings.sparse, key, value)
    return settings


def _assert_same(ours: list[SparseVector | None], reference: list[SparseVector]) -> None:
    for i, (a, b) in enumerate(zip(ours, reference)):
        assert a is not None, f"text {i}: no sparse vector"
        np.testing.assert_array_equal(a.indices, b.indices, err_msg=f"text {i}: non-zero terms differ")
        np.testing.assert_allclose(a.values, b.values, atol=1e-4, rtol=0, err_msg=f"text {i}")


def test_splade_tiny_matches_the_padded_reference_on_mixed_lengths():
    """The real splade-tiny weights, through the engine's batches (dense model MiniLM, same tokenizer:
    its tokens are reused) and through plain texts (own tokenization)."""
    settings = _splade_settings()
    engine = Engine.from_name("all-MiniLM-L6-v2", settings)
    assert isinstance(engine.sparse, SpladeEncoder) and engine.sparse.shares_tokens
    texts = _mixed_texts()
    reference = _reference(SPLADE_TINY, texts)
    results, timings = engine.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)])
    _assert_same([r.sparse for r in results], reference)
    assert timings.sparse_ms is not None and timings.sparse_ms > 0
    _assert_same(engine.sparse.encode_texts(texts, query=True), reference)
    assert len({len(r.sparse) for r in results}) > 3  # different texts, different expansions


def test_splade_on_a_tiny_random_masked_lm_with_its_own_tokenizer(tmp_path):
    """A random BertForMaskedLM (another hidden size, a tokenizer unlike the dense model's): the text is
    tokenized again by the sparse model's tokenizer and the vectors still match the reference."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    torch.manual_seed(3)
    folder = tmp_path / "tiny-mlm"
    BertForMaskedLM(BertConfig(vocab_size=30522, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=96, max_position_embeddings=512)).eval().save_pretrained(folder)
    BertTokenizerFast(vocab_file=str(resolve_path(Settings().models["all-MiniLM-L6-v2"].path) / "vocab.txt"),
                      do_lower_case=False).save_pretrained(folder)
    settings = _splade_settings(str(folder))
    engine = Engine.from_name("all-MiniLM-L6-v2", settings)
    assert not engine.sparse.shares_tokens  # cased vs uncased: not the same tokenizer
    texts = _mixed_texts()
    results, _ = engine.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)])
    _assert_same([r.sparse for r in results], _reference(folder, texts))


def test_engine_rows_carry_their_sparse_vector_and_dense_stays_the_same(minilm_engine):
    settings = Settings()
    settings.engine.threads = 1
    settings.sparse.kind = "bm25"
    engine = Engine.from_name("all-MiniLM-L6-v2", settings)
    texts = _mixed_texts()
    requests = [EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)]
    prepared = engine.prepare(requests)
    from embedstream.engine.engine import StageTimings

    rows = engine.forward(prepared, StageTimings())
    plain = minilm_engine.forward(minilm_engine.prepare(requests), StageTimings())
    np.testing.assert_allclose(np.stack(rows), plain, atol=1e-6)
    for row, text in zip(rows, texts):
        assert sparse_of(row) == engine.sparse.encode_texts([text], query=False)[0]
    assert sparse_of(np.stack(rows)) is None  # derived arrays are plain ones


def test_bm25_weights_are_term_frequency_with_length_normalisation():
    """The model-token variant: weights by BM25's formula over the WordPiece ids, special tokens out;
    a query: 1 per distinct term."""
    settings = Settings()
    settings.engine.threads = 1
    settings.sparse.kind = "bm25"
    settings.sparse.bm25_tokenizer = "model"
    settings.sparse.bm25_avg_len = 10.0
    engine = Engine.from_name("all-MiniLM-L6-v2", settings)
    text = "json json json loads dumps"
    ids = [i for i in engine.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids]
    counts = Counter(ids)
    (doc,) = engine.sparse.encode_texts([text], query=False)
    length = sum(counts.values())
    for index, value in zip(doc.indices, doc.values):
        tf = counts[int(index)]
        assert value == pytest.approx(tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / 10.0)), rel=1e-6)
    assert sorted(doc.indices.tolist()) == sorted(counts)
    (query,) = engine.sparse.encode_texts([text], query=True)
    assert query.values.tolist() == [1.0] * len(counts)


def test_bm25_words_stem_and_drop_stop_words():
    settings = Settings()
    settings.sparse.kind = "bm25"
    engine = Engine.from_name("all-MiniLM-L6-v2", settings)
    a, b = engine.sparse.encode_texts(["The connection is running", "runs connected"], query=True)
    assert len(a) == 2 and a == b  # "the", "is" are stop words; run / running / runs share a stem


def test_a_dense_only_folder_is_refused_as_a_sparse_model_at_start():
    with pytest.raises(ConfigError, match="no masked-LM head"):
        Engine.from_name("all-MiniLM-L6-v2", _splade_settings("all-MiniLM-L6-v2"))


def test_a_sparse_model_with_a_shorter_limit_than_the_dense_one_is_refused(tmp_path):
    settings = _splade_settings("short")
    settings.models["short"] = ModelConfig(path=str(SPLADE_TINY), kind="splade", max_tokens=64)
    with pytest.raises(ConfigError, match="fewer than the dense model"):
        Engine.from_name("all-MiniLM-L6-v2", settings)
