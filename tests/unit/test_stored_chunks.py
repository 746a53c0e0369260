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


def test_points_of_another_model_are_never_reused(sink, minilm_engine):
    other = QdrantSink(sink.store, dataclasses.replace(minilm_engine.spec, name="another-model"), 384, "docs",
                       SinkConfig())
    assert StoredChunks(other).lookup([_event(0, "text 0"), _event(5, "text 1")]) == [None, None]


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
