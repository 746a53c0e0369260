"""Re-index by replay on the real broker: a new version fills while queries keep reading the alias,
the alias switches atomically, documents changed meanwhile are caught up, a crashed replay resumes."""

from __future__ import annotations

import threading

import pytest
from conftest import isolated_settings, memory_store, wait_for
from worker_rig import RunningWorker

from embedstream.corpus import documents
from embedstream.engine.engine import EmbedRequest
from embedstream.vectorstore.base import VectorSpec
from embedstream.reindex import ReindexError, Reindexer, ReindexPlan
from embedstream.producers.chunker import Chunker
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import ensure_topics
from embedstream.producers.replay import StartPosition
from embedstream.workers.runtime import sink_config_from
from embedstream.workers.sink import point_id

pytestmark = pytest.mark.kafka


def _chunker(engine, tokens: int) -> Chunker:
    return Chunker(engine.tokenizer.tokenizer, engine.spec.max_tokens, chunk_tokens=tokens, overlap_tokens=8)


def _expected(docs, chunker) -> dict[str, str]:
    return {point_id(d["doc_id"], i): text for d in docs for i, text in enumerate(chunker.chunk(d["text"]))}


def _contents(store, collection) -> dict[str, str]:
    return {p.id: p.payload["text"] for p in store.scroll(collection)}


def _reindexer(settings, store, engine, target, tokens, on_phase=None, **plan) -> Reindexer:
    spec = ReindexPlan(target, settings.qdrant.collection, StartPosition.parse("earliest"), chunk_tokens=tokens,
                       overlap_tokens=8, wait_timeout_s=240, **plan)
    return Reindexer(settings, store, engine.spec, engine.dimensions, sink_config_from(settings), spec, on_phase)


class QueryLoop:
    """Searches the alias without pause; records every failure and every empty answer."""

    def __init__(self, store, alias, vector):
        self.store, self.alias, self.vector = store, alias, vector
        self.failures: list[str] = []
        self.searches = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            try:
                if not self.store.search(self.alias, "full", self.vector, 5):
                    self.failures.append("empty result")
            except Exception as exc:  # noqa: BLE001 - any failure is what the test counts
                self.failures.append(repr(exc))
            self.searches += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def _versioned_case(kafka_bootstrap: str, name: str, partitions: int):
    """One test's own topics and an empty store; collections versioned behind an alias (the production default)."""
    settings = isolated_settings(kafka_bootstrap, name, versioned_collections=True)
    settings.trust.collections = ["docs_next"]  # the re-index target: producers may name it (EMBEDSTREAM_TRUST__)
    ensure_topics(settings.kafka, partitions=partitions)
    return settings, memory_store(), settings.qdrant.collection


@pytest.mark.timeout(400)
def test_replay_into_new_version_switches_alias_without_failed_queries(kafka_bootstrap, minilm_engine):
    settings, store, alias = _versioned_case(kafka_bootstrap, "reindex", partitions=3)
    docs = documents(24, seed=21)
    old_chunker, new_chunker = _chunker(minilm_engine, 120), _chunker(minilm_engine, 48)
    with ChunkPublisher(settings.kafka, lane="bulk") as pub:
        pub.publish_documents(docs, old_chunker)
    v1 = _expected(docs, old_chunker)
    (query,), _ = minilm_engine.embed([EmbedRequest(0, "how do I read a file line by line?", prompt="query")])
    late = {"doc_id": "late-doc", "text": "Published while the replay waits for the workers. " * 6, "metadata": {}}
    live = ChunkPublisher(settings.kafka, lane="online")

    def publish_late_document_once(phase, done, total):
        if phase.startswith("embedding") and not live.sent:
            live.publish_document(late, old_chunker)
            live.flush()

    with RunningWorker(settings, minilm_engine, store):
        wait_for(lambda: store.exists(alias) and store.count(alias) == len(v1), 240, "version 1 indexed")
        assert store.get_alias(alias) == f"{alias}_v1"  # the production default: versioned behind an alias
        assert _contents(store, alias) == v1
        with QueryLoop(store, alias, query.vector.values) as loop:
            result = _reindexer(settings, store, minilm_engine, f"{alias}_v2", 48, publish_late_document_once,
                                drop_old=True).run()
            wait_for(lambda: loop.searches > 50, 30, "queries after the switch")
        live.close()
    assert loop.failures == [] and loop.searches > 50
    assert store.get_alias(alias) == f"{alias}_v2" and result.previous == f"{alias}_v1" and result.dropped
    assert not store.collection_exists(f"{alias}_v1")
    assert result.passes[0].documents == len(docs)
    # v2 holds exactly the documents (and the late one, caught up after the switch) in the new chunking
    assert _contents(store, alias) == _expected([*docs, late], new_chunker)
    hits = store.search(alias, "full", query.vector.values, 5)
    assert {h.payload["text"] for h in hits} <= set(_expected(docs, new_chunker).values())


@pytest.mark.timeout(400)
def test_crashed_replay_resumes_and_deleted_documents_stay_deleted(kafka_bootstrap, minilm_engine):
    settings, store, alias = _versioned_case(kafka_bootstrap, "resume", partitions=2)
    docs = documents(30, seed=8)
    chunker = _chunker(minilm_engine, 96)
    with ChunkPublisher(settings.kafka, lane="bulk") as pub:
        pub.publish_documents(docs, chunker)
        pub.delete_document(docs[0]["doc_id"])  # tombstoned in the documents log
    kept = docs[1:]

    class Crash(RuntimeError):
        pass

    def crash_after_some_records(phase, done, total):
        if phase.startswith("replaying") and done >= 8:
            raise Crash("simulated crash mid-replay")

    with RunningWorker(settings, minilm_engine, store):
        wait_for(lambda: store.exists(alias) and store.count(alias) == len(_expected(kept, chunker)), 240,
                 "version 1 indexed (the deleted document removed)")
        crashing = _reindexer(settings, store, minilm_engine, "docs_next", 64, crash_after_some_records)

        def replay_committing_often(publisher, phase, should_stop, fresh=False):
            from embedstream.producers.replay import DocumentReplay

            replay = DocumentReplay(settings.kafka, crashing.group, crashing.plan.start, publisher, crashing.chunker,
                                    commit_every_s=0, poll_records=4)
            try:
                return replay.run(lambda p: crashing.on_phase(phase, p.read, p.total), should_stop)
            finally:
                replay.close()

        crashing._replay = replay_committing_often
        with pytest.raises(Crash):
            crashing.run()
        assert store.get_alias(alias) == f"{alias}_v1"  # no switch before the replay finished
        result = _reindexer(settings, store, minilm_engine, "docs_next", 64).run()
    first = result.passes[0]
    assert first.resumed and first.total <= len(docs) + 1 - 4  # after the crashed run's committed records
    assert store.get_alias(alias) == "docs_next"
    assert _contents(store, "docs_next") == _expected(kept, _chunker(minilm_engine, 64))


def test_reindex_refuses_a_real_collection_as_alias_and_same_target(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "refuse")
    store = memory_store()
    store.ensure_collection("docs", {"full": VectorSpec(minilm_engine.dimensions, "cosine")})
    with pytest.raises(ReindexError, match="is a collection, not an alias") as refused:
        _reindexer(settings, store, minilm_engine, "docs_v2", 64).check()
    assert refused.value.code == "alias_is_collection"
    with pytest.raises(ReindexError, match="must differ") as same:
        _reindexer(settings, store, minilm_engine, "docs", 64).check()
    assert same.value.code == "target_is_alias"


def test_start_positions_parse():
    assert StartPosition.parse("earliest").kind == "earliest"
    assert StartPosition.parse("0:10,2:5").offsets == {0: 10, 2: 5}
    assert StartPosition.parse("1700000000000").timestamp_ms == 1_700_000_000_000
    assert StartPosition.parse("2026-01-01T00:00:00").timestamp_ms == 1_767_225_600_000
    with pytest.raises(ValueError, match="--from must be"):
        StartPosition.parse("yesterday")
