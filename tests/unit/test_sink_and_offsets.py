"""The Qdrant sink's point ids, storage forms and deletes; which offsets may be committed."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_engine

from embedstream.vectorstore.factory import open_store
from embedstream.schemas import ChunkEvent, DocumentDelete
from embedstream.workers.transport.offsets import OffsetTracker
from embedstream.workers.sink import SAME, EmbeddedChunk, QdrantSink, SinkConfig, point_id
from embedstream.workers.unchanged import StoredChunks


def _unit(dim: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


def _chunks(n: int, dim: int, doc: str = "doc") -> list[EmbeddedChunk]:
    return [EmbeddedChunk(ChunkEvent(doc_id=doc, chunk_id=i, text=f"chunk {i}", metadata={"lang": "en"}), _unit(dim, i),
                          {"topic": "t", "partition": 0, "offset": i}) for i in range(n)]


def test_upsert_is_idempotent_and_payload_complete(minilm_engine):
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig())
    sink.upsert(_chunks(5, 384))
    sink.upsert(_chunks(5, 384))
    assert store.count("docs") == 5
    points = {p.id: p for p in store.scroll("docs")}
    assert set(points) == {point_id("doc", i) for i in range(5)}
    p = points[point_id("doc", 3)]
    assert p.payload["chunk_id"] == 3 and p.payload["lang"] == "en" and p.payload["source"]["offset"] == 3
    assert len(p.payload["content_hash"]) == 64


def test_deletes_remove_a_whole_document_or_listed_chunks(minilm_engine):
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig())
    sink.upsert(_chunks(4, 384, "a") + _chunks(3, 384, "b"))
    sink.delete(DocumentDelete(doc_id="a", chunk_ids=[0, 1]))
    assert store.count("docs") == 5
    sink.delete(DocumentDelete(doc_id="b"))
    assert sorted(p.payload["chunk_id"] for p in store.scroll("docs")) == [2, 3]


@pytest.mark.parametrize("kind", ["memory", "edge"])
def test_a_tail_delete_removes_the_chunks_from_there_on_of_that_document_only(minilm_engine, tmp_path, kind):
    """A document that shrank from 6 chunks to 4 (the publisher's ``from_chunk``): its chunks 4 and 5 go, by one
    filtered delete (no scroll of the document's points); another document's chunks 4 and 5 stay."""
    store = open_store(":memory:", None, None) if kind == "memory" else open_store(None, None, tmp_path / "edge")
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig())
    sink.upsert(_chunks(6, 384, "a") + _chunks(6, 384, "b"))
    sink.delete(DocumentDelete(doc_id="a", from_chunk=4))
    left = sorted((p.payload["doc_id"], p.payload["chunk_id"]) for p in store.scroll("docs"))
    assert left == [("a", i) for i in range(4)] + [("b", i) for i in range(6)]
    store.close()


def test_uint8_storage_and_matryoshka_named_vectors(tiny_bert_dir):
    engine = make_engine(tiny_bert_dir, matryoshka_dims=[16, 8])
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, engine.spec, 32, "docs", SinkConfig("uint8", "none", (16,)))
    item = _chunks(1, 32)[0]
    point = sink.to_points([item])[0]
    assert set(point.vectors) == {"full", "mrl_16"}
    full = np.array(point.vectors["full"])
    assert full.min() >= 1 and full.max() <= 255
    restored = (full - 128) * point.payload["_scale"]
    assert float(np.dot(restored / np.linalg.norm(restored), item.vector)) > 0.999
    mrl = np.array(point.vectors["mrl_16"], dtype=np.float32) - 128
    expected = item.vector[:16] / np.linalg.norm(item.vector[:16])
    assert float(np.dot(mrl / np.linalg.norm(mrl), expected)) > 0.999
    with pytest.raises(ValueError, match="not trained"):
        QdrantSink(store, engine.spec, 32, "docs", SinkConfig("float32", "none", (12,)))


def test_only_a_contiguous_finished_prefix_is_committable():
    tracker = OffsetTracker()
    handles = [tracker.track("t", 0, off) for off in range(10, 15)]
    other = tracker.track("t", 1, 7)
    assert tracker.drain() == {}
    OffsetTracker.done(handles[1])
    OffsetTracker.done(handles[2])
    assert tracker.drain() == {}  # offset 10 still in flight
    OffsetTracker.done(handles[0])
    assert tracker.drain() == {("t", 0): 13}
    OffsetTracker.done(other)
    OffsetTracker.done(handles[4])
    assert tracker.drain() == {("t", 1): 8}
    assert tracker.outstanding() == 1
    tracker.forget({("t", 0)})
    assert tracker.outstanding() == 0


def test_the_position_is_committed_past_skipped_offsets_only_when_nothing_is_in_flight():
    """Offsets the client never delivers (a transaction's commit marker, aborted records) are committed past
    once everything delivered before them is finished, and never over a record still in flight."""
    t = OffsetTracker()
    tp = ("chunks", 0)
    h = t.track("chunks", 0, 10)
    assert t.past_skipped(tp, 12) is None  # offset 10 is in flight
    t.done(h)
    assert t.drain() == {tp: 11}
    assert t.past_skipped(tp, 11) is None  # nothing skipped: already drained to 11
    assert t.past_skipped(tp, None) is None  # position unknown
    assert t.past_skipped(tp, 12) == 12  # offset 11 was a marker
    assert t.past_skipped(tp, 12) is None  # committed once
    t.forget({tp})
    assert t.past_skipped(tp, 12) == 12  # a partition assigned again starts afresh


def test_the_sink_hashes_the_text_itself_and_ignores_the_producers_hash(minilm_engine):
    """New text under the old content_hash (a stale or lying producer) is not skipped as unchanged."""
    import hashlib

    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, minilm_engine.spec, 384, "docs", SinkConfig())
    old = ChunkEvent(doc_id="d", chunk_id=0, text="the old text", metadata={})
    sink.upsert([EmbeddedChunk(old, _unit(384, 0), {"topic": "t", "partition": 0, "offset": 0})])
    stored = next(iter(store.scroll("docs"))).payload["content_hash"]
    assert stored == hashlib.sha256(b"the old text").hexdigest()

    lying = ChunkEvent(doc_id="d", chunk_id=0, text="brand new text", content_hash=stored, metadata={})
    assert StoredChunks(sink).lookup([lying]) == [None]
    assert sink.to_points([EmbeddedChunk(lying, _unit(384, 1), {})])[0].payload["content_hash"] == \
        hashlib.sha256(b"brand new text").hexdigest()
    same = ChunkEvent(doc_id="d", chunk_id=0, text="the old text", content_hash="0" * 64, metadata={})
    assert StoredChunks(sink).lookup([same]) == [SAME]
