"""Where a text is cut: at its end or its start (TEI's truncation_direction, Cohere's truncate), at the model's
limit or a lower one the request asks for (Cohere's max_tokens, max_tokens_per_doc)."""

from __future__ import annotations

from embedstream.config import Settings
from embedstream.engine.errors import EngineError
from embedstream.engine.model_spec import resolve_model
from embedstream.engine.tokenize import TextTokenizer, load_tokenizer


def _tokenizer() -> TextTokenizer:
    spec = resolve_model("all-MiniLM-L6-v2", Settings().models)
    return TextTokenizer(load_tokenizer(spec.path), spec.max_tokens)


def test_a_text_is_cut_at_its_end_or_its_start_at_the_model_limit_or_a_lower_one():
    tok = _tokenizer()
    words = [f"w{i}" for i in range(400)]
    text = " ".join(["apple"] * 300 + ["banana"] * 300)
    apple, banana = tok.tokenizer.token_to_id("apple"), tok.tokenizer.token_to_id("banana")
    right, left, short, short_left, refused, plain = tok.encode_many(
        [text, text, text, text, text, " ".join(words[:3])], [True, True, True, True, False, False],
        left=[False, True, False, True, False, False], limits=[None, None, 10, 10, 10, None])
    assert len(right) == len(left) == 256 and right.truncated and left.truncated
    assert set(right.ids[1:-1]) == {apple} and set(left.ids[1:-1]) == {banana}  # [CLS] ... [SEP] kept
    assert (right.ids[0], right.ids[-1]) == (left.ids[0], left.ids[-1]) == (101, 102)
    assert short.ids[1:-1] == [apple] * 8 and short_left.ids[1:-1] == [banana] * 8
    assert isinstance(refused, EngineError) and refused.code == "too_long" and "max_tokens of 10" in refused.message
    assert not plain.truncated
    assert tok.encode_many([text], [True])[0].ids == right.ids  # without the new arguments: as before


def test_a_passage_is_cut_to_the_asked_tokens_beside_its_query():
    tok = _tokenizer()
    passage = " ".join(["banana"] * 50)
    (full, cut) = tok.encode_pairs([("read a file", passage), ("read a file", passage)], [None, 7])
    assert not full.truncated and cut.truncated
    assert len(full) - len(cut) == 50 - 7
