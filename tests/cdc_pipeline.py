"""A CDC pipeline on the real broker for the tests: a change topic, the bridge and an online embed worker
(each in a thread, on one isolated namespace), and what the collection and the documents log hold."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

from conftest import isolated_settings, memory_store, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig
from embedstream.producers.topics import all_topics, ensure_topics
from embedstream.vectorstore import CollectionNotFound
from embedstream.workers.cdc_bridge import CdcBridge, CdcOptions
from embedstream.workers.embed_worker import WorkerOptions
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.sink import point_id


def raw(obj) -> bytes | None:
    return None if obj is None else json.dumps(obj).encode()


class CountingEngine:
    """The real engine; remembers which chunks went through forward()."""

    def __init__(self, engine):
        self._engine = engine
        self.forwarded: list[str] = []
        self._lock = threading.Lock()

    def forward(self, items, timings):
        with self._lock:
            self.forwarded += [str(p.request.id) for p in items]
        return self._engine.forward(items, timings)

    def take(self) -> Counter:
        with self._lock:
            out, self.forwarded = Counter(self.forwarded), []
        return out

    def __getattr__(self, name):
        return getattr(self._engine, name)


class Rig:
    """A CDC topic, a bridge and an online embed worker, each in a thread, on one isolated namespace.

    ``topic``: the change topic (a Debezium connector's); default: one of the rig's own, written by ``send``.
    ``meta_keys``: the payload keys ``state()`` reports besides the text."""

    def __init__(self, bootstrap, engine, name: str, config: CdcConfig, chunker: Chunker, on_truncate="dead-letter",
                 topic: str | None = None, meta_keys=("lang", "views", "cdc_source"), partitions: int = 2,
                 bridge: bool = True):
        self.settings = isolated_settings(bootstrap, name)
        kafka = self.settings.kafka
        kafka.group_cdc = f"{kafka.group_online}-cdc"
        self.topic = topic or f"{kafka.topic_chunks_online}.cdc"
        self.meta_keys = meta_keys
        self.config, self.chunker, self.on_truncate = config, chunker, on_truncate
        # every topic up front, as in a deployment (a subscribed topic appearing later forces a rebalance)
        ensure_topics(kafka, partitions=partitions, topics=[self.topic, *all_topics(kafka)])
        self.store = memory_store()
        self.engine = CountingEngine(engine)
        self.collection = self.settings.qdrant.collection
        self.worker = build_embed_worker(self.settings, ("online",), store=self.store, engine=self.engine,
                                         options=WorkerOptions(lanes=("online",)))
        self.bridge = self.new_bridge() if bridge else None  # None: the caller runs the bridge (a process)
        self.producer = KafkaProducer(**kafka.client_kwargs(), acks="all", enable_idempotence=True)
        self.probe = {group: KafkaConsumer(**kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
                      for group in (kafka.group_cdc, kafka.group_online)}
        self.threads = [threading.Thread(target=w.run, daemon=True) for w in (self.worker, self.bridge) if w]

    def new_bridge(self) -> CdcBridge:
        return CdcBridge(self.settings, self.chunker, CdcOptions(self.topic, self.config, on_truncate=self.on_truncate))

    def __enter__(self):
        for t in self.threads:
            t.start()
        online = self.worker.lanes["online"].consumer
        try:
            wait_for(lambda: any(tp.topic == self.settings.kafka.topic_chunks_online for tp in online.assignment())
                     and (self.bridge is None or self.bridge.lane.consumer.assignment()), 60,
                     "the worker and the bridge to get their partitions")
        except AssertionError:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for w in (self.bridge, self.worker):
            if w is not None:
                w.stop()
        for t in self.threads:
            t.join(60)
        for consumer in self.probe.values():
            consumer.close()
        self.producer.close()
        assert not any(t.is_alive() for t in self.threads), "bridge or worker did not stop within 60 s"

    def send(self, k, value) -> None:
        """One change event; ``k`` and ``value`` are JSON-able objects (None: null), or bytes as they are."""
        value_bytes = value if isinstance(value, (bytes, type(None))) else raw(value)
        key_bytes = k if isinstance(k, (bytes, type(None))) else raw(k)
        self.producer.send(self.topic, key=key_bytes, value=value_bytes)

    def _caught_up(self, group: str, topic: str) -> bool:
        consumer = self.probe[group]
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        ends = consumer.end_offsets(tps)
        return all((consumer.committed(tp) or 0) == ends[tp] for tp in tps)

    def settle(self, timeout_s: float = 120) -> None:
        """Until the bridge and the embed worker have committed everything (bridge first: it feeds the worker)."""
        self.producer.flush()
        kafka = self.settings.kafka
        wait_for(lambda: self._caught_up(kafka.group_cdc, self.topic), timeout_s, "the bridge to commit every change")
        wait_for(lambda: self._caught_up(kafka.group_online, kafka.topic_chunks_online), timeout_s,
                 "the embed worker to commit every chunk event")

    def state(self) -> dict[str, tuple]:
        try:
            points = self.store.scroll(self.collection)
        except CollectionNotFound:
            return {}
        return {p.id: (p.payload["doc_id"], p.payload["chunk_id"], p.payload["text"],
                       {k: p.payload.get(k) for k in self.meta_keys if k in p.payload})
                for p in points}

    def reaches(self, expected: dict, timeout_s: float = 120) -> dict:
        """Wait until the collection equals ``expected`` (the source changes asynchronously), then until the
        pipeline has committed everything; returns the final state (for the caller's assert)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.state() != expected:
            time.sleep(0.2)
        self.settle(max(10.0, end - time.monotonic()))
        return self.state()


def latest_documents(settings, timeout_s: float = 30) -> dict[str, dict | None]:
    """The documents log (the re-index source) read to its end: doc_id -> last record (None: tombstone)."""
    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), enable_auto_commit=False, fetch_max_wait_ms=10)
    topic = settings.kafka.topic_documents
    tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    ends = consumer.end_offsets(tps)
    latest: dict[str, dict | None] = {}
    deadline = time.monotonic() + timeout_s
    while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            for r in records:
                latest[r.key.decode()] = None if r.value is None else json.loads(r.value)
    consumer.close()
    return latest


def expected_state(table: dict[str, dict], chunker: Chunker, text_fields, metadata) -> dict[str, tuple]:
    """What the collection must hold for this source table, worked out without the bridge's code."""
    out = {}
    for doc_id, fields in table.items():
        text = "\n\n".join(fields[f] for f in text_fields if fields.get(f) and fields[f].strip())
        for i, chunk in enumerate(chunker.chunk(text)):
            out[point_id(doc_id, i)] = (doc_id, i, chunk, metadata(fields))
    return out


def _para(topic: str, n: int) -> str:
    return (f"Paragraph {n} explains {topic} in plain words. It covers how the {topic} module reads input, "
            f"what errors it raises and which options change its behaviour.")


TOPICS = ["csv", "json", "pathlib", "sqlite3", "zipfile", "shutil", "argparse", "logging", "asyncio", "socket"]


def body(first: int, count: int, edit: int | None = None) -> str:
    """``count`` paragraphs; ``edit`` changes one of them (same length in tokens, new content)."""
    paras = [_para(TOPICS[(first + i) % len(TOPICS)], i) for i in range(count)]
    if edit is not None:
        paras[edit] = paras[edit].replace("plain words", "other words")
    return "\n\n".join(paras)


def paragraph_chunker(engine) -> Chunker:
    """40-token chunks, no overlap: each paragraph of body() is one chunk, so edits stay local."""
    return Chunker(engine.tokenizer.tokenizer, engine.spec.max_tokens, chunk_tokens=40, overlap_tokens=0)
