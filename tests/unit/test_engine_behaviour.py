"""Engine behaviour: per-item errors, truncation, Matryoshka, quantisation, normalisation, batching."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_engine

from embedstream.config import default_registry
from embedstream.engine.batcher import BatchLimits, pack, take_prefix
from embedstream.engine.engine import EmbedRequest, Engine
from embedstream.engine.errors import ConfigError, UnknownModelError
from embedstream.engine.model_spec import resolve_model
from embedstream.engine.packed import pack_sequences
from embedstream.engine.postprocess import dequantize

LONG = "The quick brown fox jumps over the lazy dog. " * 80


def test_bad_items_get_errors_and_the_rest_of_the_batch_is_embedded(minilm_engine):
    requests = [
        EmbedRequest("ok1", "a good sentence"),
        EmbedRequest("empty", "   "),
        EmbedRequest("int", 42),
        EmbedRequest("long", LONG),
        EmbedRequest("dims", "text", dimensions=128),
        EmbedRequest("big", "text", dimensions=1000),
        EmbedRequest("dtype", "text", dtype="int4"),
        EmbedRequest("ok2", "another good sentence"),
    ]
    results, _ = minilm_engine.embed(requests)
    by_id = {r.id: r for r in results}
    assert [r.id for r in results] == [r.id for r in requests]
    assert by_id["empty"].error.code == "empty_text"
    assert by_id["int"].error.code == "not_a_string"
    assert by_id["long"].error.code == "too_long" and "256" in by_id["long"].error.message
    assert by_id["dims"].error.code == "bad_dimensions" and "not Matryoshka" in by_id["dims"].error.message
    assert by_id["big"].error.code == "bad_dimensions" and "larger" in by_id["big"].error.message
    assert by_id["dtype"].error.code == "bad_dtype"
    alone, _ = minilm_engine.embed([EmbedRequest("x", "a good sentence")])
    np.testing.assert_allclose(by_id["ok1"].vector.values, alone[0].vector.values, atol=1e-5)
    assert by_id["ok2"].vector.values.shape == (384,)


def test_truncation_only_on_request_and_reported(minilm_engine):
    results, _ = minilm_engine.embed([EmbedRequest(1, LONG, truncate=True), EmbedRequest(2, "short", truncate=True)])
    assert results[0].truncated and results[0].tokens == 256
    assert not results[1].truncated
    assert results[0].to_json()["truncated"] is True


def test_unknown_model_is_a_clear_error():
    with pytest.raises(UnknownModelError, match="no-such-model"):
        resolve_model("no-such-model", default_registry())


def test_normalisation_off_returns_the_raw_pooled_vector(minilm_engine):
    (raw,), _ = minilm_engine.embed([EmbedRequest(1, "hello world", normalize=False)])
    (unit,), _ = minilm_engine.embed([EmbedRequest(1, "hello world")])
    norm = np.linalg.norm(raw.vector.values)
    assert abs(norm - 1.0) > 0.01
    np.testing.assert_allclose(raw.vector.values / norm, unit.vector.values, atol=1e-6)


def test_matryoshka_truncates_and_renormalises_only_listed_sizes(tiny_bert_dir):
    engine = make_engine(tiny_bert_dir, matryoshka_dims=[16, 8])
    full, cut, bad = engine.embed(
        [EmbedRequest(1, "some text"), EmbedRequest(2, "some text", dimensions=16), EmbedRequest(3, "x", dimensions=12)]
    )[0]
    expected = full.vector.values[:16] / np.linalg.norm(full.vector.values[:16])
    np.testing.assert_allclose(cut.vector.values, expected, atol=1e-6)
    assert bad.error.code == "bad_dimensions" and "[8, 16]" in bad.error.message


def test_output_dtypes(minilm_engine):
    f32, f16, i8, b1 = minilm_engine.embed(
        [EmbedRequest(i, "quantise me", dtype=d) for i, d in enumerate(["float32", "float16", "int8", "binary"])]
    )[0]
    ref = f32.vector.values
    assert f16.vector.values.dtype == np.float16
    np.testing.assert_allclose(f16.vector.values.astype(np.float32), ref, atol=1e-3)
    assert i8.vector.values.dtype == np.int8 and np.abs(i8.vector.values).max() == 127
    assert float(np.dot(dequantize(i8.vector), ref)) > 0.999
    assert b1.vector.values.dtype == np.uint8 and b1.vector.values.shape == (384 // 8,)
    np.testing.assert_array_equal(np.unpackbits(b1.vector.values).astype(bool), ref > 0)
    assert "scale" in i8.to_json() and "scale" not in f32.to_json()


def test_batch_limits_are_validated_at_start(tiny_bert_dir):
    with pytest.raises(ConfigError, match="max_batch_tokens=100 is below the model's max tokens \\(128\\)"):
        make_engine(tiny_bert_dir, engine={"max_batch_tokens": 100})


def test_pack_respects_token_and_request_budgets():
    limits = BatchLimits(max_batch_tokens=100, max_batch_requests=3)
    lengths = [50, 10, 60, 30, 30, 5, 5, 5, 90]
    for sort in (False, True):
        batches = pack(lengths, limits, sort_by_length=sort)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for b in batches:
            assert sum(lengths[i] for i in b) <= 100 and len(b) <= 3
    online = pack(lengths, limits)
    assert [i for b in online for i in b] == list(range(len(lengths)))  # arrival order kept
    bulk = pack(lengths, limits, sort_by_length=True)
    flat = [lengths[i] for b in bulk for i in b]
    assert flat == sorted(flat, reverse=True)
    assert take_prefix([40, 40, 40], limits) == 2
    assert take_prefix([40, 40, 40], limits, used_tokens=70) == 0
    assert take_prefix([1, 1, 1, 1], limits, used_requests=1) == 2


def test_packed_batches_carry_no_padding(minilm_engine):
    texts = ["a", "a somewhat longer text here", "mid length text", "b"]
    tokens = [p.tokens for p in minilm_engine.prepare([EmbedRequest(i, t) for i, t in enumerate(texts)])]
    batch = pack_sequences(tokens)
    assert batch.total_tokens == sum(len(t) for t in tokens)
    assert sum(c * n for _, c, n in batch.groups) == batch.total_tokens
    assert sorted(batch.order) == list(range(len(texts)))


def test_reranker_refuses_embedding_and_vice_versa(minilm_engine, tiny_ce_dir):
    from embedstream.engine.engine import ScoreRequest
    from embedstream.engine.errors import EngineError

    with pytest.raises(EngineError, match="not a reranker"):
        minilm_engine.score([ScoreRequest(1, "q", "p")])
    ce = make_engine(tiny_ce_dir, kind="rerank")
    with pytest.raises(EngineError, match="not an embedder"):
        ce.embed([EmbedRequest(1, "x")])
    results, _ = ce.score([ScoreRequest(1, "", "p"), ScoreRequest(2, "q", LONG), ScoreRequest(3, "q", "p")])
    assert results[0].error.code == "empty_text"
    assert results[1].truncated and results[1].tokens == ce.spec.max_tokens
    assert results[2].error is None and isinstance(results[2].score, float)


def test_engine_from_name_uses_the_registry():
    engine = Engine.from_name("all-MiniLM-L6-v2")
    assert engine.spec.pooling == "mean" and engine.spec.normalize and engine.spec.max_tokens == 256


def test_engine_errors_are_coded_errors():
    from embedstream.engine.errors import EngineError
    from embedstream.errors import CodedError
    from embedstream.workers.search import SearchError

    for error in (EngineError("too_long", "600 tokens"), ConfigError("bad"), UnknownModelError("x", []),
                  SearchError("empty_query", "query is empty")):
        assert isinstance(error, CodedError) and str(error) == error.message
        assert error.to_error_info().code == error.code
    assert EngineError("too_long", "600 tokens").to_dict() == {"code": "too_long", "message": "600 tokens"}
