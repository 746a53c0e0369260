"""The rerank worker on the real broker: exact scores, ranking, packing, error replies, dead letters, search."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import isolated_settings, make_engine, read_dead_letters, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from embedstream.corpus import stdlib_paragraphs
from embedstream.vectorstore.factory import open_store
from embedstream.producers.topics import ensure_topics
from embedstream.producers.query_client import QueryClient
from embedstream.schemas import ChunkEvent
from embedstream.schemas.rerank import Candidate, RerankReply, RerankRequest, SearchReply, SearchRequest
from embedstream.workers.transport.kafka_io import broker_reachable
from worker_rig import Running
from embedstream.workers.rerank_worker import RerankOptions, RerankWorker
from embedstream.workers.search import Searcher
from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig
from embedstream.workers.trust import TrustSettings

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def ce_engine(tiny_ce_dir):
    return make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank")


@pytest.fixture(scope="module")
def reference(tiny_ce_dir):
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(tiny_ce_dir), device="cpu")


def _candidates(n: int, offset: int = 0, words: int = 40) -> list[Candidate]:
    paras = stdlib_paragraphs()
    return [Candidate(id=f"c{offset + i}", text=" ".join(paras[900 + offset + i].split()[:words]), metadata={"i": i})
            for i in range(n)]


def _request(client: QueryClient, query: str, candidates, **kw) -> RerankRequest:
    import uuid

    return RerankRequest(request_id=uuid.uuid4().hex, query=query, candidates=candidates, reply_to=client.reply_topic, **kw)


def _ask(client, settings, request, reply_model=RerankReply, timeout_s: float = 60):
    topic = settings.kafka.topic_search if isinstance(request, SearchRequest) else settings.kafka.topic_rerank
    return client.request(topic, request, reply_model, timeout_s=timeout_s)


def test_rerank_scores_match_cross_encoder_and_requests_share_a_pass(kafka_bootstrap, ce_engine, reference):
    settings = isolated_settings(kafka_bootstrap, "rerank")
    ensure_topics(settings.kafka, partitions=2)
    query = "how do I read a file line by line"
    with QueryClient(settings.kafka) as client, Running(RerankWorker(settings, ce_engine, RerankOptions(
            batch_window_ms=50, admission_policy="fixed"))) as worker:
        cands = _candidates(30) + [Candidate(id="long", text=" ".join(stdlib_paragraphs()[50:60]))]
        reply = _ask(client, settings, _request(client, query, cands, top_n=100))
        assert reply.error is None and reply.model == "tiny-ce"
        assert len(reply.results) == len(cands)
        ref = reference.predict([(query, c.text) for c in cands])
        by_id = {c.id: float(s) for c, s in zip(cands, ref)}
        got = {r.id: r.score for r in reply.results}
        assert max(abs(got[k] - by_id[k]) for k in by_id) <= 1e-4
        assert [r.id for r in reply.results] == [cands[i].id for i in np.argsort(-ref, kind="stable")]
        assert [r.rank for r in reply.results] == list(range(1, len(cands) + 1))
        assert [r.id for r in reply.results if r.truncated] == ["long"]  # cut to fit the model, flagged
        assert {"queue_wait", "tokenize", "rerank", "total"} <= set(reply.timings_ms)
        assert reply.timings_ms["rerank"] > 0 and reply.timings_ms["total"] >= reply.timings_ms["rerank"]
        assert broker_reachable(worker.lane.consumer)  # what /readyz reports as "broker"

        top = _ask(client, settings, _request(client, query, cands, top_n=5))
        assert [r.id for r in top.results] == [r.id for r in reply.results[:5]]
        assert [r.rank for r in top.results] == [1, 2, 3, 4, 5]

        # several requests in flight: packed into shared passes, split back exactly per request
        sample = worker.metrics.registry.get_sample_value
        pairs_before = sample("embedstream_batch_size_sum", {"lane": "rerank"})
        requests = [_request(client, f"question {k}: {query}", _candidates(12, offset=20 * k), top_n=12) for k in range(6)]
        futures = [client.submit(settings.kafka.topic_rerank, r, RerankReply, timeout_s=60) for r in requests]
        replies = [f.result(timeout=60) for f in futures]
        for req, rep in zip(requests, replies):
            assert rep.error is None and rep.request_id == req.request_id
            ref = reference.predict([(req.query, c.text) for c in req.candidates])
            expected = [req.candidates[i].id for i in np.argsort(-ref, kind="stable")]
            assert [r.id for r in rep.results] == expected
            np.testing.assert_allclose([r.score for r in rep.results], np.sort(ref)[::-1], atol=1e-4)
        assert sample("embedstream_batch_size_sum", {"lane": "rerank"}) - pairs_before == 6 * 12
        passes = sample("embedstream_batch_size_count", {"lane": "rerank"})
        assert passes < 2 + 6  # at least two of the six requests shared one Engine.score call
        assert sample("embedstream_texts_total", {"lane": "rerank", "kind": "pair"}) == 31 * 2 + 72
        assert sample("embedstream_stage_duration_seconds_count", {"stage": "rerank", "lane": "rerank"}) == passes


def test_error_replies_dead_letters_and_search_over_kafka(kafka_bootstrap, ce_engine, tiny_bert_dir):
    settings = isolated_settings(kafka_bootstrap, "rerankerr")
    settings.trust = TrustSettings(collections=["nope"])  # producers may name it; it does not exist
    ensure_topics(settings.kafka, partitions=1)
    embedder = make_engine(tiny_bert_dir, name="tiny-bert")
    store = open_store(":memory:", None, None)
    sink = QdrantSink(store, embedder.spec, embedder.dimensions, "docs", SinkConfig())
    rng = np.random.default_rng(0)
    texts = [" ".join(p.split()[:40]) for p in stdlib_paragraphs()[300:320]]
    vectors = rng.standard_normal((20, 32)).astype(np.float32)
    sink.upsert([EmbeddedChunk(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=t, metadata={"half": i % 2}),
                               v / np.linalg.norm(v)) for i, (t, v) in enumerate(zip(texts, vectors))])
    searcher = Searcher(store, embedder, ce_engine, "docs")
    worker = RerankWorker(settings, ce_engine, RerankOptions(max_candidates=50), searcher=searcher)
    query = "which function parses command line options"
    with QueryClient(settings.kafka) as client, Running(worker):
        def code(request, reply_model=RerankReply):
            reply = _ask(client, settings, request, reply_model)
            assert reply.error is not None and reply.error.message, reply
            return reply.error.code

        assert code(_request(client, query, [])) == "no_candidates"
        assert code(_request(client, query, _candidates(51))) == "too_many_candidates"
        assert code(_request(client, "  ", _candidates(3))) == "empty_query"
        assert code(_request(client, query, _candidates(3), model="no-such-model")) == "unknown_model"
        assert code(_request(client, query, [Candidate(id="e", text=" ")])) == "empty_text"
        assert code(_request(client, query, _candidates(3), deadline_ms=1)) == "deadline_exceeded"
        cut = _ask(client, settings, _request(client, query, _candidates(60), cut=True, top_n=100))
        assert cut.error is None and len(cut.results) == 50
        assert {r.id for r in cut.results} == {f"c{i}" for i in range(50)}  # the first 50 kept, the rest dropped

        # malformed records are dead-lettered and the worker carries on
        producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
        poison = [b"{not json", b'{"schema_version": 1, "query": "no request id"}',
                  b'{"schema_version": 7, "request_id": "x", "query": "q", "reply_to": "r"}']
        for value in poison:
            producer.send(settings.kafka.topic_rerank, key=b"bad", value=value)
        producer.send(settings.kafka.topic_search, key=b"bad", value=b"[1, 2]")
        producer.flush()
        producer.close()
        after = _ask(client, settings, _request(client, query, _candidates(4), top_n=2))
        assert after.error is None and len(after.results) == 2
        letters = read_dead_letters(settings, 4)
        assert sorted(letter.error.code for letter in letters) == sorted(
            ["malformed_json", "invalid_event", "unknown_schema_version", "malformed_json"])
        assert {letter.raw_bytes() for letter in letters} == set(poison) | {b"[1, 2]"}
        assert {letter.source_topic for letter in letters} == {settings.kafka.topic_rerank, settings.kafka.topic_search}

        # retrieve -> rerank through the search topic, every stage timed
        def search(**kw):
            import uuid

            return _ask(client, settings, SearchRequest(request_id=uuid.uuid4().hex, query=query,
                                                        reply_to=client.reply_topic, **kw), SearchReply)

        local = searcher.search(SearchRequest(request_id="local", query=query, reply_to="x", top_k=8, top_n=4))
        remote = search(top_k=8, top_n=4)
        assert remote.error is None and remote.model == "tiny-ce" and len(remote.hits) == 4
        assert [h.id for h in remote.hits] == [h.id for h in local.hits]
        np.testing.assert_allclose([h.rerank_score for h in remote.hits], [h.rerank_score for h in local.hits], atol=1e-5)
        assert {"queue_wait", "embed", "search", "rerank", "total"} <= set(remote.timings_ms)
        filtered = search(top_k=20, top_n=20, rerank=False, filters={"half": 1})
        assert len(filtered.hits) == 10 and {h.payload["half"] for h in filtered.hits} == {1}
        assert all(h.rerank_score is None for h in filtered.hits)
        missing = search(collection="nope")
        assert missing.error.code == "unknown_collection"
        refused = search(collection="attacker-made-1")  # its reply_to passed: answered, not searched
        assert refused.error.code == "collection_not_allowed" and not store.collection_exists("attacker-made-1")
        wait_for(lambda: worker.lane.offsets.outstanding() == 0, 30, "every record finished")
    # everything was finished, so the committed offsets reach the log end of both topics
    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=settings.kafka.group_rerank, enable_auto_commit=False)
    for topic in (settings.kafka.topic_rerank, settings.kafka.topic_search):
        tp = TopicPartition(topic, 0)
        assert consumer.committed(tp) == consumer.end_offsets([tp])[tp], topic
    consumer.close()
    errors = {s.labels["code"] for m in worker.metrics.registry.collect() if m.name == "embedstream_request_errors"
              for s in m.samples if s.name.endswith("_total")}
    assert {"no_candidates", "too_many_candidates", "empty_query", "unknown_model", "unknown_collection"} <= errors


class CountingEngine:
    """The real engine, recording every score call: when it ran (epoch ms) and which requests' pairs it held."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[tuple[int, set[str]]] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def score(self, pairs, *args, **kwargs):
        from embedstream.schemas.events import now_ms

        self.calls.append((now_ms(), {p.query for p in pairs}))
        return self.engine.score(pairs, *args, **kwargs)


def test_overload_sheds_the_excess_before_compute(kafka_bootstrap, ce_engine):
    """At about twice the rate the worker sustains, requests that cannot meet their deadline get deadline_exceeded,
    and no pair of a request is scored after its deadline (the engine's calls are recorded)."""
    import time
    import uuid

    from embedstream.schemas.events import now_ms

    settings = isolated_settings(kafka_bootstrap, "rerankshed")
    ensure_topics(settings.kafka, partitions=1)
    engine = CountingEngine(ce_engine)
    worker = RerankWorker(settings, engine, RerankOptions(admission_policy="aimd", latency_target_ms=50))
    cands = _candidates(50, words=60)
    with QueryClient(settings.kafka) as client, Running(worker):
        for k in range(10):  # warm: the controller learns the pass time, and so does this test
            assert _ask(client, settings, _request(client, f"warm {k}", cands, top_n=3)).error is None
        sample = worker.metrics.registry.get_sample_value
        labels = {"stage": "rerank", "lane": "rerank"}
        service_s = (sample("embedstream_stage_duration_seconds_sum", labels)
                     / sample("embedstream_stage_duration_seconds_count", labels))  # one request's pass
        budget_ms = max(60, int(10 * service_s * 1000))
        sent: dict[str, tuple[int, float]] = {}
        futures = []
        gap_s = service_s / 2  # twice the rate the worker computes
        for k in range(max(60, int(3 / gap_s) if gap_s > 0 else 60)):
            if len(futures) >= 400:
                break
            deadline = now_ms() + budget_ms
            request = _request(client, f"overload {k}", cands, top_n=3, deadline_ms=deadline)
            sent[request.query] = (deadline, time.perf_counter())
            futures.append((request, client.submit(settings.kafka.topic_rerank, request, RerankReply, timeout_s=60)))
            time.sleep(gap_s)
        replies = [(request, future.result(timeout=60)) for request, future in futures]
    shed = [req.query for req, rep in replies if rep.error is not None]
    served = [req.query for req, rep in replies if rep.error is None]
    assert {rep.error.code for _, rep in replies if rep.error is not None} == {"deadline_exceeded"}
    assert shed and served, (len(shed), len(served))
    assert all(len(rep.results) == 3 for _, rep in replies if rep.error is None)
    computed = set().union(*(queries for _, queries in engine.calls))
    assert not computed & set(shed)  # a shed request had no pair scored
    for when, queries in engine.calls:  # nothing was computed once its deadline had passed
        late = [q for q in queries if q in sent and when >= sent[q][0]]
        assert not late, late
    counted = sum(sample("embedstream_shed_total", {"lane": "rerank", "reason": r}) or 0
                  for r in ("deadline_past", "expired_in_queue", "predicted_late", "late_at_pass"))
    assert counted == len(shed)
    shed_ms = sorted(rep.timings_ms.get("total", 0.0) for _, rep in replies if rep.error is not None)
    print(f"service {service_s * 1000:.1f} ms, budget {budget_ms} ms, {len(replies)} sent, {len(shed)} shed, "
          f"in-worker time of a shed request p50 {shed_ms[len(shed_ms) // 2]:.2f} ms")
