"""Searches reach the owner of their collection (issue #34): two embed worker deployments writing two collections
(each its own chunk topic, groups and storage form) and a rerank worker, on the real broker, searched through
``embedstream search`` as a user does. Every search is answered once, by its collection's owner, with hits from
that collection only; a search naming no collection is answered from the sender's default; a collection nobody
serves gets no one's hits."""

from __future__ import annotations

import json
import time

import pytest
from conftest import isolated_settings, make_engine, memory_store, wait_for
from kafka import KafkaConsumer, KafkaProducer
from typer.testing import CliRunner
from worker_rig import Running, RunningWorker

from embedstream.cli import app
from embedstream.config import QdrantSettings
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.rerank_worker import RerankOptions, RerankWorker
from embedstream.workers.search import Searcher
from embedstream.workers.trust import TrustSettings
from embedstream.workers.vector_search import VectorSearchWorker

pytestmark = pytest.mark.kafka

SCALAR, U8, NOBODY = "docs_scalar", "docs_u8", "docs_nobody"
TEXTS = {  # the same subjects in both collections, under different ids: a hit says which index it came from
    "files": "To read a file line by line, iterate over the file object returned by open().",
    "sorting": "list.sort() sorts in place; sorted() returns a new list; both take a key function.",
    "threads": "A daemon thread does not keep the interpreter alive when the program exits.",
}


def _deployment(base, name: str, collection: str, datatype: str):
    """One deployment's settings: the broker's shared topics, its own chunk topic, groups and collection."""
    kafka = base.kafka.model_copy(update={
        "topic_chunks_online": f"{base.kafka.topic_chunks_online}.{name}", "group_online": f"{base.kafka.group_online}-{name}",
        "topic_chunks_bulk": f"{base.kafka.topic_chunks_bulk}.{name}", "group_bulk": f"{base.kafka.group_bulk}-{name}"})
    qdrant = QdrantSettings(collection=collection, vector_datatype=datatype, versioned_collections=False)
    return base.model_copy(update={"kafka": kafka, "qdrant": qdrant})


def _index(settings, prefix: str) -> None:
    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
    for doc_id, text in TEXTS.items():
        producer.send(settings.kafka.topic_chunks_online, key=f"{prefix}-{doc_id}".encode(),
                      value=encode(ChunkEvent(doc_id=f"{prefix}-{doc_id}", chunk_id=0, text=text)))
    producer.close()


def _cli_search(base, query: str, *args: str, timeout_s: float = 30.0):
    """``embedstream search --json`` from a client whose deployment default is ``docs_scalar``."""
    k = base.kafka
    env = {"EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS": k.bootstrap_servers, "EMBEDSTREAM_KAFKA__TOPIC_SEARCH": k.topic_search,
           "EMBEDSTREAM_KAFKA__GROUP_SEARCH": k.group_search, "EMBEDSTREAM_KAFKA__TOPIC_REPLIES": k.topic_replies,
           "EMBEDSTREAM_KAFKA__TOPIC_QUERIES": k.topic_queries, "EMBEDSTREAM_QDRANT__COLLECTION": SCALAR,
           "NO_COLOR": "1", "TERM": "dumb"}
    result = CliRunner().invoke(app, ["search", query, "--top-k", "3", "--top-n", "3", "--timeout", str(timeout_s),
                                      "--json", *args], env=env)
    reply = None
    if result.exit_code in (0, 1) and result.stdout.strip().startswith("{"):
        reply = json.loads(result.stdout)
    return result, reply


def _replies_by_request(settings) -> dict[str, list[dict]]:
    """Every search reply on the replies topic, by request id (the query lane's replies are skipped)."""
    consumer = KafkaConsumer(settings.kafka.topic_replies, **settings.kafka.client_kwargs(), auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=3000)
    out: dict[str, list[dict]] = {}
    for message in consumer:
        value = json.loads(message.value)
        if "hits" in value:  # a SearchReply (a QueryReply has an embedding, no hits)
            out.setdefault(value["request_id"], []).append(value)
    consumer.close()
    return out


@pytest.mark.timeout(600)
def test_each_search_is_answered_once_by_the_owner_of_its_collection(kafka_bootstrap, minilm_engine, tiny_ce_dir):
    base = isolated_settings(kafka_bootstrap, "route")
    scalar, u8 = _deployment(base, "scalar", SCALAR, "float32"), _deployment(base, "u8", U8, "uint8")
    for settings in (scalar, u8):  # the topics before the workers: on a fresh, loaded broker leaders take a while
        ensure_topics(settings.kafka)
    store = memory_store()  # one store for both deployments: a Qdrant server holding both collections
    ce = make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank")
    reranking = base.model_copy(update={"qdrant": QdrantSettings(collection=SCALAR, versioned_collections=False),
                                        "trust": TrustSettings(collections=[U8])})  # one rerank deployment, both
    rerank = RerankWorker(reranking, ce, RerankOptions.from_settings(reranking),
                          searcher=Searcher(store, minilm_engine, ce, SCALAR))
    with RunningWorker(scalar, minilm_engine, store, lanes=("online",)) as scalar_worker, \
            RunningWorker(u8, minilm_engine, store, lanes=("online",)) as u8_worker, \
            Running(VectorSearchWorker(scalar, store, minilm_engine.spec.name, WorkerMetrics())) as scalar_search, \
            Running(VectorSearchWorker(u8, store, minilm_engine.spec.name, WorkerMetrics())) as u8_search, \
            Running(rerank):
        _index(scalar, "a")
        _index(u8, "b")
        wait_for(lambda: all(store.collection_exists(c) and store.count(c) == 3 for c in (SCALAR, U8)), 120,
                 "both collections indexed")
        wait_for(lambda: all(w.lane.joined() for w in (scalar_search, u8_search)) and rerank.lane.joined(), 60,
                 "the search lanes and the rerank worker joined their groups")

        answered: dict[str, tuple[str, str]] = {}  # request id -> (collection expected, doc id prefix expected)
        for args, collection, prefix, reranked in [
            (("--no-rerank", "--collection", U8), U8, "b", False),
            (("--no-rerank", "--collection", SCALAR), SCALAR, "a", False),
            (("--no-rerank",), SCALAR, "a", False),  # no collection: the sender's default, never the partition's
            (("--collection", U8), U8, "b", True),  # asks for a rerank while a reranker runs: the reranker answers
            ((), SCALAR, "a", True),
        ]:
            result, reply = _cli_search(base, "how do I sort a list?", *args)
            assert result.exit_code == 0 and reply is not None, (args, result.exit_code, result.output[-2000:])
            assert reply["error"] is None and reply["collection"] == collection, (args, reply)
            assert reply["hits"] and reply["hits"][0]["doc_id"] == f"{prefix}-sorting", (args, reply["hits"])
            assert {hit["doc_id"].split("-")[0] for hit in reply["hits"]} == {prefix}, (args, reply["hits"])
            assert (reply["model"] == "tiny-ce") is reranked, (args, reply["model"])
            answered[reply["request_id"]] = (collection, prefix)

        result, reply = _cli_search(base, "how do I sort a list?", "--no-rerank", "--collection", NOBODY, timeout_s=8)
        assert result.exit_code == 2 and reply is None, result.output[-2000:]  # no one's hits, no one's error
        assert NOBODY in result.output

        time.sleep(5)  # a second answer to any of them would have come by now
        replies = _replies_by_request(base)
        for request_id, (collection, _) in answered.items():
            assert len(replies.get(request_id, [])) == 1, (collection, replies.get(request_id))
        assert sum(len(r) for r in replies.values()) == len(answered)  # nothing answered the unserved search
        for running in (scalar_worker, u8_worker, scalar_search, u8_search, rerank):
            assert running.failure is None
