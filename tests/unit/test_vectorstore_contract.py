"""One contract, every backend: the same assertions run on qdrant-client ':memory:', on the embedded
qdrant-edge store and on a real Qdrant server (v1.19.0, tests/qdrant_rig.py), so the pipeline can rely on
identical behaviour.

Expected results come from numpy brute force on the same random vectors, not from
the store itself, so a backend that returns plausible but wrong results fails.
"""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

from embedstream.vectorstore import (
    AliasError,
    CollectionConfigMismatch,
    CollectionNotFound,
    Point,
    Prefetch,
    VectorSpec,
    open_store,
)
from embedstream.vectorstore.base import AtLeast
from embedstream.vectorstore.edge_store import EdgeStore, StoreLockedError
from embedstream.vectorstore.qdrant_client_store import QdrantClientStore
from embedstream.vectors import canonical_json

N = 300
FULL, SMALL = 48, 12
SPECS = {"full": VectorSpec(FULL), "small": VectorSpec(SMALL)}
DOCS = N // 5  # 5 chunks per doc


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1234)
    full = _unit(rng.standard_normal((N, FULL)).astype(np.float32))
    small = _unit(full[:, :SMALL].copy())  # MRL-like: the small vector is a truncated full one
    ids = [str(uuid.UUID(int=int(rng.integers(1, 2**63)) << 64 | i)) for i in range(N)]
    payloads = [
        {"doc_id": f"doc-{i // 5:03d}", "chunk": i % 5, "lang": "de" if i % 3 == 0 else "en", "text": f"chunk {i}"}
        for i in range(N)
    ]
    return {"full": full, "small": small, "ids": ids, "payloads": payloads, "rng": rng}


def _points(data, idx=None, payload_update=None):
    idx = range(N) if idx is None else idx
    out = []
    for i in idx:
        payload = dict(data["payloads"][i])
        if payload_update:
            payload.update(payload_update)
        out.append(Point(id=data["ids"][i], vectors={"full": data["full"][i], "small": data["small"][i]}, payload=payload))
    return out


BACKENDS = ["memory", "edge", "server"]


def _server(tmp_path_factory, number: int):
    from parts import require
    from qdrant_rig import BINARY, QdrantServer

    require("qdrant", BINARY.is_file(), f"no Qdrant server binary at {BINARY}")
    return QdrantServer(tmp_path_factory.mktemp(f"qdrant-server-{number}"), number)


@pytest.fixture(scope="module")
def qdrant_server(tmp_path_factory):
    """The server of the tests that write (each empties it when it ends)."""
    server = _server(tmp_path_factory, 0)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def qdrant_server_ro(tmp_path_factory):
    """The server of the module's read-only collection, apart from the one the other tests empty."""
    server = _server(tmp_path_factory, 1)
    yield server
    server.stop()


def _open(backend: str, folder, request, server: str = "qdrant_server") -> "VectorStore":
    if backend == "memory":
        return QdrantClientStore.in_memory()
    if backend == "edge":
        return EdgeStore(folder)
    return _EmptiedOnClose(QdrantClientStore.connect(request.getfixturevalue(server).url))


class _EmptiedOnClose:
    """A server store whose collections and aliases go when the test closes it (the server outlives the test)."""

    def __init__(self, store):
        self._store = store

    def close(self) -> None:
        for alias in self._store.list_aliases():
            self._store.delete_alias(alias)
        for name in self._store.list_collections():
            self._store.delete_collection(name)
        self._store.close()

    def __getattr__(self, name):
        return getattr(self._store, name)


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    s = _open(request.param, tmp_path / "edge", request)
    yield s
    s.close()


@pytest.fixture
def filled(store, data):
    assert store.ensure_collection("docs", SPECS) is True
    pts = _points(data)
    for i in range(0, N, 128):
        store.upsert("docs", pts[i : i + 128], wait=True)
    return store


@pytest.fixture(scope="module", params=BACKENDS)
def readonly(request, tmp_path_factory, data):
    """Filled once per backend for the tests that only read (keeps the suite fast)."""
    s = _open(request.param, tmp_path_factory.mktemp("edge-ro"), request, "qdrant_server_ro")
    s.ensure_collection("docs", SPECS)
    pts = _points(data)
    for i in range(0, N, 128):
        s.upsert("docs", pts[i : i + 128])
    yield s
    s.close()


def _topk_cosine(matrix: np.ndarray, q: np.ndarray, k: int, subset: np.ndarray | None = None) -> list[int]:
    scores = matrix @ q
    order = np.argsort(-scores, kind="stable")
    if subset is not None:
        allowed = set(int(i) for i in subset)
        order = [i for i in order if i in allowed]
    return [int(i) for i in order[:k]]


# ---- collections --------------------------------------------------------------------
def test_ensure_collection_creates_once(store):
    assert not store.collection_exists("docs")
    assert store.ensure_collection("docs", SPECS) is True
    assert store.collection_exists("docs")
    assert store.ensure_collection("docs", dict(SPECS)) is False  # same config: reused
    assert store.list_collections() == ["docs"]
    assert store.get_vector_specs("docs") == SPECS
    assert store.count("docs") == 0


CONFLICTING = [
    {"full": VectorSpec(FULL + 1), "small": VectorSpec(SMALL)},
    {"full": VectorSpec(FULL, distance="dot"), "small": VectorSpec(SMALL)},
    {"full": VectorSpec(FULL, datatype="float16"), "small": VectorSpec(SMALL)},
    {"full": VectorSpec(FULL, quantization="scalar"), "small": VectorSpec(SMALL)},
    {"full": VectorSpec(FULL)},
    {"full": VectorSpec(FULL), "small": VectorSpec(SMALL), "extra": VectorSpec(4)},
]


def test_ensure_collection_conflicting_config_raises(store):
    store.ensure_collection("docs", SPECS)
    for other in CONFLICTING:
        with pytest.raises(CollectionConfigMismatch, match="docs"):
            store.ensure_collection("docs", other)
    assert store.get_vector_specs("docs") == SPECS  # untouched
    assert store.ensure_collection("docs", SPECS) is False


def test_delete_collection(filled):
    filled.set_alias("live", "docs")
    assert filled.delete_collection("docs") is True
    assert not filled.collection_exists("docs")
    assert filled.get_alias("live") is None  # no dangling alias
    assert filled.delete_collection("docs") is False
    with pytest.raises(CollectionNotFound):
        filled.count("docs")


# ---- points -------------------------------------------------------------------------
def test_upsert_count_and_idempotent(filled, data):
    assert filled.count("docs") == N
    assert filled.count("docs", exact=True) == N
    # Re-delivering the same batch (Kafka at-least-once) must not duplicate anything.
    filled.upsert("docs", _points(data, range(50), payload_update={"version": 2}))
    assert filled.count("docs") == N
    got = {p.id: p.payload for p in filled.scroll("docs")}
    assert len(got) == N
    assert all(got[data["ids"][i]]["version"] == 2 for i in range(50))
    assert all("version" not in got[data["ids"][i]] for i in range(50, N))


def test_payload_round_trip(store, data):
    store.ensure_collection("docs", SPECS)
    payload = {
        "doc_id": "doc-x",
        "text": "Grüße, 世界 — \"quoted\"",
        "n": 7,
        "f": 0.25,
        "flag": True,
        "none": None,
        "tags": ["a", "b"],
        "nested": {"k": [1, 2, {"deep": "yes"}]},
    }
    pid = str(uuid.uuid4())
    store.upsert("docs", [Point(id=pid.upper(), vectors={"full": data["full"][0], "small": data["small"][0]}, payload=payload)])
    [p] = store.scroll("docs", with_vectors=True)
    assert p.id == pid  # canonical lower-case UUID
    assert p.payload == payload
    np.testing.assert_allclose(p.vectors["full"], data["full"][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(p.vectors["small"], data["small"][0], rtol=1e-5, atol=1e-6)


def test_scroll_by_field_returns_exactly_that_doc(readonly, data):
    got = readonly.scroll("docs", field="doc_id", value="doc-007")
    assert [p.id for p in got] == sorted(data["ids"][35:40])
    assert [p.payload["chunk"] for p in sorted(got, key=lambda p: data["ids"].index(p.id))] == [0, 1, 2, 3, 4]


def test_delete_where_removes_exactly_that_doc(filled, data):
    filled.delete_where("docs", {"doc_id": "doc-003"})
    remaining = {p.id for p in filled.scroll("docs")}
    expected = set(data["ids"]) - set(data["ids"][15:20])
    assert remaining == expected
    assert filled.count("docs") == N - 5
    assert filled.scroll("docs", field="doc_id", value="doc-003") == []
    assert len(filled.scroll("docs", field="doc_id", value="doc-004")) == 5


def test_delete_where_at_least_removes_exactly_the_tail_of_that_doc(filled, data):
    """A document that shrank from 5 chunks to 3: its chunks 3 and 4 go, in one request; its other chunks and the
    other documents' chunks 3 and 4 stay."""
    filled.delete_where("docs", {"doc_id": "doc-003", "chunk": AtLeast(3)})
    assert sorted(p.payload["chunk"] for p in filled.scroll("docs", field="doc_id", value="doc-003")) == [0, 1, 2]
    assert filled.count("docs") == N - 2
    assert sorted(p.payload["chunk"] for p in filled.scroll("docs", field="doc_id", value="doc-004")) == [0, 1, 2, 3, 4]


def test_delete_points_by_id(filled, data):
    gone = [data["ids"][0], data["ids"][7].upper(), str(uuid.uuid4())]  # unknown id is ignored
    filled.delete_points("docs", gone)
    remaining = {p.id for p in filled.scroll("docs")}
    assert remaining == set(data["ids"]) - {data["ids"][0], data["ids"][7]}


def test_get_payloads_by_ids(filled, data):
    unknown = str(uuid.uuid4())
    asked = [data["ids"][3], data["ids"][42].upper(), unknown, data["ids"][3]]  # any case, unknown, repeated
    got = filled.get_payloads("docs", asked)
    assert got == {data["ids"][3]: data["payloads"][3], data["ids"][42]: data["payloads"][42]}
    assert filled.get_payloads("docs", []) == {}
    filled.upsert("docs", _points(data, [3], payload_update={"version": 2}))
    assert filled.get_payloads("docs", [data["ids"][3]])[data["ids"][3]]["version"] == 2
    filled.delete_points("docs", [data["ids"][3]])
    assert filled.get_payloads("docs", [data["ids"][3]]) == {}
    filled.set_alias("live", "docs")  # reads through an alias reach the target
    assert set(filled.get_payloads("live", data["ids"][:5])) == set(data["ids"][:5]) - {data["ids"][3]}
    with pytest.raises(CollectionNotFound):
        filled.get_payloads("missing", [unknown])


def test_overwrite_payloads_replaces_each_payload_and_keeps_the_vectors(filled, data):
    """A metadata-only change is a payload write: every listed point gets exactly its new payload (keys it no
    longer has are gone), its vectors stay as they were, and an id with no point is skipped, never created."""
    ids, unknown = data["ids"], str(uuid.uuid4())
    q = data["full"][5]
    before = [(h.id, round(h.score, 5)) for h in filled.search("docs", "full", q, top_k=5)]
    filled.overwrite_payloads("docs", {ids[5]: {"doc_id": "doc-001", "status": "published"},
                                       ids[6].upper(): {"doc_id": "doc-001", "chunk": 1}, unknown: {"doc_id": "x"}})
    got = filled.get_payloads("docs", [ids[5], ids[6], ids[7], unknown])
    assert got == {ids[5]: {"doc_id": "doc-001", "status": "published"}, ids[6]: {"doc_id": "doc-001", "chunk": 1},
                   ids[7]: data["payloads"][7]}
    assert filled.count("docs") == N
    assert [(h.id, round(h.score, 5)) for h in filled.search("docs", "full", q, top_k=5)] == before
    assert [p.payload for p in filled.scroll("docs", "status", "published")] == [{"doc_id": "doc-001", "status": "published"}]
    filled.overwrite_payloads("docs", {})
    filled.set_alias("live", "docs")
    filled.overwrite_payloads("live", {ids[7]: {"doc_id": "doc-001"}})
    assert filled.get_payloads("docs", [ids[7]]) == {ids[7]: {"doc_id": "doc-001"}}
    with pytest.raises(CollectionNotFound):
        filled.overwrite_payloads("missing", {ids[0]: {}})


def test_payload_values_keep_their_json_type(store, data):
    """1, 1.0 and true are three values: a metadata change between them must be seen, so a store must give each
    back as it was written (compared as canonical JSON: Python's == takes them for one)."""
    store.ensure_collection("docs", SPECS)
    payload = {"doc_id": "d", "one": 1, "one_f": 1.0, "yes": True, "zero": 0, "no": False, "big": 2**53 + 1,
               "nested": {"b": [1, 1.0, True, None], "a": {"x": 0.5}}, "s": "1"}
    store.upsert("docs", [Point(id=data["ids"][0], vectors={"full": data["full"][0], "small": data["small"][0]},
                                payload=payload)])
    got = store.get_payloads("docs", [data["ids"][0]])[data["ids"][0]]
    assert canonical_json(got) == canonical_json(payload)
    store.overwrite_payloads("docs", {data["ids"][0]: {**payload, "one": True}})
    assert canonical_json(store.get_payloads("docs", [data["ids"][0]])[data["ids"][0]]) == \
        canonical_json({**payload, "one": True})


def test_an_expected_payload_write_applies_only_while_the_point_holds_the_values(filled, data):
    """``expect``: the write is conditional on what the point holds now (its id and the values, one step):
    a point that changed since is left alone; dotted fields reach into objects, floats match exactly."""
    ids = data["ids"]
    filled.overwrite_payloads("docs", {i: {"doc_id": "d", "hash": f"h{n}", "source": {"offset": n}, "_scale": 0.1 * n}
                                      for n, i in enumerate(ids[:4])})
    expect = {ids[0]: {"hash": "h0", "source.offset": 0, "_scale": 0.0},  # holds: written
              ids[1]: {"hash": "h0"},  # another hash now: left alone
              ids[2]: {"hash": "h2", "source.offset": 5},  # another write since (its source): left alone
              ids[3].upper(): {"hash": "h3", "_scale": 0.1 * 3}}  # any id spelling; the float exactly
    filled.overwrite_payloads("docs", {i: {"doc_id": "d", "new": True} for i in ids[:4]}, expect=expect)
    got = filled.get_payloads("docs", ids[:4])
    assert [got[i].get("new", False) for i in ids[:4]] == [True, False, False, True]
    assert got[ids[1]]["hash"] == "h1" and got[ids[2]]["source"] == {"offset": 2}
    np.testing.assert_allclose(filled.get_vectors("docs", [ids[1]], "full")[ids[1]], data["full"][1], atol=1e-6)
    filled.overwrite_payloads("docs", {str(uuid.uuid4()): {"doc_id": "x"}}, expect={})  # no point: none created
    assert filled.count("docs") == N


def test_scroll_takes_a_filter_of_several_fields(readonly, data):
    got = readonly.scroll("docs", filter={"doc_id": ["doc-007", "doc-009"], "lang": "de"}, with_vectors=True)
    want = [i for i in range(35, 50) if data["payloads"][i]["doc_id"] in ("doc-007", "doc-009") and i % 3 == 0]
    assert sorted(p.id for p in got) == sorted(data["ids"][i] for i in want)
    assert all(set(p.vectors) == {"full", "small"} for p in got)
    assert readonly.scroll("docs", "doc_id", "doc-007", filter={"chunk": 2}) == \
        [p for p in readonly.scroll("docs", "doc_id", "doc-007") if p.payload["chunk"] == 2]


def test_collection_metadata_is_kept_merged_and_read_through_an_alias(store):
    store.ensure_collection("docs", SPECS)
    assert store.collection_metadata("docs") == {}
    store.set_collection_metadata("docs", {"embedstream": {"space": "a", "n": 1}})
    store.set_collection_metadata("docs", {"other": True})
    store.set_alias("live", "docs")
    assert store.collection_metadata("live") == {"embedstream": {"space": "a", "n": 1}, "other": True}
    with pytest.raises(CollectionNotFound):
        store.collection_metadata("missing")


@pytest.mark.parametrize("datatype", ["float32", "float16", "uint8"])
def test_vectors_read_back_can_be_written_under_another_id(store, datatype):
    """Reusing a stored point's vectors (a chunk that moved within its document) gives a point that scores
    exactly as the original, in every storage form. (qdrant-client's local mode keeps uint8 vectors as
    normalised floats, which a uint8 collection refuses: the sink embeds such a chunk again.)"""
    if datatype == "uint8" and isinstance(store, QdrantClientStore):
        pytest.skip("local mode reads uint8 vectors back as normalised floats")
    vecs, ids = _datatype_collection(store, datatype, 20, seed=13)
    (original,) = [p for p in store.scroll("q", with_vectors=True) if p.id == ids[4]]
    copy = str(uuid.uuid4())
    store.upsert("q", [Point(copy, original.vectors, {"i": 4, "copy": True})])
    hits = store.search("q", "v", vecs[4].astype(np.float32), top_k=2)
    assert {h.id for h in hits} == {ids[4], copy} and hits[0].score == pytest.approx(hits[1].score, abs=1e-6)
    (again,) = [p for p in store.scroll("q", with_vectors=True) if p.id == copy]
    assert np.array_equal(np.asarray(again.vectors["v"]), np.asarray(original.vectors["v"]))


def test_bad_vectors_rejected(store, data):
    store.ensure_collection("docs", SPECS)
    with pytest.raises(ValueError, match="dims"):
        store.upsert("docs", [Point(str(uuid.uuid4()), {"full": data["full"][0][:10]}, {})])
    with pytest.raises(ValueError, match="unknown vector"):
        store.upsert("docs", [Point(str(uuid.uuid4()), {"nope": data["full"][0]}, {})])
    with pytest.raises(ValueError, match="UUID"):
        store.upsert("docs", [Point("not-a-uuid", {"full": data["full"][0]}, {})])
    assert store.count("docs") == 0


def test_points_may_omit_named_vectors(store, data):
    store.ensure_collection("docs", SPECS)
    only_full = Point(data["ids"][0], {"full": data["full"][0]}, {"doc_id": "a"})
    both = Point(data["ids"][1], {"full": data["full"][1], "small": data["small"][1]}, {"doc_id": "b"})
    store.upsert("docs", [only_full, both])
    assert store.count("docs") == 2
    assert [h.id for h in store.search("docs", "small", data["small"][0], top_k=5)] == [data["ids"][1]]
    assert {h.id for h in store.search("docs", "full", data["full"][0], top_k=5)} == set(data["ids"][:2])


# ---- search -------------------------------------------------------------------------
def test_search_matches_numpy_bruteforce(readonly, data):
    rng = np.random.default_rng(7)
    for _ in range(15):
        q = _unit(rng.standard_normal(FULL).astype(np.float32))
        hits = readonly.search("docs", "full", q, top_k=10)
        expected = _topk_cosine(data["full"], q, 10)
        assert [h.id for h in hits] == [data["ids"][i] for i in expected]
        np.testing.assert_allclose([h.score for h in hits], data["full"][expected] @ q, atol=1e-4)
        assert all(h.vector_name == "full" for h in hits)
        assert hits[0].payload == data["payloads"][expected[0]]


def test_search_small_vector(readonly, data):
    q = data["small"][42]
    hits = readonly.search("docs", "small", q.tolist(), top_k=5)  # plain list works too
    assert [h.id for h in hits] == [data["ids"][i] for i in _topk_cosine(data["small"], q, 5)]
    assert hits[0].id == data["ids"][42]


def test_search_with_payload_filter(readonly, data):
    rng = np.random.default_rng(8)
    de = np.array([i for i in range(N) if data["payloads"][i]["lang"] == "de"])
    for _ in range(5):
        q = _unit(rng.standard_normal(FULL).astype(np.float32))
        hits = readonly.search("docs", "full", q, top_k=8, filter={"lang": "de"})
        assert [h.id for h in hits] == [data["ids"][i] for i in _topk_cosine(data["full"], q, 8, de)]
        assert all(h.payload["lang"] == "de" for h in hits)
    # list value = any of; several fields = AND
    docs = ["doc-001", "doc-010", "doc-020"]
    allowed = np.array([i for i in range(N) if data["payloads"][i]["doc_id"] in docs and data["payloads"][i]["chunk"] >= 0])
    q = data["full"][51]
    hits = readonly.search("docs", "full", q, top_k=20, filter={"doc_id": docs, "lang": "en"})
    allowed_en = np.array([i for i in allowed if data["payloads"][i]["lang"] == "en"])
    assert [h.id for h in hits] == [data["ids"][i] for i in _topk_cosine(data["full"], q, 20, allowed_en)]
    assert readonly.search("docs", "full", q, top_k=5, filter={"doc_id": "missing"}) == []
    # int field
    hits = readonly.search("docs", "full", q, top_k=300, filter={"chunk": 2})
    assert len(hits) == DOCS and all(h.payload["chunk"] == 2 for h in hits)


def test_prefetch_rescore_equals_exact_search_easy_case(readonly, data):
    rng = np.random.default_rng(9)
    for _ in range(5):
        q = _unit(rng.standard_normal(FULL).astype(np.float32))
        q_small = _unit(q[:SMALL].copy())
        exact = readonly.search("docs", "full", q, top_k=10)
        # candidates = every point: rescoring on "full" must give exactly the full-vector top 10
        two_stage = readonly.search("docs", "full", q, top_k=10, prefetch=[Prefetch("small", q_small, limit=N)])
        assert [h.id for h in two_stage] == [h.id for h in exact]
        np.testing.assert_allclose([h.score for h in two_stage], [h.score for h in exact], atol=1e-5)


def test_prefetch_rescores_only_the_candidates(readonly, data):
    """limit=L: result = top-k by the full vector among the top-L by the small vector."""
    rng = np.random.default_rng(10)
    L = 25
    for _ in range(5):
        q = _unit(rng.standard_normal(FULL).astype(np.float32))
        q_small = _unit(q[:SMALL].copy())
        candidates = np.array(_topk_cosine(data["small"], q_small, L))
        expected = _topk_cosine(data["full"], q, 10, candidates)
        hits = readonly.search("docs", "full", q, top_k=10, prefetch=[Prefetch("small", q_small, limit=L)])
        assert [h.id for h in hits] == [data["ids"][i] for i in expected]
        np.testing.assert_allclose([h.score for h in hits], data["full"][expected] @ q, atol=1e-4)
        # with a filter, both stages are filtered
        de = np.array([i for i in range(N) if data["payloads"][i]["lang"] == "de"])
        cand_de = np.array(_topk_cosine(data["small"], q_small, L, de))
        hits = readonly.search("docs", "full", q, top_k=5, filter={"lang": "de"}, prefetch=[Prefetch("small", q_small, L)])
        assert [h.id for h in hits] == [data["ids"][i] for i in _topk_cosine(data["full"], q, 5, cand_de)]


def test_unknown_vector_name_in_search(readonly, data):
    with pytest.raises(ValueError, match="nope"):
        readonly.search("docs", "nope", data["full"][0], top_k=3)


def _datatype_collection(store, datatype: str, n: int, seed: int) -> tuple[np.ndarray, list[str]]:
    """Collection "q" of ``n`` random 16-dim vectors stored as ``datatype`` (uint8: int8 shifted by 128, as ints)."""
    rng = np.random.default_rng(seed)
    if datatype == "uint8":
        vecs = (rng.integers(-128, 128, (n, 16)) + 128).astype(np.int64)
    else:
        vecs = _unit(rng.standard_normal((n, 16))).astype(np.float16).astype(np.float32)
    store.ensure_collection("q", {"v": VectorSpec(16, datatype=datatype)})
    ids = [str(uuid.uuid4()) for _ in range(n)]
    store.upsert("q", [Point(ids[i], {"v": vecs[i].tolist()}, {"i": i}) for i in range(n)])
    return vecs, ids


@pytest.mark.parametrize("datatype", ["float16", "uint8"])
def test_datatypes(store, datatype):
    vecs, ids = _datatype_collection(store, datatype, 60, seed=11)
    for i in (0, 17, 59):
        hits = store.search("q", "v", vecs[i].astype(np.float32), top_k=3)
        assert hits[0].id == ids[i]
        normed = _unit(vecs.astype(np.float64))
        expected = _topk_cosine(normed, normed[i], 3)
        assert [h.id for h in hits] == [ids[j] for j in expected]
    if datatype == "uint8":
        with pytest.raises(ValueError, match="0..255"):
            store.upsert("q", [Point(str(uuid.uuid4()), {"v": [256] * 16}, {})])
        with pytest.raises(ValueError, match="0..255"):
            store.upsert("q", [Point(str(uuid.uuid4()), {"v": [0.5] * 16}, {})])


@pytest.mark.parametrize("quant", ["scalar", "binary"])
def test_quantized_collection_search(store, quant):
    rng = np.random.default_rng(12)
    vecs = _unit(rng.standard_normal((200, 64)).astype(np.float32))
    store.ensure_collection("q", {"v": VectorSpec(64, quantization=quant)})
    ids = [str(uuid.uuid4()) for _ in range(200)]
    store.upsert("q", [Point(ids[i], {"v": vecs[i]}, {}) for i in range(200)])
    store.optimize("q")  # edge: builds the quantized segment; server/local: no-op
    for i in (3, 150):
        q = _unit(vecs[i] + 0.05 * rng.standard_normal(64).astype(np.float32))
        hits = store.search("q", "v", q, top_k=5)
        assert hits[0].id == ids[i]
        # Scores are the exact cosine of the originals (rescored), not quantized estimates.
        by_id = {ids[j]: float(vecs[j] @ q) for j in range(200)}
        np.testing.assert_allclose([h.score for h in hits], [by_id[h.id] for h in hits], atol=1e-4)
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        if quant == "scalar":  # int8 keeps the ranking; 1-bit codes of random 64-d data may not
            assert [h.id for h in hits] == [ids[j] for j in _topk_cosine(vecs, q, 5)]


# ---- aliases ------------------------------------------------------------------------
def test_alias_set_switch_resolve(store, data):
    store.ensure_collection("docs_v1", SPECS)
    store.ensure_collection("docs_v2", SPECS)
    store.upsert("docs_v1", _points(data, range(0, 10)))
    store.upsert("docs_v2", _points(data, range(100, 130)))
    assert store.get_alias("live") is None
    with pytest.raises(CollectionNotFound):
        store.resolve("live")

    store.set_alias("live", "docs_v1")
    assert store.get_alias("live") == "docs_v1"
    assert store.resolve("live") == "docs_v1"
    assert store.resolve("docs_v2") == "docs_v2"
    assert store.list_aliases() == {"live": "docs_v1"}
    assert not store.collection_exists("live")  # an alias is not a collection
    assert store.count("live") == 10
    q = data["full"][105]
    assert store.search("live", "full", q, top_k=1)[0].id in data["ids"][0:10]
    assert {p.id for p in store.scroll("live")} == set(data["ids"][0:10])

    assert store.get_vector_specs("live") == SPECS
    store.upsert("live", _points(data, range(10, 12)))  # writes through an alias reach the target
    assert store.count("docs_v1") == 12 and store.count("docs_v2") == 30
    store.delete_points("live", data["ids"][10:12])
    assert store.count("live") == 10

    store.set_alias("live", "docs_v2")  # atomic switch
    assert store.resolve("live") == "docs_v2"
    assert store.count("live") == 30
    assert store.search("live", "full", q, top_k=1)[0].id == data["ids"][105]
    assert {p.id for p in store.scroll("live", field="doc_id", value="doc-020")} == set(data["ids"][100:105])
    assert store.list_aliases() == {"live": "docs_v2"}

    assert store.delete_alias("live") is True
    assert store.delete_alias("live") is False
    with pytest.raises(CollectionNotFound):
        store.count("live")


def test_alias_errors(store):
    store.ensure_collection("docs", SPECS)
    with pytest.raises(CollectionNotFound):
        store.set_alias("live", "missing")
    with pytest.raises(AliasError):
        store.set_alias("docs", "docs")  # name taken by a collection
    store.set_alias("live", "docs")
    with pytest.raises(AliasError):
        store.ensure_collection("live", SPECS)
    with pytest.raises(ValueError):
        store.set_alias("bad name/..", "docs")


# ---- edge specifics -----------------------------------------------------------------
def test_edge_alias_switch_is_atomic_for_concurrent_readers(tmp_path, data):
    store = EdgeStore(tmp_path / "edge")
    try:
        store.ensure_collection("a", SPECS)
        store.ensure_collection("b", SPECS)
        store.upsert("a", _points(data, range(0, 3)))
        store.upsert("b", _points(data, range(3, 8)))
        store.set_alias("live", "a")
        targets: list[object] = []
        counts: list[object] = []
        stop = threading.Event()

        def reader():
            while not stop.is_set():
                try:
                    targets.append(store.resolve("live"))
                    counts.append(store.count("live"))  # resolves the alias again, on its own
                except Exception as exc:  # a missing alias would surface here
                    targets.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for i in range(40):
            store.set_alias("live", "b" if i % 2 == 0 else "a")
        stop.set()
        for t in threads:
            t.join()
        assert len(targets) > 40
        assert set(targets) == {"a", "b"}  # always the old or the new target, never missing
        assert set(counts) == {3, 5}
        assert not list((tmp_path / "edge").glob(".aliases.json.*"))  # no temp files left
    finally:
        store.close()


def test_edge_persists_and_locks(tmp_path, data):
    root = tmp_path / "edge"
    store = EdgeStore(root)
    store.ensure_collection("docs", SPECS)
    store.upsert("docs", _points(data, range(40)))
    store.set_alias("live", "docs")
    with pytest.raises(StoreLockedError):
        EdgeStore(root)  # one owner per root
    store.close()

    reopened = EdgeStore(root)
    try:
        assert reopened.list_collections() == ["docs"]
        assert reopened.resolve("live") == "docs"
        assert reopened.count("live") == 40
        assert reopened.get_vector_specs("docs") == SPECS
        assert reopened.search("live", "full", data["full"][12], top_k=1)[0].id == data["ids"][12]
        with pytest.raises(CollectionConfigMismatch):
            reopened.ensure_collection("docs", {"full": VectorSpec(FULL)})
    finally:
        reopened.close()


def test_edge_optimize_builds_index_and_keeps_results(tmp_path, data):
    store = EdgeStore(tmp_path / "edge", indexing_threshold_kb=1)  # tiny threshold: index 300 points
    try:
        store.ensure_collection("docs", SPECS)
        store.upsert("docs", _points(data))
        q = data["full"][77]
        before = store.search("docs", "full", q, top_k=10, filter={"lang": "en"})
        assert store.info("docs")["indexed_vectors"] == 0  # nothing is indexed until optimize()
        assert store.optimize("docs") is True
        info = store.info("docs")
        assert info["points"] == N and info["indexed_vectors"] >= N
        after = store.search("docs", "full", q, top_k=10, filter={"lang": "en"})
        assert [(h.id, h.payload) for h in after] == [(h.id, h.payload) for h in before]
        assert store.count("docs") == N
        store.delete_where("docs", {"doc_id": "doc-015"})  # still writable after optimize
        assert store.count("docs") == N - 5
    finally:
        store.close()


def test_open_store_factory(tmp_path, monkeypatch):
    mem = open_store(":memory:", None, None)
    assert isinstance(mem, QdrantClientStore) and mem.is_local
    mem.close()
    edge = open_store(None, None, str(tmp_path / "explicit"))
    assert isinstance(edge, EdgeStore) and edge.root == (tmp_path / "explicit").resolve()
    edge.close()
    monkeypatch.setenv("EMBEDSTREAM_QDRANT_PATH", str(tmp_path / "from-env"))
    edge = open_store(None, None, None)
    assert isinstance(edge, EdgeStore) and edge.root == (tmp_path / "from-env").resolve()
    edge.close()
    with pytest.raises(ValueError):
        open_store("localhost:6333", None, None)


def test_store_errors_are_coded_errors_that_keep_their_builtin_bases():
    import pickle

    from embedstream.errors import CodedError
    from embedstream.vectorstore import VectorStoreError

    for error, base, code in (
        (CollectionNotFound("no collection or alias named 'x'"), KeyError, "unknown_collection"),
        (CollectionConfigMismatch("other size"), ValueError, "collection_config_mismatch"),
        (AliasError("clash"), ValueError, "alias_error"),
        (StoreLockedError("owned"), RuntimeError, "store_locked"),
        (VectorStoreError("closed"), VectorStoreError, "vector_store_error"),
    ):
        assert isinstance(error, base) and isinstance(error, CodedError)
        assert error.code == code and str(error) == error.message
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and (copy.code, copy.message) == (error.code, error.message)
