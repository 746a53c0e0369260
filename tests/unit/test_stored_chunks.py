"""What the store already holds spares forward passes (workers/unchanged.py StoredChunks): a chunk whose point
holds its text and model is ``same`` or gets its payload rewritten; one whose text another point of its
document holds borrows that point's vectors; anything else is embedded. Real stores, a real model's spec."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from embedstream.schemas import ChunkEvent
from embedstream.vectorstore.edge_store import EdgeStore
from embedstream.vectorstore.factory import open_store
from embedstream.workers.sink import SAME, EmbeddedChunk, QdrantSink, ReusedChunk, SinkConfig, point_id
from embedstream.workers.unchanged import StoredChunks


def _unit(dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def _event(chunk_id: int, text: str, doc: str = "d", **metadata) -> ChunkEvent:
    return ChunkEvent(doc_id=doc, chunk_id=chunk_id, text=text, metadata=metadata or {"lang": "en"})


def _store(backend: str, tmp_path):
    return EdgeStore(tmp_path / "edge") if backend == "edge" else open_store(":memory:", None, None)


@pytest.fixture
def sink(minilm_engine):
    sink = QdrantSink(open_store(":memory:", None, None), minilm_engine.spec, 384, "docs", SinkConfig())
    sink.upsert([EmbeddedChunk(_event(i, f"text {i}"), _unit(384, i), {"offset": i}) for i in range(3)])
    return sink


def _kinds(found) -> list[str | None]:
    return [None if r is None else r.kind for r in found]


def test_text_and_model_decide_whether_a_chunk_is_embedded_the_metadata_whether_its_payload_is_rewritten(sink):
    lookup = StoredChunks(sink).lookup
    assert lookup([_event(i, f"text {i}") for i in range(3)]) == [SAME] * 3
    found = lookup([_event(0, "text 0"), _event(1, "text 1 edited"), _event(2, "text 2", lang="de"),
                    _event(3, "text 3"), _event(0, "text 0", doc="other")])
    assert _kinds(found) == ["same", None, "payload", None, None]  # new doc / new chunk: embedded
    assert found[2].layout == {}  # float32: the stored vectors carry no layout keys


def test_a_chunk_moved_by_an_edit_before_it_borrows_the_vectors_of_the_point_that_held_its_text(sink):
    """A sentence inserted at the start: every old chunk moves one place on; only the new one is embedded."""
    moved = [_event(0, "a new first chunk"), *(_event(i + 1, f"text {i}") for i in range(3))]
    found = StoredChunks(sink).lookup(moved)
    assert _kinds(found) == [None, "vectors", "vectors", "vectors"]
    stored = {p.payload["chunk_id"]: p for p in sink.store.scroll("docs", with_vectors=True)}
    for i in range(3):
        assert np.array_equal(found[i + 1].vectors["full"], stored[i].vectors["full"])
    # written under the new ids, with the new chunk ids and the vectors that text was embedded to
    sink.upsert([EmbeddedChunk(moved[0], _unit(384, 9), {}), *(ReusedChunk(e, r, {}) for e, r in zip(moved[1:], found[1:]))])
    after = {p.payload["chunk_id"]: p for p in sink.store.scroll("docs", with_vectors=True)}
    assert [after[i].payload["text"] for i in range(4)] == ["a new first chunk", "text 0", "text 1", "text 2"]
    for i in range(3):
        np.testing.assert_allclose(after[i + 1].vectors["full"], _unit(384, i), atol=1e-6)


def test_in_one_list_later_events_of_a_point_see_what_earlier_ones_write(sink):
    """A -> B -> A on one point: B is embedded; the second A wants what the store held before B, so it can
    borrow those vectors, never be taken as unchanged. Twice the same change: the second is ``same``."""
    found = StoredChunks(sink).lookup([_event(1, "text 1 edited"), _event(1, "text 1"), _event(1, "text 1"),
                                       _event(2, "text 2", lang="de"), _event(2, "text 2", lang="fr")])
    assert _kinds(found) == [None, "vectors", "same", "payload", "vectors"]


def test_points_of_another_embedding_are_never_reused_whatever_the_models_name(sink, minilm_engine):
    other = QdrantSink(sink.store, dataclasses.replace(minilm_engine.spec, pooling="cls"), 384, "docs", SinkConfig())
    assert StoredChunks(other).lookup([_event(0, "text 0"), _event(5, "text 1")]) == [None, None]
    renamed = QdrantSink(sink.store, dataclasses.replace(minilm_engine.spec, name="another-name"), 384, "docs",
                         SinkConfig())  # the same weights and settings under another name: the same embedding
    assert _kinds(StoredChunks(renamed).lookup([_event(0, "text 0"), _event(5, "text 1")])) == ["same", "vectors"]


def test_a_payload_rewrite_keeps_the_vectors_and_their_scale(tmp_path, minilm_engine):
    """uint8 storage keeps each vector's scale in the payload: a metadata-only change must keep it."""
    store = EdgeStore(tmp_path / "edge")
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig(datatype="uint8"))
    sink.upsert([EmbeddedChunk(_event(i, f"text {i}"), _unit(384, i), {}) for i in range(2)])
    before = {p.id: p for p in store.scroll("docs", with_vectors=True)}
    relabelled = [_event(0, "text 0", lang="de", status="published"), _event(1, "text 1", lang="de")]
    found = StoredChunks(sink).lookup(relabelled)
    assert _kinds(found) == ["payload", "payload"]
    sink.write_payloads([ReusedChunk(e, r, {"offset": 7}) for e, r in zip(relabelled, found)])
    after = {p.id: p for p in store.scroll("docs", with_vectors=True)}
    pid = point_id("d", 0)
    assert after[pid].payload["_scale"] == before[pid].payload["_scale"]
    assert after[pid].payload["status"] == "published" and after[pid].payload["lang"] == "de"
    assert after[pid].payload["source"] == {"offset": 7} and after[pid].vectors == before[pid].vectors
    assert StoredChunks(sink).lookup(relabelled) == [SAME, SAME]
    # a moved chunk keeps its vectors' scale too (edge gives uint8 vectors back as they were written)
    moved = StoredChunks(sink).lookup([_event(5, "text 1", lang="de")])
    assert _kinds(moved) == ["vectors"] and moved[0].layout == {"_scale": before[point_id("d", 1)].payload["_scale"]}
    store.close()


@pytest.mark.parametrize("backend", ["memory", "edge"])
def test_metadata_is_compared_as_typed_canonical_json(backend, tmp_path, minilm_engine):
    """1, 1.0 and true are three values (Python's == takes them for one, and such a change was never written);
    the order of an object's keys is no change."""
    store = _store(backend, tmp_path)
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig())
    stored = {"n": 1, "flag": True, "f": 1.0, "s": "1", "nested": {"a": 1, "b": [1, 2.5, False, None]}}
    sink.upsert([EmbeddedChunk(_event(0, "text 0", **stored), _unit(384, 0), {})])
    cases = [({"nested": {"b": [1, 2.5, False, None], "a": 1}, "s": "1", "f": 1.0, "flag": True, "n": 1}, "same"),
             ({**stored, "n": True}, "payload"), ({**stored, "n": 1.0}, "payload"), ({**stored, "flag": 1}, "payload"),
             ({**stored, "f": 1}, "payload"), ({**stored, "s": 1}, "payload"),
             ({**stored, "nested": {"a": True, "b": [1, 2.5, False, None]}}, "payload"),
             ({**stored, "nested": {"a": 1, "b": [1, 2.5, 0, None]}}, "payload"),
             ({**stored, "nested": {"a": 1, "b": [1, 2.5, False]}}, "payload")]
    lookup = StoredChunks(sink).lookup
    assert [lookup([_event(0, "text 0", **metadata)])[0].kind for metadata, _ in cases] == [kind for _, kind in cases]
    (found,) = lookup([_event(0, "text 0", **{**stored, "n": True})])
    assert sink.write_payloads([ReusedChunk(_event(0, "text 0", **{**stored, "n": True}), found, {})]) == []
    assert _kinds(lookup([_event(0, "text 0", **{**stored, "n": True})])) == ["same"]
    assert _kinds(lookup([_event(0, "text 0", **stored)])) == ["payload"]
    store.close()


@pytest.mark.parametrize("backend", ["memory", "edge"])
def test_a_payload_write_applies_only_while_its_point_holds_what_the_lookup_read(backend, tmp_path, minilm_engine):
    """A metadata-only write decided on T1 lands after a write of T2 (another lane, another name of the
    collection, an old owner): it is left unwritten and returned as lost, never written over T2's vector."""
    store = _store(backend, tmp_path)
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig())
    sink.upsert([EmbeddedChunk(_event(i, "text 1"), _unit(384, 1), {"offset": i}) for i in range(3)])
    relabelled = [_event(i, "text 1", lang="de") for i in range(3)]
    found = StoredChunks(sink).lookup(relabelled)
    assert _kinds(found) == ["payload"] * 3
    sink.upsert([EmbeddedChunk(_event(0, "text 2"), _unit(384, 2), {"offset": 10}),  # a text change came between
                 EmbeddedChunk(_event(1, "text 1", lang="fr"), _unit(384, 1), {"offset": 11})])  # another write
    lost = sink.write_payloads([ReusedChunk(e, r, {"offset": 20 + i}) for i, (e, r) in enumerate(zip(relabelled, found))])
    after = {p.payload["chunk_id"]: p for p in store.scroll("docs", with_vectors=True)}
    assert (after[0].payload["text"], after[0].payload["lang"], after[0].payload["source"]) == ("text 2", "en", {"offset": 10})
    np.testing.assert_allclose(after[0].vectors["full"], _unit(384, 2), atol=1e-6)
    assert (after[1].payload["lang"], after[1].payload["source"]) == ("fr", {"offset": 11})
    assert (after[2].payload["lang"], after[2].payload["source"]) == ("de", {"offset": 22})  # nothing came between
    assert [(r.event.chunk_id, r.event.metadata) for r in lost] == [(0, {"lang": "de"}), (1, {"lang": "de"})]
    store.close()


class CountingStore:
    """The real store, counting the points each read returns."""

    def __init__(self, store):
        self.store = store
        self.read: list[int] = []

    def get_payloads(self, *args, **kwargs):
        found = self.store.get_payloads(*args, **kwargs)
        self.read.append(len(found))
        return found

    def scroll(self, *args, **kwargs):
        found = self.store.scroll(*args, **kwargs)
        self.read.append(len(found))
        return found

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_lookup_reads_what_its_batch_needs_whatever_the_size_of_the_document(tmp_path, minilm_engine):
    """A 2,000-chunk document sent in batches of 56 chunks, then again with a chunk inserted at its start (every
    chunk moves and borrows its old vectors): no lookup reads more points than its batch has chunks."""
    store = CountingStore(EdgeStore(tmp_path / "edge"))
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig())
    lookup = StoredChunks(sink).lookup
    texts = [f"paragraph {i} of the long guide" for i in range(2000)]
    vectors = np.random.default_rng(0).standard_normal((2001, 384)).astype(np.float32)
    batch = 56
    for first in range(0, 2000, batch):
        events = [_event(i, texts[i], doc="long") for i in range(first, min(first + batch, 2000))]
        assert lookup(events) == [None] * len(events)
        sink.upsert([EmbeddedChunk(e, vectors[e.chunk_id], {}) for e in events])
    shifted = ["a new first paragraph", *texts]
    for first in range(0, 2001, batch):
        events = [_event(i, shifted[i], doc="long") for i in range(first, min(first + batch, 2001))]
        found = lookup(events)  # a batch's first chunk: its text's point was rewritten by the batch before
        assert _kinds(found) == [None] + ["vectors"] * (len(events) - 1)
        sink.upsert([ReusedChunk(e, r, {}) if r else EmbeddedChunk(e, vectors[2000], {}) for e, r in zip(events, found)])
    assert max(store.read) <= batch, f"points read per store call: max {max(store.read)}"
    assert store.count("docs") == 2001
    store.store.close()
