"""No torn point, whatever races the writes of one document (issue #42): one worker on both lanes, the same
documents changed on both lanes and under every name of their collection (unset, the alias ``docs``, the
collection ``docs_v1``), and a second worker joining in the middle (a rebalance while a write is on its way).

Afterwards every stored point's vectors are the engine's embedding of its stored text (cos >= 0.9999), its
payload is one that was sent with that text, and sending the final state again costs no forward pass.

The three ways today's code tore a point, each forced by a gate on the real engine or the real store:

* a bulk pass's checkpoint serves an online change of a document whose metadata-only write the bulk batch
  decided before (the payload write landed over the online text change);
* the same document reached under two collection names (two in-flight keys: the second lookup did not wait
  for the first write);
* a write of the old owner held past the revocation's 2 s wait, landing after the new owner's text change.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time

import numpy as np
import pytest
from conftest import isolated_settings, wait_for
from fault_rig import _committed_to_the_end
from kafka import KafkaProducer
from kafka.partitioner.default import murmur2
from worker_rig import Running

from embedstream.engine.engine import EmbedRequest, StageTimings
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.vectorstore.edge_store import EdgeStore
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.sink import point_id, user_metadata

pytestmark = pytest.mark.kafka

PARTITIONS = 2
T1 = "Opening a file for reading returns a stream whose lines can be iterated one at a time."
T2 = "The garbage collector frees cyclic references that reference counting alone cannot reclaim."
T3 = "A socket bound to a port accepts connections and hands each one to a new thread."
NAMES = (None, "docs", "docs_v1")  # unset (the worker's default), the alias, the collection behind it


class Gate:
    """Holds one call until released: ``entered`` is set once the call waits."""

    def __init__(self, matches):
        self.matches = matches
        self.entered = threading.Event()
        self.released = threading.Event()

    def hold(self) -> None:
        self.entered.set()
        assert self.released.wait(180), "a gate was never released"


class GatedEngine:
    """The real engine, counting the sequences it embeds; ``gate(doc)`` holds the next forward pass with a chunk
    of ``doc`` until the gate is released (the pass then runs, serving online work at its checkpoints)."""

    def __init__(self, engine):
        self.engine = engine
        self.sequences = 0
        self.gates: list[Gate] = []

    def gate(self, doc: str) -> Gate:
        gate = Gate(lambda prepared: any(p.request.id.startswith(f"{doc}/") for p in prepared))
        self.gates.append(gate)
        return gate

    def forward(self, prepared, timings):
        for gate in [g for g in self.gates if g.matches(prepared)]:
            self.gates.remove(gate)
            gate.hold()
        self.sequences += len(prepared)
        return self.engine.forward(prepared, timings)

    def __getattr__(self, name):
        return getattr(self.engine, name)


class GatedStore:
    """The real store; ``gate(method, ids)`` holds the next call of ``method`` that writes one of the points ``ids``
    until the gate is released (a write on its way: a slow or paused sink); ``held`` is what that call wrote."""

    def __init__(self, store):
        self.store = store
        self.gates: list[Gate] = []
        self.held: list[str] = []

    def gate(self, method: str, ids: set[str]) -> Gate:
        gate = Gate(lambda called, written: called == method and bool(ids & set(written)))
        self.gates.append(gate)
        return gate

    def _pass(self, method: str, ids: list[str]) -> None:
        for gate in [g for g in self.gates if g.matches(method, ids)]:
            self.gates.remove(gate)
            self.held = list(ids)
            gate.hold()

    def upsert(self, name, points, *args, **kwargs):
        self._pass("upsert", [p.id for p in points])
        return self.store.upsert(name, points, *args, **kwargs)

    def overwrite_payloads(self, name, payloads, *args, **kwargs):
        self._pass("overwrite_payloads", list(payloads))
        return self.store.overwrite_payloads(name, payloads, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.store, name)


class Source:
    """What the test sent: every (text, metadata) per point, and each point's latest version."""

    def __init__(self, settings):
        self.settings = settings
        self.producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all", linger_ms=2)
        self.sent: dict[str, list[tuple[str, dict]]] = {}
        self.latest: dict[tuple[str, int], ChunkEvent] = {}
        self.version = 0

    def send(self, lane: str, doc: str, text: str, collection: str | None = None, chunk: int = 0) -> ChunkEvent:
        self.version += 1
        event = ChunkEvent(doc_id=doc, chunk_id=chunk, text=text, collection=collection,
                           metadata={"v": self.version, "lane": lane})
        topic = self.settings.kafka.topic_chunks_online if lane == "online" else self.settings.kafka.topic_chunks_bulk
        self.producer.send(topic, key=doc.encode(), value=encode(event))
        self.producer.flush()
        self.sent.setdefault(point_id(doc, chunk), []).append((text, dict(event.metadata)))
        self.latest[(doc, chunk)] = event
        return event

    def close(self) -> None:
        self.producer.close()


def _doc_on_partition(prefix: str, partition: int) -> str:
    """A document id whose records land on ``partition`` (kafka-python's default partitioner)."""
    for i in range(1000):
        doc = f"{prefix}{i}"
        if (murmur2(doc.encode()) & 0x7FFFFFFF) % PARTITIONS == partition:
            return doc
    raise AssertionError("no key found")


def _settled(settings) -> None:
    for topic, group in ((settings.kafka.topic_chunks_online, settings.kafka.group_online),
                         (settings.kafka.topic_chunks_bulk, settings.kafka.group_bulk)):
        _committed_to_the_end(settings, topic, group, timeout_s=180)


def _points(store) -> dict:
    if not store.collection_exists("docs_v1"):
        return {}
    return {p.id: p for p in store.scroll("docs_v1", with_vectors=True)}


def _torn_points(store, engine, source: Source) -> list:
    """Points whose vector is not their own text's embedding, or whose payload was never sent with that text."""
    points = _points(store)
    assert points, "nothing was written"
    texts = sorted({p.payload["text"] for p in points.values()})
    rows = engine.forward(engine.prepare([EmbedRequest(str(i), t, prompt="document") for i, t in enumerate(texts)]),
                          StageTimings())
    embedding = {t: np.asarray(r, dtype=np.float64) for t, r in zip(texts, rows)}
    torn = []
    for pid, point in points.items():
        text = point.payload["text"]
        vector = np.asarray(point.vectors["full"], dtype=np.float64)
        cos = float(vector @ embedding[text] / (np.linalg.norm(vector) * np.linalg.norm(embedding[text])))
        sent = (text, user_metadata(point.payload)) in source.sent[pid]
        hashed = point.payload["content_hash"] == hashlib.sha256(text.encode()).hexdigest()
        if cos < 0.9999 or not sent or not hashed:
            torn.append((point.payload["doc_id"], point.payload["chunk_id"], text[:20], round(cos, 4), sent, hashed))
    return torn


def test_no_write_tears_a_point_across_lanes_aliases_and_a_rebalance(kafka_bootstrap, minilm_engine, tmp_path):
    settings = isolated_settings(kafka_bootstrap, "torn", versioned_collections=True)
    settings.worker.commit_interval_s = 0.2
    settings.kafka.group_protocol = "eager"  # range: a joining member takes one partition of each topic
    ensure_topics(settings.kafka, partitions=PARTITIONS)
    edge = EdgeStore(tmp_path / "edge")
    store_a, engine_a = GatedStore(edge), GatedEngine(minilm_engine)
    source = Source(settings)
    worker_a = build_embed_worker(settings, ("online", "bulk"), store=store_a, engine=engine_a)
    torn: dict[str, list] = {}
    gates: list[Gate] = []

    def gated(gate: Gate) -> Gate:
        gates.append(gate)
        return gate

    def together(lane: str, sends) -> None:
        """``sends`` queued while worker A's model stage is held in a pass: its next batch takes them all."""
        busy = gated(engine_a.gate("busy"))
        source.send("online", "busy", f"{T3} {source.version}")
        assert busy.entered.wait(60), "the holding pass never started"
        for send in sends:
            send()
        wait_for(lambda: len(worker_a.lanes[lane].queue) == len(sends), 60, f"{len(sends)} changes queued together")
        busy.released.set()

    try:
        with Running(worker_a):
            wait_for(lambda: worker_a.ready.is_set(), 120, "worker A ready")
            pair = (_doc_on_partition("split", 0), _doc_on_partition("split", 1))
            for doc in ("lanes", "names", *pair):
                source.send("online", doc, T1)
            wait_for(lambda: len(_points(edge)) == 4, 120, "the first versions written")

            # 1. One worker on both lanes: a bulk batch decides a metadata-only write of "lanes"/0 (and embeds
            #    its other chunks); its pass serves an online text change of that chunk at a checkpoint.
            bulk_pass = gated(engine_a.gate("lanes"))
            together("bulk", [lambda: source.send("bulk", "lanes", T1)] + [
                lambda i=i: source.send("bulk", "lanes", f"{T3} Filler sentence number {i} about sockets.", chunk=i)
                for i in range(1, 7)])
            assert bulk_pass.entered.wait(60), "the bulk pass never started"
            source.send("online", "lanes", T2)
            wait_for(lambda: bool(worker_a.lanes["online"].queue), 30, "the online change queued during the pass")
            bulk_pass.released.set()
            _settled(settings)
            torn["one worker, both lanes"] = _torn_points(edge, minilm_engine, source)

            # 2. One lane, three names of one collection: a text change on its way to the store while
            #    metadata-only changes of the same point arrive under the other names.
            upsert = gated(store_a.gate("upsert", {point_id("names", 0)}))
            source.send("online", "names", T2, collection=None)
            assert upsert.entered.wait(60), "the upsert never started"
            source.send("online", "names", T1, collection="docs_v1")
            source.send("online", "names", T1, collection="docs")
            time.sleep(3)  # past the in-flight wait (2 s) of the later changes' lookups
            upsert.released.set()
            _settled(settings)
            torn["aliases"] = _torn_points(edge, minilm_engine, source)

            # 3. A rebalance while worker A's metadata-only write of two documents (one per partition) is held
            #    past the revocation's wait: worker B takes one partition over, writes that change again, then a
            #    text change; A's write lands last.
            rewrite = gated(store_a.gate("overwrite_payloads", {point_id(doc, 0) for doc in pair}))
            together("online", [lambda doc=doc: source.send("online", doc, T1) for doc in pair])
            assert rewrite.entered.wait(60), "the payload write never started"
            assert sorted(store_a.held) == sorted(point_id(doc, 0) for doc in pair)
            engine_b = GatedEngine(minilm_engine)
            worker_b = build_embed_worker(settings, ("online", "bulk"), store=edge, engine=engine_b)
            with Running(worker_b):
                def rewritten_by_b() -> list[str]:  # A's write is held: a change stored now is B's
                    stored = edge.get_payloads("docs_v1", [point_id(doc, 0) for doc in pair])
                    return [doc for doc in pair
                            if user_metadata(stored[point_id(doc, 0)]) == source.latest[(doc, 0)].metadata]

                wait_for(lambda: bool(rewritten_by_b()), 120, "worker B rewrote the change of the partition it took")
                (moved,) = rewritten_by_b()
                source.send("online", moved, T2)
                wait_for(lambda: edge.get_payloads("docs_v1", [point_id(moved, 0)])[point_id(moved, 0)]["text"] == T2,
                         120, "worker B wrote the text change")
                rewrite.released.set()
                _settled(settings)
                torn["rebalance"] = _torn_points(edge, minilm_engine, source)

                # 4. Both workers, every document changed at random on both lanes under every name.
                rng = random.Random(42)
                docs = ["lanes", "names", *pair, "mixed"]
                for _ in range(40):
                    source.send(rng.choice(("online", "bulk")), rng.choice(docs), rng.choice((T1, T2, T3)),
                                collection=rng.choice(NAMES))
                _settled(settings)
                torn["random"] = _torn_points(edge, minilm_engine, source)

                # The final state, once to settle the lanes' order, then again: nothing to embed.
                final = dict(source.latest)
                for (doc, chunk), event in final.items():
                    source.send("online", doc, event.text, collection=rng.choice(NAMES), chunk=chunk)
                _settled(settings)
                torn["final state"] = _torn_points(edge, minilm_engine, source)
                before = engine_a.sequences + engine_b.sequences
                for (doc, chunk), event in source.latest.items():
                    source.producer.send(settings.kafka.topic_chunks_online, key=doc.encode(), value=encode(event))
                source.producer.flush()
                _settled(settings)
                resent_cost = engine_a.sequences + engine_b.sequences - before
                stored = _points(edge)
                differs = [key for key, event in source.latest.items()
                           if (stored[point_id(*key)].payload["text"], user_metadata(stored[point_id(*key)].payload))
                           != (event.text, event.metadata)]
        assert not any(torn.values()), f"torn points (doc, chunk, text, cos, payload sent, hash): {torn}"
        assert differs == [], "the index does not hold the final state"
        assert resent_cost == 0, f"sending the final state again cost {resent_cost} forward passes"
    finally:
        for gate in gates:
            gate.released.set()
        source.close()
        edge.close()
