"""The labelled sets of `bench quality --hybrid` (prose chunks, API reference records): each query has
exactly one right text."""

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
    _exact_terms_occur_once(labelled)
    again = hybrid_set.build(chunks=800, known_items=60, exact=60, seed=2)
    assert again.queries == labelled.queries and again.chunks == labelled.chunks  # deterministic


def _exact_terms_occur_once(labelled) -> None:
    lowered = [chunk.lower() for chunk in labelled.chunks]
    kinds = [bool(hybrid_set.IDENTIFIER.fullmatch(q.text)) for q in labelled.of_kind("exact_term")]
    assert kinds.count(True) == kinds.count(False)  # half identifiers, half plain words
    for query in labelled.of_kind("exact_term"):
        assert hybrid_set.IDENTIFIER.fullmatch(query.text) or hybrid_set.WORD.fullmatch(query.text)
        holders = [i for i, chunk in enumerate(lowered) if query.text.lower() in chunk]
        assert holders == [query.answer], query.text


def test_api_records_leave_out_the_summary_their_query_is():
    labelled = hybrid_set.build_api(chunks=600, known_items=50, exact=40, seed=3)
    assert len(labelled.chunks) == 600 and len(set(labelled.chunks)) == 600
    assert len(labelled.of_kind("known_item")) == 50 and len(labelled.of_kind("exact_term")) == 40
    summaries = [q.text for q in labelled.of_kind("known_item")]
    assert len(set(summaries)) == 50
    for query in labelled.of_kind("known_item"):
        record = labelled.chunks[query.answer]
        assert query.text not in record and 5 <= len(query.text.split()) <= 25
        assert record.split("(")[0].count(".") >= 1  # a qualified name: module.function, module.Class.method
    _exact_terms_occur_once(labelled)
    assert hybrid_set.build_api(chunks=600, known_items=50, exact=40, seed=3) == labelled


def test_halves_split_every_kind():
    labelled = hybrid_set.build_api(chunks=300, known_items=20, exact=20, seed=1)
    halves = [labelled.half(0), labelled.half(1)]
    assert [len(h.of_kind("known_item")) for h in halves] == [10, 10]
    assert not set(halves[0].queries) & set(halves[1].queries)
    assert set(halves[0].queries) | set(halves[1].queries) == set(labelled.queries)


def test_identifiers_are_code_like_names_not_plain_words():
    found = [m.group(0) for m in hybrid_set.IDENTIFIER.finditer(
        "Call os.path.join or read_bytes; getLogger returns a Logger. Plain words and 3.14 do not count.")]
    assert found == ["os.path.join", "read_bytes", "getLogger"]


def test_long_queries_are_passages_held_out_of_their_text_and_change_no_other_query():
    for build in (hybrid_set.build, hybrid_set.build_api):
        plain = build(600, 30, 30, seed=4)
        labelled = build(600, 30, 30, seed=4, long=25)
        longs = labelled.of_kind("long")
        assert len(longs) == 25 and len({q.answer for q in longs}) == 25
        assert labelled.of_kind("known_item") == plain.of_kind("known_item")  # asking for long ones moves no other
        for query in longs:
            text = labelled.chunks[query.answer]
            assert len(query.text.split()) >= hybrid_set.LONG_WORDS and query.text not in text
            assert len(text.split()) >= 8
        assert not {q.answer for q in longs} & {q.answer for q in labelled.of_kind("known_item")}
        assert build(600, 30, 30, seed=4, long=25) == labelled


def test_the_numpy_corpus_is_numpys_docstring_prose():
    labelled = hybrid_set.CORPORA["numpy"](300, 10, 10, long=5)
    assert len(labelled.chunks) == 300 and len(labelled.of_kind("long")) == 5
    assert sum("array" in chunk.lower() for chunk in labelled.chunks) > 30
