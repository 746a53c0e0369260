"""The labelled set of `bench quality --hybrid`: each query has exactly one right chunk."""

from __future__ import annotations

from embedstream.bench import hybrid_set


def test_known_items_are_held_out_and_exact_terms_occur_once():
    labelled = hybrid_set.build(chunks=800, known_items=60, exact=60, seed=2)
    assert len(labelled.chunks) == 800
    assert len(labelled.of_kind("known_item")) == 60 and len(labelled.of_kind("exact_term")) == 60
    lowered = [chunk.lower() for chunk in labelled.chunks]
    for query in labelled.of_kind("known_item"):
        assert query.text not in labelled.chunks[query.answer]  # the sentence left its chunk
        assert len(query.text.split()) >= 3
    for query in labelled.of_kind("exact_term"):
        assert hybrid_set.IDENTIFIER.fullmatch(query.text)
        holders = [i for i, chunk in enumerate(lowered) if query.text.lower() in chunk]
        assert holders == [query.answer], query.text
    again = hybrid_set.build(chunks=800, known_items=60, exact=60, seed=2)
    assert again.queries == labelled.queries and again.chunks == labelled.chunks  # deterministic


def test_identifiers_are_code_like_names_not_plain_words():
    found = [m.group(0) for m in hybrid_set.IDENTIFIER.finditer(
        "Call os.path.join or read_bytes; getLogger returns a Logger. Plain words and 3.14 do not count.")]
    assert found == ["os.path.join", "read_bytes", "getLogger"]
