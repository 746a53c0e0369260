"""ChunkPublisher, topic administration and QueryClient against the test run's real broker (fresh topics per test).

The query client is exercised against a tiny echo responder thread standing in for the workers.
"""

from __future__ import annotations

import shutil
import statistics
import threading
import time
import uuid
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
from pydantic import BaseModel

from embedstream.config import KafkaSettings, default_registry
from embedstream.engine.model_spec import resolve_model
from embedstream.producers.chunker import Chunker
from embedstream.producers.sources import Document
from embedstream.schemas import CHUNK_TOPIC_ADAPTER, ChunkEvent, DecodeError, DocumentDelete, QueryReply, QueryRequest, decode, encode

kafka = pytest.importorskip("kafka")
from embedstream.producers.publisher import ChunkPublisher  # noqa: E402
from embedstream.producers.topics import all_topics, ensure_topics  # noqa: E402
from embedstream.producers.query_client import ClientClosedError, QueryClient  # noqa: E402

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.timeout(300),  # includes the broker's JVM start (and a first-time jar download)
    pytest.mark.skipif(shutil.which("java") is None, reason="java not installed"),
]


@pytest.fixture
def settings(kafka_bootstrap) -> KafkaSettings:
    """Fresh topic names per test, so tests never see each other's records."""
    tag = uuid.uuid4().hex[:8]
    names = {field: f"t-{tag}-{field.removeprefix('topic_')}" for field in KafkaSettings.model_fields if field.startswith("topic_")}
    return KafkaSettings(bootstrap_servers=kafka_bootstrap, **names)


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker.for_model(resolve_model("all-MiniLM-L6-v2", default_registry()), chunk_tokens=64, overlap_tokens=8)


def _consume(settings: KafkaSettings, topic: str, expected: int, timeout_s: float = 30.0) -> list:
    """All records of topic from the beginning, once `expected` arrived."""
    consumer = kafka.KafkaConsumer(**settings.client_kwargs(), group_id=None, enable_auto_commit=False,
                                   fetch_max_wait_ms=10)
    try:
        parts = [kafka.TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        records: list = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()


def _paragraphs(n: int, seed: str) -> str:
    return "\n\n".join(
        f"Paragraph {i} of {seed}. Kafka keeps records of one key in one partition, in order. "
        f"Workers embed each chunk and upsert it into the vector store. " * 3
        for i in range(n)
    )


def test_ensure_topics_is_idempotent(settings):
    created = ensure_topics(settings, partitions=3)
    assert sorted(created) == sorted(all_topics(settings))
    assert ensure_topics(settings, partitions=3) == []
    admin = kafka.KafkaAdminClient(**settings.client_kwargs())
    try:
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(all_topics(settings))}
    finally:
        admin.close()
    assert described == {topic: 3 for topic in all_topics(settings)}


def test_publish_documents_in_order_per_key(settings, chunker):
    docs = [Document(f"doc-{i}", _paragraphs(4 + i, f"doc-{i}"), {"source": "test", "i": i}) for i in range(4)]
    with ChunkPublisher(settings, lane="bulk", model="all-MiniLM-L6-v2", collection="docs", partitions=3) as pub:
        counts = {doc.doc_id: pub.publish_document(doc, chunker) for doc in docs}
        pub.publish_delete(DocumentDelete(doc_id="doc-1", chunk_ids=[0]))
        assert pub.publish_document({"doc_id": "doc-2", "text": "Short replacement."}, chunker, replace=True) == 1
        assert pub.publish_document(Document("empty", "   "), chunker) == 0
    assert all(count > 1 for count in counts.values())
    expected = sum(counts.values()) + 1 + 2
    records = _consume(settings, settings.topic_chunks_bulk, expected)
    assert len(records) == expected

    by_doc: dict[str, list] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        event = decode(record.value, CHUNK_TOPIC_ADAPTER)
        assert record.key == event.doc_id.encode("utf-8")
        by_doc[event.doc_id].append(event)
        partitions[event.doc_id].add(record.partition)
    assert all(len(p) == 1 for p in partitions.values()), "a document's records share one partition"

    for doc in docs:
        events = by_doc[doc.doc_id]
        chunks = [e for e in events if isinstance(e, ChunkEvent)][: counts[doc.doc_id]]
        assert [c.chunk_id for c in chunks] == list(range(counts[doc.doc_id]))
        assert [c.text for c in chunks] == chunker.chunk(doc.text)
        for c in chunks:
            assert (c.lane, c.model, c.collection, c.metadata) == ("bulk", "all-MiniLM-L6-v2", "docs", doc.metadata)
            assert c.created_at_ms and len(c.content_hash) == 64
    assert isinstance(by_doc["doc-1"][-1], DocumentDelete) and by_doc["doc-1"][-1].chunk_ids == [0]
    # replace=True: the new chunks, after the old ones, then a delete of the old ones past the new count (the
    # document never leaves the index, and chunks whose text did not change need no forward pass)
    tail = by_doc["doc-2"][-2:]
    assert isinstance(tail[0], ChunkEvent) and tail[0].text == "Short replacement." and tail[0].chunk_id == 0
    assert isinstance(tail[1], DocumentDelete) and tail[1].from_chunk == 1 and tail[1].collection == "docs"


def test_publish_documents_batched_matches_single(settings, chunker):
    docs = [Document(f"b-{i}", _paragraphs(1 + i % 3, f"b-{i}")) for i in range(10)]
    with ChunkPublisher(settings, lane="bulk", partitions=2) as pub:
        total = pub.publish_documents(iter(docs), chunker, batch_size=4)
    assert total == sum(len(chunker.chunk(d.text)) for d in docs)
    records = _consume(settings, settings.topic_chunks_bulk, total)
    texts: dict[str, list[str]] = defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        event = decode(record.value, ChunkEvent)
        texts[event.doc_id].append(event.text)
    assert texts == {d.doc_id: chunker.chunk(d.text) for d in docs}


def test_online_lane_uses_online_topic(settings, chunker):
    with ChunkPublisher(settings, lane="online") as pub:
        assert pub.topic == settings.topic_chunks_online
        pub.publish_chunk(ChunkEvent(doc_id="d", chunk_id=0, text="now", lane="online"))
    [record] = _consume(settings, settings.topic_chunks_online, 1)
    assert decode(record.value, ChunkEvent).text == "now"
    with pytest.raises(ValueError, match="lane"):
        ChunkPublisher(settings, lane="fast")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- request-reply


class RerankRequest(BaseModel):
    """Stand-in for a later request type: anything with request_id and reply_to works."""

    request_id: str
    query: str
    passages: list[str]
    reply_to: str


class RerankReply(BaseModel):
    request_id: str
    scores: list[float]


class EchoResponder:
    """Plays the workers: answers queries (embedding = [len(text)]) and rerank requests.

    Texts steer misbehaviour: "silent" gets no reply, "noise" is preceded by replies for
    unknown request ids and junk, "garbage" gets an undecodable reply.
    """

    def __init__(self, settings: KafkaSettings):
        self.settings = settings
        self.consumer = kafka.KafkaConsumer(**settings.client_kwargs(), group_id=None, fetch_max_wait_ms=settings.fetch_max_wait_ms)
        parts = []
        for topic in (settings.topic_queries, settings.topic_rerank):
            parts += [kafka.TopicPartition(topic, p) for p in self.consumer.partitions_for_topic(topic)]
        self.consumer.assign(parts)
        self.consumer.seek_to_beginning()
        self.producer = kafka.KafkaProducer(**settings.client_kwargs(), linger_ms=0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _reply(self, topic: str, request_id: str, value: bytes) -> None:
        self.producer.send(topic, key=request_id.encode(), value=value)

    def _run(self) -> None:
        while not self.stop.is_set():
            for batch in self.consumer.poll(timeout_ms=50).values():
                for record in batch:
                    if record.topic == self.settings.topic_rerank:
                        req = RerankRequest.model_validate_json(record.value)
                        scores = [float(len(p)) for p in req.passages]
                        self._reply(req.reply_to, req.request_id, encode(RerankReply(request_id=req.request_id, scores=scores)))
                        continue
                    req = decode(record.value, QueryRequest)
                    if req.text == "silent":
                        continue
                    if req.text == "noise":
                        self._reply(req.reply_to, "x", encode(QueryReply(request_id="someone-else", embedding=[0.0])))
                        self._reply(req.reply_to, "y", b"not json at all")
                        self._reply(req.reply_to, "z", b'{"no_request_id": 1}')
                    if req.text == "garbage":
                        self._reply(req.reply_to, req.request_id, b'{"request_id": "%s", "embedding": "nope"}' % req.request_id.encode())
                        continue
                    reply = QueryReply(request_id=req.request_id, embedding=[float(len(req.text))], dims=1,
                                       model=req.model or "echo", dtype=req.dtype,
                                       timings_ms={"queue": max(0.0, time.time() * 1000 - (req.sent_at_ms or 0))})
                    self._reply(req.reply_to, req.request_id, encode(reply))
            self.producer.flush()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.producer.close(timeout=5)
        self.consumer.close()


@pytest.fixture
def responder(settings):
    ensure_topics(settings, partitions=2)
    echo = EchoResponder(settings)
    yield echo
    echo.close()


def test_query_round_trip(settings, responder):
    with QueryClient(settings) as client:
        reply = client.embed("hello", model="m1", dtype="float16", timeout_s=10)
        assert isinstance(reply, QueryReply)
        assert reply.embedding == [5.0] and reply.model == "m1" and reply.dtype == "float16" and reply.error is None

        latencies = []
        for i in range(30):
            t0 = time.perf_counter()
            assert client.embed("x" * i, timeout_s=5).embedding == [float(i)]
            latencies.append((time.perf_counter() - t0) * 1000)
        print(f"\nquery round trip via echo responder: median {statistics.median(latencies):.1f} ms, "
              f"max {max(latencies):.1f} ms")


def test_concurrent_requests_get_their_own_replies(settings, responder):
    with QueryClient(settings) as client, ThreadPoolExecutor(8) as pool:
        texts = ["y" * n for n in range(1, 41)]
        replies = list(pool.map(lambda t: client.embed(t, timeout_s=10), texts))
    assert [r.embedding for r in replies] == [[float(len(t))] for t in texts]


def test_unknown_request_ids_and_junk_are_ignored(settings, responder):
    with QueryClient(settings) as client:
        assert client.embed("noise", timeout_s=10).embedding == [5.0]
        assert client.embed("after", timeout_s=10).embedding == [5.0]


def test_clients_share_a_reply_topic(settings, responder):
    with QueryClient(settings) as first, QueryClient(settings) as second:
        assert first.embed("one", timeout_s=10).embedding == [3.0]
        assert second.embed("three", timeout_s=10).embedding == [5.0]
        assert first.embed("seven!!", timeout_s=10).embedding == [7.0]


def test_timeout_raises_timeout_error(settings, responder):
    with QueryClient(settings) as client:
        client.embed("warm", timeout_s=10)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no reply to request .* within 0.5 s"):
            client.embed("silent", timeout_s=0.5)
        assert 0.45 <= time.monotonic() - t0 < 2.0
        assert client.embed("still works", timeout_s=10).embedding == [11.0]


def test_undecodable_reply_raises_decode_error(settings, responder):
    with QueryClient(settings) as client:
        with pytest.raises(DecodeError) as err:
            client.embed("garbage", timeout_s=10)
        assert err.value.code == "invalid_event" and "embedding" in err.value.message


def test_generic_request_with_another_reply_model(settings, responder):
    with QueryClient(settings) as client:
        request = RerankRequest(request_id=uuid.uuid4().hex, query="q", passages=["a", "bbb"], reply_to=client.reply_topic)
        reply = client.request(settings.topic_rerank, request, RerankReply, timeout_s=10)
        assert isinstance(reply, RerankReply) and reply.scores == [1.0, 3.0]
        with pytest.raises(ValueError, match="reply would be missed"):
            client.request(settings.topic_rerank, request.model_copy(update={"reply_to": "elsewhere"}), RerankReply)


def test_private_reply_topic_is_created(settings, responder):
    with QueryClient(settings, reply_topic=settings.topic_replies + "-private") as client:
        assert client.embed("mine", timeout_s=10).embedding == [4.0]


def test_closed_client_refuses_requests(settings, responder):
    client = QueryClient(settings)
    client.close()
    client.close()  # idempotent
    with pytest.raises(ClientClosedError):
        client.embed("late")
