"""One collection, one owner (issue #41), on the real broker: a search's query embedding is computed once, by the
deployment that owns the collection, and a second deployment claiming a collection another one serves is refused
(a restart or another replica of the same deployment is not).

Before: the search lane sent its query embedding to the shared queries topic, which every deployment's online group
reads (each embedded it, the first reply won, possibly ``unknown_model``), and two deployments of one collection
silently split its search partitions."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from conftest import isolated_settings, make_engine, memory_store, wait_for
from kafka import KafkaProducer
from worker_rig import Running, RunningWorker

from embedstream.config import QdrantSettings
from embedstream.producers.query_client import QueryClient
from embedstream.producers.search_routing import route
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.schemas.rerank import SearchReply, SearchRequest
from embedstream.workers.claim import CollectionClaimed
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.runtime import build_rerank_worker
from embedstream.workers.trust import TrustSettings
from embedstream.workers.vector_search import VectorSearchWorker

pytestmark = pytest.mark.kafka


def _deployment(base, name: str, collection: str, deployment: str | None = None):
    """A deployment sharing the broker's topics (queries, replies, searches) with its own chunk topics and groups."""
    kafka = base.kafka.model_copy(update={
        "topic_chunks_online": f"{base.kafka.topic_chunks_online}.{name}", "group_online": f"{base.kafka.group_online}-{name}",
        "topic_chunks_bulk": f"{base.kafka.topic_chunks_bulk}.{name}", "group_bulk": f"{base.kafka.group_bulk}-{name}",
        "deployment": deployment})
    return base.model_copy(update={"kafka": kafka, "qdrant": QdrantSettings(collection=collection,
                                                                            versioned_collections=False)})


def _queries_embedded(worker) -> float:
    return worker.metrics.texts.labels(lane="online", kind="query")._value.get()


@pytest.mark.timeout(600)
def test_a_search_is_embedded_once_by_the_owner_of_its_collection(kafka_bootstrap, minilm_engine):
    base = isolated_settings(kafka_bootstrap, "once")
    a, b = _deployment(base, "a", "docs_a"), _deployment(base, "b", "docs_b")
    for settings in (a, b):
        ensure_topics(settings.kafka, partitions=2)
    store = memory_store()
    with RunningWorker(a, minilm_engine, store, lanes=("online",)) as a_worker, \
            RunningWorker(b, minilm_engine, store, lanes=("online",)) as b_worker, \
            Running(VectorSearchWorker(a, store, minilm_engine.spec.name, WorkerMetrics())) as a_search, \
            Running(VectorSearchWorker(b, store, minilm_engine.spec.name, WorkerMetrics())) as b_search:
        producer = KafkaProducer(**base.kafka.client_kwargs(), acks="all")
        for settings, prefix in ((a, "a"), (b, "b")):
            for i, text in enumerate(("sorting a list in place", "reading a file line by line")):
                producer.send(settings.kafka.topic_chunks_online, key=f"{prefix}{i}".encode(),
                              value=encode(ChunkEvent(doc_id=f"{prefix}{i}", chunk_id=0, text=text)))
        producer.close()
        wait_for(lambda: all(store.collection_exists(c) and store.count(c) == 2 for c in ("docs_a", "docs_b")), 120,
                 "both collections indexed")
        wait_for(lambda: a_search.lane.joined() and b_search.lane.joined(), 60, "both search lanes joined")
        # both online lanes answer a plain embedding (the shared queries topic): both are up and reading
        with QueryClient(base.kafka) as client:
            assert client.embed("warm up", timeout_s=60).error is None
            time.sleep(3)  # the other deployment's reply to it, too
            before = {"a": _queries_embedded(a_worker), "b": _queries_embedded(b_worker)}
            assert before == {"a": 1, "b": 1}, before
            searches = 5
            for i in range(searches):
                topic, request = route(base.kafka, "docs_b", SearchRequest(
                    request_id=f"s{i}", query="how do I sort a list?", top_k=2, reply_to=base.kafka.topic_replies))
                reply = client.request(topic, request, SearchReply, timeout_s=60)
                assert reply.error is None and reply.hits[0].doc_id == "b0", reply
        time.sleep(3)  # a second embedding of any of them would have been counted by now
        embedded = {"a": _queries_embedded(a_worker) - before["a"], "b": _queries_embedded(b_worker) - before["b"]}
        assert embedded == {"a": 0, "b": searches}, embedded  # once per search, by docs_b's owner only
        for worker in (a_worker, b_worker, a_search, b_search):
            assert worker.failure is None


@pytest.mark.timeout(600)
def test_a_rerank_workers_remote_query_embedding_goes_to_the_collections_owner_only(kafka_bootstrap, minilm_engine,
                                                                                   tiny_ce_dir):
    """``worker rerank --remote-embed``: the query embedding of a search of ``docs_b`` is computed by docs_b's owner
    only. Before: it went to the shared queries topic, which both deployments' online lanes read (each embedded it)."""
    base = isolated_settings(kafka_bootstrap, "remote")
    a, b = _deployment(base, "a", "docs_a"), _deployment(base, "b", "docs_b")
    for settings in (a, b):
        ensure_topics(settings.kafka, partitions=2)
    store = memory_store()
    reranking = base.model_copy(update={"qdrant": QdrantSettings(collection="docs_b", versioned_collections=False),
                                        "trust": TrustSettings(collections=["docs_a", "docs_b"])})
    with RunningWorker(a, minilm_engine, store, lanes=("online",)) as a_worker, \
            RunningWorker(b, minilm_engine, store, lanes=("online",)) as b_worker, \
            QueryClient(base.kafka) as client:
        rerank = build_rerank_worker(reranking, "tiny-ce", minilm_engine.spec.name, store=store, remote_embed=True,
                                     engine=make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank"))
        with Running(rerank) as reranker:
            producer = KafkaProducer(**base.kafka.client_kwargs(), acks="all")
            for i, text in enumerate(("sorting a list in place", "reading a file line by line")):
                producer.send(b.kafka.topic_chunks_online, key=f"b{i}".encode(),
                              value=encode(ChunkEvent(doc_id=f"b{i}", chunk_id=0, text=text)))
            producer.close()
            wait_for(lambda: store.collection_exists("docs_b") and store.count("docs_b") == 2, 120, "docs_b indexed")
            wait_for(lambda: rerank.lane.joined(), 60, "the rerank worker joined")
            assert client.embed("warm up", timeout_s=60).error is None  # both online lanes up and reading
            time.sleep(3)
            before = {"a": _queries_embedded(a_worker), "b": _queries_embedded(b_worker)}
            searches = 4
            for i in range(searches):
                reply = client.request(base.kafka.topic_search, SearchRequest(
                    request_id=f"r{i}", query="how do I sort a list?", top_k=2, collection="docs_b",
                    rerank=i % 2 == 0, reply_to=base.kafka.topic_replies), SearchReply, timeout_s=60)
                assert reply.error is None and reply.hits[0].doc_id == "b0", reply
            time.sleep(3)  # a second embedding of any of them would have been counted by now
        embedded = {"a": _queries_embedded(a_worker) - before["a"], "b": _queries_embedded(b_worker) - before["b"]}
        assert embedded == {"a": 0, "b": searches}, embedded
        for worker in (a_worker, b_worker, reranker):
            assert worker.failure is None


@pytest.mark.timeout(600)
def test_a_second_deployment_claiming_a_served_collection_is_refused(kafka_bootstrap, minilm_engine, tmp_path):
    base = isolated_settings(kafka_bootstrap, "claim")
    first = _deployment(base, "first", "docs_c")  # default names: each deployment's online group
    second = _deployment(base, "second", "docs_c")
    ensure_topics(first.kafka, partitions=2)
    store = memory_store()
    with Running(VectorSearchWorker(first, store, minilm_engine.spec.name, WorkerMetrics())) as owner:
        wait_for(lambda: owner.lane.joined(), 60, "the owner's search lane joined")
        with pytest.raises(CollectionClaimed) as refused:
            VectorSearchWorker(second, store, minilm_engine.spec.name, WorkerMetrics())
        message = str(refused.value)
        assert refused.value.code == "collection_claimed"
        assert "'docs_c'" in message and repr(first.kafka.group_online) in message and \
            repr(second.kafka.group_online) in message, message
        # another replica of the same deployment (a rolling upgrade, a restart) is no claimant: it joins
        with Running(VectorSearchWorker(first, store, minilm_engine.spec.name, WorkerMetrics())) as replica:
            wait_for(lambda: replica.lane.joined() and owner.lane.joined(), 60, "both replicas members")
            assert replica.failure is None and owner.failure is None
        # `worker embed` of the second deployment stops before loading its model: exit 2, both named
        env = {"EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap, "EMBEDSTREAM_QDRANT__COLLECTION": "docs_c",
               "EMBEDSTREAM_QDRANT__PATH": str(tmp_path / "q"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               **{f"EMBEDSTREAM_KAFKA__{f.upper()}": getattr(second.kafka, f)
                  for f in ("topic_search", "group_search", "group_online", "group_bulk", "topic_queries")}}
        started = time.monotonic()
        cli = subprocess.run([sys.executable, "-m", "embedstream.cli", "worker", "embed", "--lanes", "bulk", "--no-search",
                              "--metrics-port", "0"], env=dict(os.environ, **env), capture_output=True,
                             text=True, timeout=300)
        assert cli.returncode == 2, cli.stderr[-3000:]
        assert "collection_claimed" in cli.stderr and first.kafka.group_online in cli.stderr, cli.stderr[-3000:]
        print(f"\nrefused in {time.monotonic() - started:.1f} s: {cli.stderr.strip()[-600:]}")


@pytest.mark.timeout(600)
def test_two_deployments_started_together_the_first_name_keeps_the_collection(kafka_bootstrap, minilm_engine):
    base = isolated_settings(kafka_bootstrap, "race")
    alpha = _deployment(base, "alpha", "docs_r", deployment="alpha")
    beta = _deployment(base, "beta", "docs_r", deployment="beta")
    ensure_topics(alpha.kafka, partitions=2)
    store = memory_store()
    # both pass the check before either joined (nobody in the group yet), then find each other
    workers = [VectorSearchWorker(s, store, minilm_engine.spec.name, WorkerMetrics()) for s in (alpha, beta)]
    for worker in workers:
        worker.claim.recheck_s = 1.0
    with Running(workers[0]) as kept, Running(workers[1]) as stepped_aside:
        wait_for(lambda: stepped_aside.failure is not None, 120, "beta seeing alpha in the group")
        assert isinstance(stepped_aside.failure, CollectionClaimed), stepped_aside.failure
        assert "'alpha'" in str(stepped_aside.failure) and "'beta'" in str(stepped_aside.failure)
        time.sleep(3)
        assert kept.failure is None and kept.claim.holders() == {}  # beta's member left the group


def _release(bootstrap: str, name: str, claims: str, collection: str = "docs_s"):
    """A deployment as a Helm release makes it: every topic and group its own (another prefix), the shared claims
    topic, a Qdrant server's URL (the claim's key; the store object itself is the test's)."""
    settings = isolated_settings(bootstrap, name)
    settings.kafka.topic_claims = claims
    settings.qdrant = QdrantSettings(url="http://qdrant.test:6333/", collection=collection, versioned_collections=False)
    return settings


@pytest.mark.timeout(600)
def test_two_releases_of_one_collection_on_one_server_meet_in_the_claims_topic(kafka_bootstrap, minilm_engine):
    """Release-scoped names share no search group: the claims topic (keyed by server and collection) is where they
    meet. The second is refused naming both; once the first has no member left, its claim is taken over."""
    claims = f"{isolated_settings(kafka_bootstrap, 'claims').kafka.topic_chunks_bulk}.claims"
    first, second = _release(kafka_bootstrap, "rel1", claims), _release(kafka_bootstrap, "rel2", claims)
    for settings in (first, second):
        ensure_topics(settings.kafka, partitions=1)
    store = memory_store()
    with Running(VectorSearchWorker(first, store, minilm_engine.spec.name, WorkerMetrics())) as owner:
        wait_for(lambda: owner.lane.joined(), 60, "the first release's search lane joined")
        assert owner.claim.claims()["http://qdrant.test:6333|docs_s"]["deployment"] == first.kafka.group_online
        with pytest.raises(CollectionClaimed) as refused:
            VectorSearchWorker(second, store, minilm_engine.spec.name, WorkerMetrics())
        message = str(refused.value)
        assert "'docs_s' of http://qdrant.test:6333" in message and repr(first.kafka.group_online) in message \
            and repr(second.kafka.group_online) in message and claims in message, message
        # another collection on the same server is no conflict
        other = _release(kafka_bootstrap, "rel3", claims, collection="docs_other")
        ensure_topics(other.kafka, partitions=1)
        with Running(VectorSearchWorker(other, store, minilm_engine.spec.name, WorkerMetrics())) as elsewhere:
            assert elsewhere.failure is None
    # the first release is gone (its member left the group): its claim is stale and taken over
    with Running(VectorSearchWorker(second, store, minilm_engine.spec.name, WorkerMetrics())) as successor:
        assert successor.claim.claims()["http://qdrant.test:6333|docs_s"]["deployment"] == second.kafka.group_online
        assert successor.failure is None
