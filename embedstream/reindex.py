"""Zero-downtime re-index: replay the documents log into a new collection version, then swap the alias.

Live traffic keeps reading and writing the alias (``docs`` -> ``docs_v1``) while the replay fills
``docs_v2`` on the bulk lane. Once the embed workers have written everything the replay published
(their bulk group's committed offsets pass the replay's end offsets: commits follow upserts), the
alias moves to ``docs_v2`` in one step. A second, short replay pass then picks up documents that
changed between the first pass and the switch, so nothing written in that window is lost.
A crash anywhere resumes: the replay's position is its own consumer group's committed offsets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from embedstream import logs
from embedstream.config import Settings
from embedstream.engine.model_spec import ModelSpec
from embedstream.errors import CodedError
from embedstream.vectorstore.base import VectorStore
from embedstream.producers.chunker import Chunker
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import ensure_topics
from embedstream.producers.replay import DocumentReplay, ReplayProgress, StartPosition
from embedstream.workers.sink import QdrantSink, SinkConfig

log = logs.get("embedstream.reindex")


class ReindexError(CodedError, RuntimeError):
    """The re-index cannot proceed as asked (the message says why and what to do).

    Codes: ``target_is_alias``, ``alias_is_collection``, ``stopped``, ``workers_behind``."""


@dataclass
class ReindexPlan:
    target: str  # the new collection version, e.g. docs_v2
    alias: str  # what live traffic addresses, e.g. docs
    start: StartPosition
    chunk_tokens: int = 200
    overlap_tokens: int = 32
    drop_old: bool = False
    restart: bool = False  # ignore a previous run's committed position for this target (start at --from)
    wait_timeout_s: float = 3600.0


@dataclass
class ReindexResult:
    target: str
    previous: str | None
    passes: list[ReplayProgress]
    dropped: bool
    seconds: float


Phase = Callable[[str, int, int], None]  # (phase, done, total)


def replay_group(settings: Settings, target: str) -> str:
    """The consumer group holding a re-index's replay position (one per target collection)."""
    return f"embedstream-reindex-{target}"


class Reindexer:
    """Drives one re-index: create the target, replay, wait for the workers, swap, catch up, clean up."""

    def __init__(self, settings: Settings, store: VectorStore, spec: ModelSpec, dimensions: int,
                 sink_config: SinkConfig, plan: ReindexPlan, on_phase: Phase | None = None):
        self.settings = settings
        self.store = store
        self.spec = spec
        self.plan = plan
        self.on_phase = on_phase or (lambda phase, done, total: None)
        self.sink = QdrantSink(store, spec, dimensions, plan.alias, sink_config)
        self.chunker = Chunker.for_model(spec, plan.chunk_tokens, plan.overlap_tokens)
        self.group = replay_group(settings, plan.target)

    def check(self) -> str | None:
        """Validate names; return the alias's current target (None before the first version)."""
        plan = self.plan
        if plan.target == plan.alias:
            raise ReindexError("target_is_alias", f"--to-collection must differ from the alias {plan.alias!r} (e.g. {plan.alias}_v2)")
        if self.store.collection_exists(plan.alias):
            raise ReindexError(
                "alias_is_collection",
                f"{plan.alias!r} is a collection, not an alias, so it cannot be switched atomically. "
                f"Re-index into a versioned collection with another alias name (--alias), point readers at "
                f"that alias, then drop {plan.alias!r}; new deployments get versioned collections by default "
                f"(EMBEDSTREAM_QDRANT__VERSIONED_COLLECTIONS=true)."
            )
        current = self.store.get_alias(plan.alias)
        if current == plan.target:
            log.info("alias already points at the target; finishing the catch-up pass only", alias=plan.alias)
        return current

    def run(self, should_stop: Callable[[], bool] | None = None) -> ReindexResult:
        began = time.monotonic()
        plan = self.plan
        previous = self.check()
        ensure_topics(self.settings.kafka, topics=[self.settings.kafka.topic_documents,
                                                   self.settings.kafka.topic_chunks_bulk])
        self.sink.ensure(plan.target)
        passes = []
        with ChunkPublisher(self.settings.kafka, lane="bulk", model=self.spec.name, collection=plan.target,
                            create_topics=False, record_documents=False) as publisher:
            passes.append(self._replay(publisher, "replaying documents", should_stop, fresh=plan.restart))
            if should_stop and should_stop():
                raise ReindexError("stopped", "stopped before the replay finished; run the same command again to resume")
            self._await_workers("embedding into " + plan.target)
            if previous != plan.target:
                self.store.set_alias(plan.alias, plan.target)
                log.info("alias switched", alias=plan.alias, to=plan.target, previous=previous)
            # Documents published between the first pass and the switch went to the old version only.
            passes.append(self._replay(publisher, "catching up", should_stop))
        self._await_workers("catch-up into " + plan.target)
        dropped = False
        if plan.drop_old and previous and previous != plan.target:
            dropped = self.store.delete_collection(previous)
        return ReindexResult(plan.target, previous, passes, dropped, time.monotonic() - began)

    def _replay(self, publisher: ChunkPublisher, phase: str, should_stop, fresh: bool = False) -> ReplayProgress:
        replay = DocumentReplay(self.settings.kafka, self.group, self.plan.start, publisher, self.chunker,
                                ignore_committed=fresh)
        try:
            return replay.run(lambda p: self.on_phase(phase, p.read, p.total), should_stop)
        finally:
            replay.close()

    def _await_workers(self, phase: str) -> None:
        """Wait until the bulk embed group has committed past everything published so far."""
        kafka = self.settings.kafka
        consumer = Consumer(kafka.librdkafka_config(**{"group.id": kafka.group_bulk, "enable.auto.commit": False,
                                                       "client.id": "embedstream-reindex-wait"}))  # reads, never joins
        try:
            found = consumer.list_topics(kafka.topic_chunks_bulk, timeout=10).topics.get(kafka.topic_chunks_bulk)
            partitions = [TopicPartition(kafka.topic_chunks_bulk, p) for p in sorted(found.partitions if found else ())]
            ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in partitions}
            first: int | None = None
            deadline = time.monotonic() + self.plan.wait_timeout_s
            while True:
                committed = consumer.committed(partitions, timeout=10) if partitions else []
                behind = sum(max(0, ends[tp.partition] - max(tp.offset, 0)) for tp in committed)
                first = behind if first is None else first
                self.on_phase(phase, max(0, first - behind), first)
                if behind == 0:
                    return
                if time.monotonic() > deadline:
                    raise ReindexError(
                        "workers_behind",
                        f"the bulk embed workers (group {kafka.group_bulk!r}) are still {behind} records behind after "
                        f"{self.plan.wait_timeout_s:.0f} s; are they running? Run the same command again to resume."
                    )
                time.sleep(0.5)
        finally:
            consumer.close()
