"""Searcher on a `:memory:` store: filters, rerank on/off, prefetch + rescore on Matryoshka and uint8 collections."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_engine

from embedstream.corpus import stdlib_paragraphs
from embedstream.engine.engine import EmbedRequest
from embedstream.vectorstore.factory import open_store
from embedstream.schemas import ChunkEvent
from embedstream.schemas.rerank import SearchRequest
from embedstream.engine.sparse import BM25Encoder
from embedstream.ranking import score_key
from embedstream.vectors import l2_normalize, encoded_rows
from embedstream.workers.search import TIE_MARGIN, UINT8_OVERSAMPLING, Searcher, SearchError, SearchPlan
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

N_CHUNKS = 80
TOPICS = ("io", "net", "text", "misc")


class SpyStore:
    """Records every search call, delegates everything to the real store."""

    def __init__(self, store):
        self.store = store
        self.calls: list[dict] = []

    def search(self, name, vector_name, vector, top_k, filter=None, prefetch=None, ids=None, exact=False):
        self.calls.append({"vector_name": vector_name, "top_k": top_k, "filter": filter, "prefetch": prefetch,
                           "ids": ids, "exact": exact, "vector": vector})
        return self.store.search(name, vector_name, vector, top_k, filter=filter, prefetch=prefetch, ids=ids,
                                 exact=exact)

    def __getattr__(self, name):
        return getattr(self.store, name)


@pytest.fixture(scope="module")
def embedder(tiny_bert_dir):
    return make_engine(tiny_bert_dir, name="tiny-mrl", matryoshka_dims=[16, 8])


@pytest.fixture(scope="module")
def reranker(tiny_ce_dir):
    return make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank")


@pytest.fixture(scope="module")
def corpus():
    """Real chunk texts with synthetic unit vectors: a random tiny BERT maps every text to nearly the
    same vector (cosines all ~0.999), which would make exact rankings ties; these never tie."""
    paras = stdlib_paragraphs()
    texts = [" ".join(paras[200 + 3 * i].split()[:60]) for i in range(N_CHUNKS)]
    rng = np.random.default_rng(3)
    vectors = _unit(rng.standard_normal((N_CHUNKS, 32)).astype(np.float32))
    events = [ChunkEvent(doc_id=f"doc-{i // 2}", chunk_id=i % 2, text=t, metadata={"topic": TOPICS[i % 4], "n": i})
              for i, t in enumerate(texts)]
    return events, vectors


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def query_vector(corpus):
    _, vectors = corpus
    noise = np.random.default_rng(4).standard_normal(32).astype(np.float32)
    return _unit(vectors[7] + 1.2 * _unit(noise)).astype(np.float32)


def _fixed(vector):
    """A query embedder (the callable form): every text maps to ``vector``."""
    return lambda text: vector


def _store(embedder, corpus, config: SinkConfig, collection: str = "docs"):
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, embedder.spec, embedder.dimensions, collection, config)
    events, vectors = corpus
    sink.upsert([EmbeddedChunk(e, v) for e, v in zip(events, vectors)])
    return SpyStore(store)


def _request(query: str, **kw) -> SearchRequest:
    return SearchRequest(request_id="r1", query=query, reply_to="replies", **kw)


QUERY = "how do I read lines from a file and decode text"


def test_plain_search_equals_exact_cosine_and_filters_apply(embedder, reranker, corpus, query_vector):
    store = _store(embedder, corpus, SinkConfig())
    searcher = Searcher(store, _fixed(query_vector), reranker)
    events, vectors = corpus
    q = query_vector
    exact = np.argsort(-(vectors @ q), kind="stable")

    reply = searcher.search(_request(QUERY, top_k=20, top_n=20, rerank=False))
    assert reply.error is None and reply.collection == "docs"
    assert store.calls[-1]["prefetch"] is None and store.calls[-1]["vector_name"] == "full"
    assert [h.payload["n"] for h in reply.hits] == [int(i) for i in exact[:20]]
    np.testing.assert_allclose([h.vector_score for h in reply.hits], (vectors @ q)[exact[:20]], atol=1e-5)
    assert [h.rank for h in reply.hits] == list(range(1, 21))
    assert all(h.rerank_score is None for h in reply.hits) and reply.model is None
    hit = reply.hits[0]
    assert hit.text == events[hit.payload["n"]].text and hit.doc_id == events[hit.payload["n"]].doc_id
    assert hit.chunk_id == events[hit.payload["n"]].chunk_id
    assert "text" not in hit.payload and not any(k.startswith("_") for k in hit.payload)
    assert {"queue_wait", "embed", "search", "rerank", "total"} <= set(reply.timings_ms)

    only_io = searcher.search(_request(QUERY, top_k=50, top_n=50, rerank=False, filters={"topic": "io"}))
    assert len(only_io.hits) == N_CHUNKS // 4 and {h.payload["topic"] for h in only_io.hits} == {"io"}
    io_idx = [i for i in range(N_CHUNKS) if i % 4 == 0]
    assert [h.payload["n"] for h in only_io.hits] == sorted(io_idx, key=lambda i: -float(vectors[i] @ q))
    either = searcher.search(_request(QUERY, top_k=50, top_n=50, rerank=False, filters={"topic": ["io", "net"], "n": 5}))
    assert [h.payload["n"] for h in either.hits] == [5]
    assert store.calls[-1]["filter"] == {"topic": ["io", "net"], "n": 5}
    top3 = searcher.search(_request(QUERY, top_k=20, top_n=3, rerank=False))
    assert [h.id for h in top3.hits] == [h.id for h in reply.hits[:3]]


def test_engine_embedder_path(embedder, reranker, corpus):
    """The in-process Engine as query embedder: vectors come from the engine with the query prompt."""
    events, _ = corpus
    results, _ = embedder.embed([EmbedRequest(i, e.text, prompt="document") for i, e in enumerate(events)])
    vectors = np.stack([r.full for r in results])
    store = _store(embedder, (events, vectors), SinkConfig())
    reply = Searcher(store, embedder, reranker).search(_request(QUERY, top_k=10, top_n=10, rerank=False))
    (q,), _ = embedder.embed([EmbedRequest(0, QUERY, prompt="query")])
    assert reply.error is None and len(reply.hits) == 10
    np.testing.assert_allclose([h.vector_score for h in reply.hits], vectors[[h.payload["n"] for h in reply.hits]] @ q.full,
                               atol=1e-5)
    assert reply.timings_ms["embed"] > 0


def test_rerank_orders_retrieved_hits_by_cross_encoder_score(embedder, reranker, corpus, query_vector):
    from sentence_transformers import CrossEncoder

    store = _store(embedder, corpus, SinkConfig())
    searcher = Searcher(store, _fixed(query_vector), reranker)
    plain = searcher.search(_request(QUERY, top_k=15, top_n=15, rerank=False))
    reply = searcher.search(_request(QUERY, top_k=15, top_n=5, rerank=True))
    assert reply.error is None and reply.model == "tiny-ce" and len(reply.hits) == 5
    retrieved = {h.id: h for h in plain.hits}
    assert {h.id for h in reply.hits} <= set(retrieved)  # reranking reorders the top_k, never adds
    ref = CrossEncoder(str(reranker.spec.path), device="cpu").predict([(QUERY, h.text) for h in plain.hits])
    # the ranking rule: rerank score at 6 places (this random cross-encoder's differ in the 7th), then retrieval order
    order = sorted(range(len(ref)), key=lambda i: (-score_key(float(ref[i])), i))[:5]
    assert [h.id for h in reply.hits] == [plain.hits[i].id for i in order]
    np.testing.assert_allclose([h.rerank_score for h in reply.hits], ref[order], atol=1e-4)
    assert [h.rank for h in reply.hits] == [1, 2, 3, 4, 5]
    for h in reply.hits:  # vector score carried through from retrieval
        assert h.vector_score == pytest.approx(retrieved[h.id].vector_score, abs=1e-6)
    assert reply.timings_ms["rerank"] > 0
    no_reranker = Searcher(store, _fixed(query_vector)).search(_request(QUERY, rerank=True))
    assert no_reranker.error.code == "rerank_unavailable"


def test_matryoshka_collection_prefetches_small_vector_and_rescores_on_full(embedder, reranker, corpus, query_vector):
    store = _store(embedder, corpus, SinkConfig(matryoshka_dims=(16, 8)))
    searcher = Searcher(store, _fixed(query_vector), reranker)
    plan = searcher.plan("docs")
    assert plan.prefetch_name == "mrl_8" and plan.prefetch_size == 8 and not plan.uint8  # the smallest size
    _, vectors = corpus
    q = query_vector
    top_k = 5
    reply = searcher.search(_request(QUERY, top_k=top_k, top_n=top_k, rerank=False))
    prefetch, rescore = store.calls[-2:]
    # the Matryoshka candidates: top_k x 4 and a margin for the points tied at that cut (the rule decides)
    assert prefetch["vector_name"] == "mrl_8" and prefetch["top_k"] == top_k * 4 + TIE_MARGIN
    small = _unit(vectors[:, :8])
    q8 = _unit(q[:8])
    np.testing.assert_allclose(np.asarray(prefetch["vector"]), q8, atol=1e-6)
    candidates = np.argsort(-(small @ q8), kind="stable")[: top_k * 4]
    # rescored by the store on the full vector, exactly those candidates
    assert rescore["vector_name"] == "full" and rescore["exact"] and len(rescore["ids"]) == top_k * 4
    expected = candidates[np.argsort(-(vectors[candidates] @ q), kind="stable")[:top_k]]
    assert [h.payload["n"] for h in reply.hits] == [int(i) for i in expected]
    # the two-stage result differs from a one-stage search here, so the test sees which path ran
    assert [int(i) for i in expected] != [int(i) for i in np.argsort(-(small @ q8))[:top_k]]
    # scores are the full-vector cosines, not the 8-d ones
    np.testing.assert_allclose([h.vector_score for h in reply.hits], vectors[expected] @ q, atol=1e-5)
    filtered = searcher.search(_request(QUERY, top_k=5, top_n=5, rerank=True, filters={"topic": "net"}))
    assert filtered.error is None and len(filtered.hits) == 5 and {h.payload["topic"] for h in filtered.hits} == {"net"}
    assert store.calls[-2]["vector_name"] == "mrl_8" and store.calls[-2]["filter"] == {"topic": "net"}
    assert all(h.rerank_score is not None for h in filtered.hits)


def test_uint8_collection_is_rescored_on_dequantised_full_vectors(embedder, reranker, corpus, query_vector):
    store = _store(embedder, corpus, SinkConfig("uint8", "none", (16,)))
    searcher = Searcher(store, _fixed(query_vector), reranker)
    plan = searcher.plan("docs")
    assert plan.uint8 and plan.prefetch_name == "mrl_16"
    _, vectors = corpus
    q = query_vector
    reply = searcher.search(_request(QUERY, top_k=10, top_n=10, rerank=False))
    call = store.calls[-1]
    wide = 10 * UINT8_OVERSAMPLING  # from bench quality: x12 reaches recall@10 0.98 for uint8
    assert call["vector_name"] == "mrl_16" and call["top_k"] == wide + TIE_MARGIN  # wide candidate set, rescored here
    sent = np.asarray(call["vector"])
    assert sent.min() >= 1 and sent.max() <= 255 and np.all(sent == np.round(sent))  # shifted int8 query
    exact = vectors @ q
    got = np.array([h.vector_score for h in reply.hits])
    np.testing.assert_allclose(got, exact[[h.payload["n"] for h in reply.hits]], atol=0.01)  # int8 error only
    assert list(got) == sorted(got, reverse=True)
    best = set(np.argsort(-exact)[:10].tolist())
    assert len(best & {h.payload["n"] for h in reply.hits}) >= 8


def test_hybrid_dense_candidates_come_from_the_stored_layout(embedder, corpus, query_vector):
    """A hybrid search's dense half is the dense plan's own search: uint8 + Matryoshka candidates rescored on
    the dequantised full vectors, the same hits and scores as a dense search; sparse-only candidates get their
    exact cosine too."""
    events, vectors = corpus
    bm25 = BM25Encoder()
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, embedder.spec, embedder.dimensions, "docs", SinkConfig("uint8", "none", (16,), sparse="bm25"))
    sink.upsert([EmbeddedChunk(e, r) for e, r in
                 zip(events, encoded_rows(vectors, bm25.encode_texts([e.text for e in events], query=False)))])
    spy = SpyStore(store)
    searcher = Searcher(spy, _fixed(query_vector), None, sparse=bm25)
    dense = searcher.search(_request(QUERY, top_k=10, top_n=10, rerank=False))
    spy.calls.clear()
    hybrid = searcher.search(_request(QUERY, top_k=10, top_n=10, rerank=False, mode="hybrid", sparse_limit=20))
    assert hybrid.error is None and len(hybrid.hits) == 10
    dense_call, sparse_call, scored_call = spy.calls
    assert dense_call["vector_name"] == "mrl_16"  # Matryoshka candidates, rescored here on the dequantised vectors
    assert dense_call["top_k"] == 10 * UINT8_OVERSAMPLING + TIE_MARGIN  # uint8: wide, rescored here
    assert sparse_call["vector_name"] == "sparse_bm25" and sparse_call["ids"] is None
    assert scored_call["vector_name"] == "sparse_bm25" and scored_call["exact"]  # the dense-only points' BM25
    request = _request(QUERY, top_k=10, mode="hybrid", sparse_limit=20)
    query = l2_normalize(query_vector)
    dense_list, sparse_list, _ = searcher.hybrid_candidates("docs", query, bm25.encode_texts([QUERY], query=True)[0], request)
    assert [pid for pid, _ in dense_list.pairs] == [h.id for h in dense.hits]
    assert [s for _, s in dense_list.pairs] == pytest.approx([h.vector_score for h in dense.hits], abs=1e-9)
    n_of = {p.id: p.payload["n"] for p in store.scroll("docs")}
    sparse_only = {pid for pid, _ in sparse_list.pairs} - {pid for pid, _ in dense_list.pairs}
    assert sparse_only and set(dense_list.extra) == sparse_only
    for pid, cosine in dense_list.extra.items():  # exact up to int8 error
        assert cosine == pytest.approx(float(vectors[n_of[pid]] @ query), abs=0.01)
    dense_only = {pid for pid, _ in dense_list.pairs} - {pid for pid, _ in sparse_list.pairs}
    everything = {h.id: h.score for h in store.search("docs", "sparse_bm25", bm25.encode_texts([QUERY], query=True)[0],
                                                      N_CHUNKS)}
    assert dense_only and set(sparse_list.extra) <= dense_only and sparse_list.absent == 0.0
    # a dense-only point's BM25 is the store's own score for it (absent: it holds none of the query's terms)
    assert {pid: sparse_list.extra.get(pid, 0.0) for pid in dense_only} == {pid: everything.get(pid, 0.0)
                                                                           for pid in dense_only}
    # the sparse unit: the query's sum of IDF weights (Qdrant's IDF over the stored vectors)
    stored = [p.vectors["sparse_bm25"] for p in store.scroll("docs", with_vectors=True)]
    query_terms = bm25.encode_texts([QUERY], query=True)[0]
    df = {t: sum(t in v.indices for v in stored) for t in query_terms.indices.tolist()}
    idf_sum = sum(math.log(1 + (len(stored) - n + 0.5) / (n + 0.5)) for n in df.values() if n)
    assert sparse_list.unit == pytest.approx(idf_sum, rel=1e-5)


def test_refusals(embedder, reranker, corpus, query_vector):
    from embedstream.vectorstore.base import VectorSpec

    store = _store(embedder, corpus, SinkConfig())
    searcher = Searcher(store, _fixed(query_vector), reranker)
    assert searcher.search(_request(QUERY, collection="nope")).error.code == "unknown_collection"
    assert searcher.search(_request("   ")).error.code == "empty_query"
    wrong = Searcher(store, _fixed(np.ones(7, dtype=np.float32)), reranker)
    assert wrong.search(_request(QUERY, rerank=False)).error.code == "dimension_mismatch"
    with pytest.raises(SearchError, match="no 'full' vector"):
        SearchPlan.of("x", {"v": VectorSpec(4)})


def test_dequantise_recovers_int8_from_both_stored_forms():
    from embedstream.vectors import stored_form as _stored
    from embedstream.vectors import uint8_decode as _dequantise

    rng = np.random.default_rng(5)
    for sign in (1, -1):
        v = _unit(rng.standard_normal(32)).astype(np.float32)
        v[3] = sign * 0.9  # the peak decides whether the integers reach 255 or 1
        ints, _ = _stored(v, "uint8")
        ints = np.asarray(ints, dtype=np.float64)
        np.testing.assert_array_equal(_dequantise(ints), ints - 128)  # server / edge: integers
        np.testing.assert_allclose(_dequantise(ints / np.linalg.norm(ints)), ints - 128)  # local mode: normalised


def test_cli_filters_parse_to_store_filters():
    from embedstream.commands.pipeline import parse_filters

    assert parse_filters(["lang=en", "year=2024", "tag=a", "tag=b", "ok=true", "v=1.5"]) == {
        "lang": "en", "year": 2024, "tag": ["a", "b"], "ok": True, "v": 1.5}
    with pytest.raises(Exception, match="field=value"):
        parse_filters(["novalue"])


def test_exact_search_asks_the_store_for_an_exact_scan_everywhere(embedder, corpus, query_vector):
    """EMBEDSTREAM_QDRANT__EXACT_SEARCH: every search the searcher makes asks the store for exact search (a server's
    HNSW graph is approximate above its indexing threshold: docs/fusion.md), and nothing changes without it but the
    flag."""
    from embedstream.config import QdrantSettings

    assert QdrantSettings().exact_search is False
    store = _store(embedder, corpus, SinkConfig(matryoshka_dims=(16, 8)))
    plain = Searcher(store, _fixed(query_vector)).search(_request(QUERY, top_k=5, top_n=5, rerank=False))
    assert [c["exact"] for c in store.calls] == [False, True]  # the candidates; their rescoring by id is exact
    store.calls.clear()
    exact = Searcher(store, _fixed(query_vector), exact=True).search(_request(QUERY, top_k=5, top_n=5, rerank=False))
    assert store.calls and all(c["exact"] for c in store.calls)
    assert [h.id for h in exact.hits] == [h.id for h in plain.hits]  # ':memory:' scans anyway
