"""Pre-tokenized chunks: the producer's ids are what the engine would make, and bad ids are refused.

A chunk event may carry its model input (``token_ids``) and the fingerprint of the tokenization
that made it; an engine with the same fingerprint packs the ids as they are, any other engine
tokenizes the text, and ids it cannot trust (outside the vocabulary, over the limit, a foreign
fingerprint with no text) are per-item errors, never a failed batch.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import make_engine
from tiny_models import MINILM
from tokenizers import Tokenizer

from embedstream.corpus import documents
from embedstream.engine.engine import EmbedRequest
from embedstream.engine.tokenize import tokenizer_fingerprint
from embedstream.producers.chunker import Chunker
from embedstream.schemas import CHUNK_TOPIC_ADAPTER, ChunkEvent, DecodeError, decode, encode
from embedstream.schemas.token_ids import decode_token_ids, dtype_for_vocab, encode_token_ids


@pytest.fixture(scope="module")
def prompted():
    """MiniLM with a document prompt: the ids must hold the prompt's tokens too."""
    return make_engine(MINILM, "minilm-prompted", document_prompt="passage: ")


def _chunks(engine, count=40, chunk_tokens=100):
    chunker = Chunker.for_model(engine.spec, chunk_tokens=chunk_tokens, overlap_tokens=10)
    texts = [c for d in documents(12, seed=5) for c in chunker.chunk(d["text"])][:count]
    return chunker, texts, chunker.token_ids_many(texts)


def _requests(chunker, texts, encoded, text=True):
    return [EmbedRequest(i, t if text else "", prompt="document",
                         token_ids=decode_token_ids(ids, chunker.ids.dtype), tokenizer=chunker.ids.fingerprint)
            for i, (t, ids) in enumerate(zip(texts, encoded))]


def _cosines(a, b):
    return [float(np.dot(x.full, y.full) / np.linalg.norm(x.full) / np.linalg.norm(y.full)) for x, y in zip(a, b)]


@pytest.mark.parametrize("which", ["minilm", "prompted"])
def test_pre_tokenized_and_text_paths_give_the_same_ids_and_vectors(which, minilm_engine, prompted):
    engine = minilm_engine if which == "minilm" else prompted
    chunker, texts, encoded = _chunks(engine)
    assert chunker.ids.fingerprint == engine.document_fingerprint and all(encoded)
    by_text = engine.prepare([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)])
    by_ids = engine.prepare(_requests(chunker, texts, encoded, text=False))  # no text: the ids alone
    for a, b in zip(by_text, by_ids):
        assert a.tokens.ids == b.tokens.ids and a.tokens.prompt_tokens == b.tokens.prompt_tokens
    if which == "prompted":
        prompt_ids = engine.tokenizer.tokenizer.encode("passage: ", add_special_tokens=False).ids
        assert all(p.tokens.ids[1:1 + len(prompt_ids)] == prompt_ids for p in by_ids)  # [CLS] passage : ...
    text_results, _ = engine.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)])
    id_results, _ = engine.embed(_requests(chunker, texts, encoded, text=False))
    assert min(_cosines(text_results, id_results)) >= 0.9999


def test_a_foreign_fingerprint_is_tokenized_from_its_text(minilm_engine, prompted):
    chunker, texts, encoded = _chunks(prompted, count=6)  # ids include "passage: ", MiniLM's do not
    assert chunker.ids.fingerprint != minilm_engine.document_fingerprint
    results, _ = minilm_engine.embed(_requests(chunker, texts, encoded))
    reference, _ = minilm_engine.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)])
    assert min(_cosines(results, reference)) >= 0.9999
    no_text, _ = minilm_engine.embed(_requests(chunker, texts, encoded, text=False)[:1])
    assert no_text[0].error.code == "tokenizer_mismatch" and "no text" in no_text[0].error.message


def test_ids_the_model_cannot_take_are_per_item_errors(minilm_engine):
    fp = minilm_engine.document_fingerprint
    limit, vocab = minilm_engine.spec.max_tokens, minilm_engine.tokenizer.vocab_size
    ok = np.array([101, 7592, 2088, 102], dtype=np.int32)
    cases = {
        "over_vocab": np.array([101, vocab, 102], dtype=np.int32),
        "negative": np.array([101, -3, 102], dtype=np.int32),
        "too_long": np.array([101] + [2088] * limit + [102], dtype=np.int32),
        "not_1d": np.array([[101, 102]], dtype=np.int32),
        "floats": np.array([101.0, 102.0]),
    }
    requests = [EmbedRequest("good-0", "", prompt="document", token_ids=ok, tokenizer=fp)]
    requests += [EmbedRequest(name, "", prompt="document", token_ids=ids, tokenizer=fp) for name, ids in cases.items()]
    requests += [EmbedRequest("good-1", "hello world", prompt="document")]
    results, _ = minilm_engine.embed(requests)
    codes = {r.id: (r.error.code if r.error else None) for r in results}
    assert codes == {"good-0": None, "over_vocab": "token_id_out_of_range", "negative": "token_id_out_of_range",
                     "too_long": "too_long", "not_1d": "invalid_token_ids", "floats": "invalid_token_ids", "good-1": None}
    assert str(vocab - 1) in results[1].error.message and str(limit) in results[3].error.message
    assert float(np.dot(results[0].full, results[-1].full)) >= 0.9999  # the same text, by ids and by text


def test_truncation_of_ids_follows_the_text_path(minilm_engine):
    text = " ".join(["kafka"] * 600)
    ids = np.array(minilm_engine.tokenizer.tokenizer.encode(text).ids, dtype=np.int32)
    fp = minilm_engine.document_fingerprint
    by_ids, _ = minilm_engine.embed([EmbedRequest(0, "", prompt="document", token_ids=ids, tokenizer=fp, truncate=True)])
    by_text, _ = minilm_engine.embed([EmbedRequest(0, text, prompt="document", truncate=True)])
    assert by_ids[0].truncated and by_text[0].truncated and by_ids[0].tokens == by_text[0].tokens == 256
    assert float(np.dot(by_ids[0].full, by_text[0].full)) >= 0.9999


def test_ids_are_ignored_for_other_prompts(minilm_engine):
    ids = np.array([101, 102], dtype=np.int32)  # would be an empty text; the query path tokenizes the text
    results, _ = minilm_engine.embed([EmbedRequest(0, "hello world", prompt="query", token_ids=ids,
                                                   tokenizer=minilm_engine.document_fingerprint)])
    assert results[0].tokens == 4


def test_fingerprint_is_stable_and_covers_what_changes_ids(minilm_engine):
    tok = minilm_engine.tokenizer.tokenizer
    again = Tokenizer.from_str(tok.to_str())
    base = tokenizer_fingerprint(tok)
    assert base == tokenizer_fingerprint(again) and len(base) == 32
    again.enable_truncation(16)  # truncation is switched off wherever ids are made: not in the hash
    assert tokenizer_fingerprint(again) == base
    assert tokenizer_fingerprint(tok, prompt="passage: ") != base
    assert tokenizer_fingerprint(tok, lowercase=True) != base
    config = json.loads(tok.to_str())
    config["model"]["vocab"]["kafka"] = len(config["model"]["vocab"])  # one more word
    assert tokenizer_fingerprint(Tokenizer.from_str(json.dumps(config))) != base
    config = json.loads(tok.to_str())
    config["normalizer"]["lowercase"] = False
    assert tokenizer_fingerprint(Tokenizer.from_str(json.dumps(config))) != base


def test_wire_ids_round_trip_and_refuse_bad_encodings():
    ids = [101, 7592, 65535, 0, 102]
    assert dtype_for_vocab(30522) == "uint16" and dtype_for_vocab(151_669) == "int32"
    for dtype in ("uint16", "int32"):
        assert decode_token_ids(encode_token_ids(ids, dtype), dtype).tolist() == ids
    with pytest.raises(ValueError, match="range"):
        encode_token_ids([70_000], "uint16")
    event = ChunkEvent(doc_id="d", chunk_id=0, text="t", token_ids=encode_token_ids(ids, "uint16"),
                       token_dtype="uint16", tokenizer="ab" * 16)
    decoded = decode(encode(event), CHUNK_TOPIC_ADAPTER)
    assert decoded.token_id_array().tolist() == ids and decoded.tokenizer == "ab" * 16
    assert decode(encode(ChunkEvent(doc_id="d", chunk_id=0, text="t")), CHUNK_TOPIC_ADAPTER).token_id_array() is None
    bad = {"ZQ==": "whole number", "": "1 to", "ZQCoHSgIZgA=ZQ==": "base64"}  # 1 byte; no ids; data after padding
    for wire, reason in bad.items():
        raw = json.dumps({"doc_id": "d", "chunk_id": 0, "text": "t", "token_ids": wire, "token_dtype": "uint16",
                          "tokenizer": "ab" * 16}).encode()
        with pytest.raises(DecodeError) as err:
            decode(raw, CHUNK_TOPIC_ADAPTER)
        assert err.value.code == "invalid_event" and reason in err.value.message, err.value.message


def test_chunker_without_a_model_makes_text_only_chunks(minilm_engine):
    chunker = Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=40, overlap_tokens=0)
    assert chunker.token_ids_many(["hello world"]) == [None]
    assert Chunker.for_model(minilm_engine.spec, token_ids=False).token_ids_many(["hello"]) == [None]
