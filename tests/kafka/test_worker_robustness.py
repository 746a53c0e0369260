"""No record stops a worker (issue #13), on the real broker: undeliverable replies, dead letters too large
for the producer, sink rejections (permanent, and unknown failures that outlast their bound), and a
worker that truly cannot continue exits non-zero with the reason."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
import time
import uuid

import pytest
from conftest import isolated_settings, make_engine, memory_store, read_dead_letters, wait_for
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from fault_rig import _committed
from worker_rig import Running, RunningWorker, free_port, http_get

from embedstream.producers.query_client import QueryClient
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent, DocumentDelete, QueryRequest
from embedstream.schemas.codec import encode
from embedstream.schemas.rerank import Candidate, RerankReply, RerankRequest
from embedstream.vectorstore.base import VectorSpec
from embedstream.workers.loop import WorkerLoop
from embedstream.workers.metrics import WorkerMetrics
from embedstream.workers.transport.outbox import DEAD_LETTER_PREFIX_BYTES
from embedstream.workers.rerank_worker import RerankOptions, RerankWorker
from embedstream.workers.serve import run_until_signalled
from embedstream.workers.health import serve
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.trust import TrustSettings

pytestmark = pytest.mark.kafka

BAD_REPLY_TOPICS = ("__consumer_offsets", "bad topic!", "t" * 300)


def _with_reply_to(request, reply_to: str) -> bytes:
    """The request as JSON with a reply topic the schema may refuse (so it cannot be built as a model)."""
    body = json.loads(encode(request))
    body["reply_to"] = reply_to
    return json.dumps(body).encode()


def _send(settings, topic: str, values: list[bytes], **producer_kwargs) -> None:
    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all", **producer_kwargs)
    for value in values:
        producer.send(topic, key=b"k", value=value)
    producer.flush()
    producer.close()


def _tiny_reply_topic(settings) -> str:
    """A reply topic the trust policy allows (it starts with the replies topic) whose broker refuses every reply."""
    topic = f"{settings.kafka.topic_replies}.tiny"
    admin = KafkaAdminClient(**settings.kafka.client_kwargs())
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": "100"})])
    admin.close()
    return topic


def test_undeliverable_query_replies_are_dead_lettered_and_the_worker_goes_on(kafka_bootstrap, minilm_engine):
    """Reply topics the trust policy refuses are never produced to (reply_to_not_allowed, or a decode error
    for names no topic can have); an allowed one the broker refuses is dead-lettered as reply_failed."""
    settings = isolated_settings(kafka_bootstrap, "badreply")
    ensure_topics(settings.kafka, partitions=1)
    topic = settings.kafka.topic_queries
    bad = [_with_reply_to(QueryRequest(request_id=f"bad{i}", text="where is my reply?", reply_to="x"), name)
           for i, name in enumerate((*BAD_REPLY_TOPICS, _tiny_reply_topic(settings)))]
    running = RunningWorker(settings, minilm_engine, memory_store(), lanes=("online",))
    with QueryClient(settings.kafka) as client, running as worker:
        wait_for(lambda: worker.ready.is_set(), 120, "worker ready")
        _send(settings, topic, bad)
        letters = read_dead_letters(settings, len(bad), timeout_s=60)
        good = client.embed("how do I open a file for reading?", timeout_s=60)
        assert good.error is None and good.dims == 384
        assert running.thread.is_alive() and worker.failure is None
        wait_for(lambda: worker.lanes["online"].offsets.outstanding() == 0, 30, "every record finished")
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_online) == len(bad) + 1, 30,
                 "offsets committed past the bad requests")
    assert sorted(letter.offset for letter in letters) == [0, 1, 2, 3]
    by_offset = {letter.offset: letter for letter in letters}
    internal = by_offset[0].error  # a legal name no worker may reply on
    assert internal.code == "reply_to_not_allowed" and "__consumer_offsets" in internal.message
    refused = by_offset[3].error  # allowed, but the broker takes no reply there
    assert refused.code == "reply_failed" and ".tiny" in refused.message
    assert all(letter.error.message for letter in letters)
    assert {letter.raw_bytes() for letter in letters} == set(bad)


def test_undeliverable_rerank_reply_is_dead_lettered_and_the_worker_goes_on(kafka_bootstrap, tiny_ce_dir):
    settings = isolated_settings(kafka_bootstrap, "badrerank")
    ensure_topics(settings.kafka, partitions=1)
    engine = make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank")
    candidates = [Candidate(id="a", text="open a file"), Candidate(id="b", text="close the door")]
    running = Running(RerankWorker(settings, engine, RerankOptions()))
    with QueryClient(settings.kafka) as client, running as worker:
        wait_for(lambda: worker.ready.is_set(), 60, "worker ready")
        bad = [_with_reply_to(RerankRequest(request_id=f"r-bad{i}", query="read a file", candidates=candidates,
                                            reply_to="x"), name)
               for i, name in enumerate(("__consumer_offsets", _tiny_reply_topic(settings)))]
        _send(settings, settings.kafka.topic_rerank, bad)
        letters = sorted(read_dead_letters(settings, 2, timeout_s=60), key=lambda letter: letter.offset)
        request = RerankRequest(request_id=uuid.uuid4().hex, query="read a file", candidates=candidates,
                                reply_to=client.reply_topic)
        reply = client.request(settings.kafka.topic_rerank, request, RerankReply, timeout_s=60)
        assert running.thread.is_alive() and worker.failure is None
    assert [letter.error.code for letter in letters] == ["reply_to_not_allowed", "reply_failed"]
    assert [letter.raw_bytes() for letter in letters] == bad
    assert reply.error is None and sorted(r.id for r in reply.results) == ["a", "b"]


def test_a_dead_letter_too_large_for_the_producer_keeps_a_bounded_prefix(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "bigdlq")
    topic = settings.kafka.topic_chunks_bulk
    admin = KafkaAdminClient(**settings.kafka.client_kwargs())
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": str(4 << 20)})])
    admin.close()
    ensure_topics(settings.kafka, partitions=1)  # the rest; the chunk topic above is left as it is
    huge = encode(ChunkEvent(doc_id="huge", chunk_id=0, text="word " * 300_000))  # 1.5 MB: over the text limit
    good = [encode(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"good chunk {i} on files")) for i in range(3)]
    _send(settings, topic, [good[0], huge, *good[1:]], max_request_size=4 << 20)
    store = memory_store()
    running = RunningWorker(settings, minilm_engine, store, lanes=("bulk",))
    with running as worker:
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(good), 120, "good chunks")
        (letter,) = read_dead_letters(settings, 1, timeout_s=60)
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(good) + 1, 30, "offsets committed")
        assert running.thread.is_alive() and worker.failure is None
    assert letter.error.code == "text_too_large" and letter.offset == 1
    kept = letter.raw_bytes()
    assert len(kept) == DEAD_LETTER_PREFIX_BYTES and huge.startswith(kept)
    assert hashlib.sha256(huge).hexdigest() in letter.error.message
    assert f"{len(huge):,} bytes" in letter.error.message


class RefusingStore:
    """The real store, except that writes of one document fail with an error nobody can classify."""

    def __init__(self, store, cursed: str):
        self.store, self.cursed = store, cursed

    def upsert(self, collection, points, **kwargs):
        if any(p.payload.get("doc_id") == self.cursed for p in points):
            raise RuntimeError(f"the store choked on {self.cursed}")
        return self.store.upsert(collection, points, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_sink_rejections_are_dead_lettered_per_record_and_both_lanes_go_on(kafka_bootstrap, minilm_engine):
    """A vector-config mismatch is permanent: dead-lettered at once. An unclassified error that outlasts
    record_retry_limit_s is permanent for that record only. Good chunks around them are written, and the
    online lane keeps answering meanwhile."""
    settings = isolated_settings(kafka_bootstrap, "reject")
    settings.worker.record_retry_limit_s = 2.0
    settings.trust = TrustSettings(collections=["narrow"])  # producers may name it: the store refuses its vectors
    ensure_topics(settings.kafka, partitions=1)
    store = RefusingStore(memory_store(), cursed="cursed")
    store.ensure_collection("narrow", {"full": VectorSpec(3)}, payload_indexes=("doc_id",))
    topic = settings.kafka.topic_chunks_bulk
    values = [
        encode(ChunkEvent(doc_id="g0", chunk_id=0, text="good chunk zero on files")),
        encode(ChunkEvent(doc_id="m", chunk_id=0, text="a chunk for a collection of 3-dim vectors", collection="narrow")),
        encode(ChunkEvent(doc_id="g1", chunk_id=0, text="good chunk one on files")),
        encode(DocumentDelete(doc_id="m", collection="narrow")),
        encode(ChunkEvent(doc_id="cursed", chunk_id=0, text="the store cannot take this one")),
        encode(ChunkEvent(doc_id="g2", chunk_id=0, text="good chunk two on files")),
    ]
    _send(settings, topic, values)
    running = RunningWorker(settings, minilm_engine, store, lanes=("online", "bulk"))
    with QueryClient(settings.kafka) as client, running as worker:
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == 3, 120, "the good chunks")
        reply = client.embed("does the online lane still answer?", timeout_s=60)
        letters = read_dead_letters(settings, 3, timeout_s=60)
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(values), 60, "offsets committed")
        assert running.thread.is_alive() and worker.failure is None
    assert reply.error is None
    assert {p.payload["doc_id"] for p in store.scroll("docs")} == {"g0", "g1", "g2"}
    codes = {letter.offset: letter.error.code for letter in letters}
    assert codes == {1: "write_rejected", 3: "write_rejected", 4: "write_failed_repeatedly"}
    assert all(letter.error.message for letter in letters)
    assert "choked on cursed" in next(letter for letter in letters if letter.offset == 4).error.message


def _exit_of(worker) -> SystemExit:
    """Run the worker as its process would (``run_until_signalled``); the SystemExit it ends with."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as exited:
            run_until_signalled(worker, None)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return exited.value


class _BrokenWorker(WorkerLoop):
    """A worker whose step fails in a way no retry can fix (e.g. its disk went away)."""

    name = "broken worker"

    def run_once(self) -> int:
        raise OSError(28, "No space left on device")


def test_a_worker_that_cannot_continue_exits_non_zero_with_the_reason(kafka_bootstrap):
    settings = isolated_settings(kafka_bootstrap, "broken")
    worker = _BrokenWorker(settings.kafka, settings.worker, WorkerMetrics(), "broken-1")
    exited = _exit_of(worker)
    assert exited.code not in (0, None)  # a message: the interpreter prints it and exits with status 1
    assert "No space left on device" in str(exited.code) and "broken worker" in str(exited.code)


class FailingForward:
    """The real engine, except that a forward pass holding one poisoned text raises."""

    def __init__(self, engine, poison: str):
        self.engine, self.poison = engine, poison

    def forward(self, prepared, timings):
        if any(p.request.text == self.poison for p in prepared):
            raise RuntimeError("kernel failed on this input")
        return self.engine.forward(prepared, timings)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_failed_forward_pass_fails_its_record_not_the_worker(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "forward")
    ensure_topics(settings.kafka, partitions=1)
    poison = "this text breaks the kernel"
    events = [ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=f"good chunk {i} on files") for i in range(4)]
    events.insert(2, ChunkEvent(doc_id="bad", chunk_id=0, text=poison))
    topic = settings.kafka.topic_chunks_bulk
    _send(settings, topic, [encode(e) for e in events])
    store = memory_store()
    running = RunningWorker(settings, FailingForward(minilm_engine, poison), store, lanes=("online", "bulk"))
    with QueryClient(settings.kafka) as client, running as worker:
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == 4, 120, "the good chunks")
        (letter,) = read_dead_letters(settings, 1, timeout_s=60)
        failed_query = client.embed(poison, timeout_s=60)
        good_query = client.embed("still answering?", timeout_s=60)
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(events), 60, "offsets committed")
        assert running.thread.is_alive() and worker.failure is None
    assert letter.offset == 2 and letter.error.code == "forward_failed" and "kernel failed" in letter.error.message
    assert failed_query.error is not None and failed_query.error.code == "forward_failed"
    assert good_query.error is None


def test_a_failed_pass_keeps_what_its_batch_decided_without_a_forward_pass(kafka_bootstrap, minilm_engine):
    """A document's text changes T1 -> T2 -> T1 (with new metadata) in one batch whose pass fails: the chunks
    go through the model one by one, but the last change still borrows T1's stored vectors (its batch's
    lookup knew that T2 lands first); had it been decided alone it would rewrite the payload of a point that
    by then holds T2's vectors."""
    from embedstream.engine.engine import EmbedRequest, StageTimings
    from embedstream.workers.sink import EmbeddedChunk, QdrantSink, SinkConfig, point_id

    settings = isolated_settings(kafka_bootstrap, "keeps")
    ensure_topics(settings.kafka, partitions=1)
    poison, t1, t2 = "this text breaks the kernel", "the first text of the guide", "the second text of the guide"
    store = memory_store()
    (row,) = minilm_engine.forward(minilm_engine.prepare([EmbedRequest("d/0", t1, prompt="document")]), StageTimings())
    QdrantSink(store, minilm_engine.spec, minilm_engine.dimensions, "docs", SinkConfig()).upsert(
        [EmbeddedChunk(ChunkEvent(doc_id="d", chunk_id=0, text=t1, metadata={"v": 1}), row, {})])
    stored = {p.id: p for p in store.scroll("docs", with_vectors=True)}[point_id("d", 0)]
    events = [ChunkEvent(doc_id="d", chunk_id=0, text=t2, metadata={"v": 2}),
              ChunkEvent(doc_id="bad", chunk_id=0, text=poison),
              ChunkEvent(doc_id="d", chunk_id=0, text=t1, metadata={"v": 3})]
    topic = settings.kafka.topic_chunks_bulk
    _send(settings, topic, [encode(e) for e in events])
    running = RunningWorker(settings, FailingForward(minilm_engine, poison), store, lanes=("bulk",))
    with running as worker:
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(events), 120, "offsets committed")
        assert worker.failure is None
        moved = worker.metrics.forward_passes_avoided.labels(lane="bulk", reason="moved")._value.get()
    (letter,) = read_dead_letters(settings, 1, timeout_s=60)
    assert letter.error.code == "forward_failed"
    final = {p.id: p for p in store.scroll("docs", with_vectors=True)}[point_id("d", 0)]
    assert (final.payload["text"], final.payload["v"], moved) == (t1, 3, 1)
    assert final.vectors["full"] == pytest.approx(stored.vectors["full"], abs=1e-6)


class BlockingForward:
    """The real engine, except that a forward pass waits until released (a hung kernel, a stuck driver)."""

    def __init__(self, engine):
        self.engine = engine
        self.release = threading.Event()

    def forward(self, prepared, timings):
        self.release.wait(120)
        return self.engine.forward(prepared, timings)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_healthz_fails_while_the_loop_is_alive_but_stuck_and_recovers(kafka_bootstrap, minilm_engine):
    """Liveness is progress: a loop stuck in one step turns /healthz 503 with the reason, an idle one does not."""
    settings = isolated_settings(kafka_bootstrap, "stall")
    settings.worker.stall_timeout_s = 3.0
    ensure_topics(settings.kafka, partitions=1)
    engine = BlockingForward(minilm_engine)
    engine.release.set()  # the warm-up passes
    store = memory_store()
    port = free_port()
    worker = build_embed_worker(settings, ("bulk",), store=store, engine=engine)
    checks = {"joined": lambda: all(lane.joined() for lane in worker.lanes.values())}
    with Running(worker):
        server = serve(port, worker.metrics.registry, alive=lambda: True, checks=checks, stalled=worker.stalled)
        try:
            wait_for(lambda: http_get(port, "/readyz")[0] == 200, 60, "ready: the lane joined its group")
            time.sleep(4)  # idle past the bound: no lag, so still alive
            assert http_get(port, "/healthz")[0] == 200
            engine.release.clear()
            _send(settings, settings.kafka.topic_chunks_bulk, [encode(ChunkEvent(doc_id="s", chunk_id=0, text="stuck"))])
            wait_for(lambda: http_get(port, "/healthz")[0] == 503, 30, "/healthz 503 while the step hangs")
            assert "no loop step" in json.loads(http_get(port, "/healthz")[1])["reason"]
            engine.release.set()
            wait_for(lambda: store.collection_exists("docs") and store.count("docs") == 1, 60, "the chunk written")
            wait_for(lambda: http_get(port, "/healthz")[0] == 200, 30, "/healthz 200 again")
        finally:
            server.shutdown()


class _Fatal(BaseException):
    """Not an Exception: no per-record handler takes it (a dead device, an interpreter-level failure)."""


class FatalForward:
    """The real engine, except that the first bulk forward pass raises ``_Fatal``."""

    def __init__(self, engine):
        self.engine = engine

    def forward(self, prepared, timings):
        if any(p.request.id.startswith("doomed/") for p in prepared):
            raise _Fatal("the device fell off the bus")
        return self.engine.forward(prepared, timings)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_an_error_escaping_the_model_stage_ends_the_worker_non_zero_with_the_reason(kafka_bootstrap, minilm_engine):
    """The staged worker's threads: what escapes a stage ends the whole worker with the reason (as an error
    escaping a serial step does), and the records that stage held are not committed."""
    settings = isolated_settings(kafka_bootstrap, "fatalstage")
    ensure_topics(settings.kafka, partitions=1)
    topic = settings.kafka.topic_chunks_bulk
    _send(settings, topic, [encode(ChunkEvent(doc_id="doomed", chunk_id=0, text="this pass never finishes"))])
    worker = build_embed_worker(settings, ("bulk",), store=memory_store(), engine=FatalForward(minilm_engine))
    exited = _exit_of(worker)
    assert "the device fell off the bus" in str(exited.code) and "embed worker" in str(exited.code)
    assert isinstance(worker.failure, _Fatal)
    assert all(not stage.thread.is_alive() for stage in worker.running_stages)
    assert _committed(settings, topic, settings.kafka.group_bulk) == 0


class SlowStore:
    """The real store, with every upsert taking ``delay_s`` (a sink much slower than the model)."""

    def __init__(self, store, delay_s: float):
        self.store, self.delay_s = store, delay_s

    def upsert(self, *args, **kwargs):
        time.sleep(self.delay_s)
        return self.store.upsert(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_slow_sink_holds_intake_back_through_the_bounded_queues(kafka_bootstrap, tiny_bert_dir):
    """Backpressure end to end: the output stage falls behind, the model stage blocks on the output queue,
    the lane queue reaches its bound and intake pauses its partitions (keeping its membership); the
    queues stay bounded, and in the end every chunk is written once and committed."""
    settings = isolated_settings(kafka_bootstrap, "slowsink")
    settings.worker.max_queue_tokens = 600
    settings.worker.skip_unchanged = False
    ensure_topics(settings.kafka, partitions=2)
    topic = settings.kafka.topic_chunks_bulk
    events = [ChunkEvent(doc_id=f"s{i}", chunk_id=0, text=f"chunk {i} about reading and writing files")
              for i in range(1500)]  # 6 passes of 256: more than the output queue holds
    _send(settings, topic, [encode(e) for e in events])
    store = SlowStore(memory_store(), delay_s=0.5)
    running = RunningWorker(settings, make_engine(tiny_bert_dir), store, lanes=("bulk",))  # forward nearly free
    from embedstream.workers.output_stage import OUTPUT_QUEUE_BATCHES

    samples: list[tuple[bool, int, int]] = []
    with running as worker:
        lane = worker.lanes["bulk"]
        count = lambda: store.count("docs") if store.collection_exists("docs") else 0  # noqa: E731
        end = time.monotonic() + 180
        while count() < len(events) and time.monotonic() < end:
            samples.append((lane.paused, lane.queue.tokens, worker.output.queue.qsize()))
            time.sleep(0.02)
        assert count() == len(events)
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == len(events), 60, "offsets committed")
        blocked = worker.metrics.registry.get_sample_value("embedstream_stage_blocked_seconds_total", {"stage": "model"})
        assert running.thread.is_alive() and worker.failure is None
    assert any(paused for paused, _, _ in samples), "intake never paused while the sink was slow"
    assert max(qsize for _, _, qsize in samples) <= OUTPUT_QUEUE_BATCHES
    # paused once over the bound; one poll (at most the lane's max_poll_records) overshoots
    assert max(tokens for _, tokens, _ in samples) < settings.worker.max_queue_tokens + len(events) * 16
    assert blocked > 0.5  # the model stage waited for the output stage
    assert {p.payload["doc_id"] for p in store.scroll("docs")} == {e.doc_id for e in events}


class EndlessPass:
    """The real engine, except that a bulk pass runs until released, yielding at its layer checkpoints as the
    packed CPU encoders do (a MiniLM pass of 8,192 tokens took 30-45 s on a 2-vCPU host at load 28-30)."""

    def __init__(self, engine):
        self.engine = engine
        self.entered = threading.Event()
        self.release = threading.Event()

    def forward(self, prepared, timings):
        from embedstream.engine.yield_points import checkpoint

        self.entered.set()
        while not self.release.wait(0.02):
            checkpoint()
        return self.engine.forward(prepared, timings)

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_a_stop_is_honoured_between_the_layers_of_a_long_bulk_pass(kafka_bootstrap, tiny_bert_dir):
    """Stop mid-pass: the model stage gives the pass up at its next checkpoint and ends with the worker, its
    records uncommitted (the next owner embeds them). Before, it ran on after the worker had closed (its
    join gave up after 30 s): a thread of a stopped worker still running the model, in a test process
    into the next test, in a worker process into the interpreter's shutdown."""
    settings = isolated_settings(kafka_bootstrap, "midpass")
    ensure_topics(settings.kafka, partitions=1)
    topic = settings.kafka.topic_chunks_bulk
    _send(settings, topic, [encode(ChunkEvent(doc_id=f"m{i}", chunk_id=0, text=f"a long pass {i}")) for i in range(3)])
    engine = EndlessPass(make_engine(tiny_bert_dir))
    store = memory_store()
    running = RunningWorker(settings, engine, store, lanes=("bulk",))
    try:
        with running as worker:
            wait_for(engine.entered.is_set, 60, "the bulk pass to start")
        assert not [s.name for s in worker.running_stages if s.thread.is_alive()], "a stage outlived its worker"
    finally:
        engine.release.set()
    assert worker.failure is None
    assert not store.collection_exists("docs") or store.count("docs") == 0
    assert _committed(settings, topic, settings.kafka.group_bulk) == 0
