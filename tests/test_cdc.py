"""CDC bridge: Debezium envelope parsing (pure), and on the real broker the bridge + embed worker
turning change events into exactly the collection the source table describes."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from embedstream.vectorstore import CollectionNotFound
from producers.chunker import Chunker
from producers.debezium import CdcConfig, CdcError, Change, from_extended_json, parse_change, unwrap
from producers.publisher import all_topics, ensure_topics
from schemas import ChunkEvent
from workers.cdc_bridge import CdcBridge, CdcOptions, apply_change, truncate_error
from workers.embed_worker import WorkerOptions
from workers.runtime import build_embed_worker
from workers.sink import point_id

CONFIG = CdcConfig("id", ("title", "body"), ("lang",))
MONGO = CdcConfig("_id", ("title", "content.body"), ("views", "tags"))
SOURCE = {"version": "2.7.0.Final", "connector": "postgresql", "name": "shop", "db": "shop", "schema": "public",
          "table": "articles", "snapshot": "false", "lsn": 123}
MONGO_SOURCE = {"version": "2.7.0.Final", "connector": "mongodb", "name": "kb", "db": "kb", "collection": "guides"}
OID = "65a1f0c2e4b0a1b2c3d4e5f6"


def envelope(op: str, before=None, after=None, source=None, wrap: bool = False, **extra) -> dict:
    payload = {"before": before, "after": after, "source": source or SOURCE, "op": op, "ts_ms": 1_700_000_000_000,
               "transaction": None, **extra}
    if not wrap:
        return payload
    return {"schema": {"type": "struct", "name": "shop.public.articles.Envelope", "optional": False, "fields": []},
            "payload": payload}


def key(value, field: str = "id", wrap: bool = False) -> dict:
    body = {field: value}
    if not wrap:
        return body
    return {"schema": {"type": "struct", "name": "shop.public.articles.Key", "optional": False,
                       "fields": [{"type": "int32", "optional": False, "field": field}]}, "payload": body}


def raw(obj) -> bytes | None:
    return None if obj is None else json.dumps(obj).encode()


def row(id_, title, body, lang="en") -> dict:
    return {"id": id_, "title": title, "body": body, "lang": lang, "updated_at": 1_700_000_000_000}


# -- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("wrap", [False, True], ids=["plain", "schema-wrapper"])
def test_create_with_and_without_schema_wrapper(wrap):
    change = parse_change(raw(key(7, wrap=wrap)), raw(envelope("c", after=row(7, "Title", "Body"), wrap=wrap)), CONFIG)
    assert change == Change("c", "7", "Title\n\nBody", {"lang": "en", "cdc_source": "shop.public.articles"},
                            "shop.public.articles")
    assert change.is_upsert and not change.is_delete


def test_snapshot_read_and_update():
    read = parse_change(raw(key(1)), raw(envelope("r", after=row(1, "T", "B"))), CONFIG)
    assert (read.op, read.doc_id, read.text) == ("r", "1", "T\n\nB")
    update = parse_change(raw(key(1)), raw(envelope("u", before=row(1, "T", "B"), after=row(1, "T", "B2"))), CONFIG)
    assert (update.op, update.doc_id, update.text, update.previous_doc_id) == ("u", "1", "T\n\nB2", None)


def test_update_that_changes_the_id_names_the_previous_one():
    change = parse_change(raw(key(2)), raw(envelope("u", before=row(1, "T", "B"), after=row(2, "T", "B"))), CONFIG)
    assert (change.doc_id, change.previous_doc_id) == ("2", "1")


def test_missing_null_and_blank_text_fields_are_skipped():
    after = {"id": "a", "title": None, "body": "only body", "lang": None}
    change = parse_change(None, raw(envelope("c", after=after)), CONFIG)
    assert change.text == "only body"
    assert change.metadata == {"lang": None, "cdc_source": "shop.public.articles"}  # present-but-null metadata is kept
    assert parse_change(None, raw(envelope("c", after={"id": "a", "title": "  "})), CONFIG).text == ""


def test_id_falls_back_to_the_key():
    after = {"title": "t", "body": "b"}  # id_field not in the row
    assert parse_change(raw(key(9, wrap=True)), raw(envelope("c", after=after)), CONFIG).doc_id == "9"
    assert parse_change(raw({"pk": "x-1"}), raw(envelope("c", after=after)), CONFIG).doc_id == "x-1"  # single field
    assert parse_change(b"plain-text-key", raw(envelope("c", after=after)), CONFIG).doc_id == "plain-text-key"


def test_delete_uses_before_then_the_key():
    assert parse_change(raw(key(3)), raw(envelope("d", before=row(3, "t", "b"))), CONFIG) == \
        Change("d", "3", source="shop.public.articles")
    assert parse_change(raw(key(4, wrap=True)), raw(envelope("d", before=None)), CONFIG).doc_id == "4"
    assert parse_change(raw(key(4)), raw({"op": "d", "source": SOURCE}), CONFIG).doc_id == "4"


@pytest.mark.parametrize("value", [None, b"", raw({"schema": None, "payload": None})], ids=["null", "empty", "null-payload"])
def test_tombstones(value):
    change = parse_change(raw(key(5, wrap=True)), value, CONFIG)
    assert change == Change("tombstone", "5") and change.is_delete


def test_truncate_is_reported_not_applied():
    change = parse_change(None, raw({"before": None, "after": None, "source": SOURCE, "op": "t"}), CONFIG)
    assert change == Change("t", None, source="shop.public.articles")
    err = truncate_error(change)
    assert err.code == "truncate_refused" and "shop.public.articles" in err.message


def test_mongodb_document_strings_and_keys():
    doc = {"_id": {"$oid": OID}, "title": "Backups", "content": {"body": "Use mongodump."},
           "views": {"$numberLong": "1234567890123"}, "tags": ["ops", {"$numberInt": "7"}],
           "created": {"$date": {"$numberLong": "1700000000000"}}}
    mongo_key = raw(key(json.dumps({"$oid": OID}), wrap=True))
    change = parse_change(mongo_key, raw(envelope("c", after=json.dumps(doc), source=MONGO_SOURCE)), MONGO)
    assert change.doc_id == OID
    assert change.text == "Backups\n\nUse mongodump."  # dotted path into the nested document
    assert change.metadata == {"views": 1234567890123, "tags": ["ops", 7], "cdc_source": "kb.guides"}
    # a delete without before (MongoDB without pre-images) and a tombstone: the id comes from the key
    delete = parse_change(mongo_key, raw(envelope("d", source=MONGO_SOURCE)), MONGO)
    assert (delete.op, delete.doc_id) == ("d", OID)
    assert parse_change(mongo_key, None, MONGO).doc_id == OID
    assert parse_change(raw({"id": '"guide-1"'}), None, MONGO).doc_id == "guide-1"  # string _id
    assert parse_change(raw({"id": "42"}), None, MONGO).doc_id == "42"  # numeric _id


def test_mongodb_update_without_full_document_is_refused_with_a_hint():
    value = envelope("u", source=MONGO_SOURCE, patch='{"$set": {"title": "x"}}', filter='{"_id": 1}')
    del value["after"], value["before"]
    with pytest.raises(CdcError) as err:
        parse_change(raw({"id": "1"}), raw({**value, "after": None}), MONGO)
    assert err.value.code == "missing_after" and "capture.mode" in err.value.message


def test_extended_json():
    assert from_extended_json({"a": [{"$oid": OID}, {"$numberDouble": "1.5"}, {"$numberDecimal": "0.10"}],
                               "b": {"$uuid": "u"}, "c": {"$binary": {"base64": "AA==", "subType": "00"}}}) == \
        {"a": [OID, 1.5, "0.10"], "b": "u", "c": {"$binary": {"base64": "AA==", "subType": "00"}}}
    assert unwrap({"schema": {}, "payload": {"x": 1}}) == {"x": 1}
    assert unwrap({"schema": {}, "payload": {"x": 1}, "other": 2})["other"] == 2  # not the wrapper


BAD = [
    ("malformed_json", raw(key(1)), b"{not json"),
    ("malformed_json", raw(key(1)), b"[1, 2]"),
    ("malformed_json", raw(key(1)), raw(envelope("c", after="{broken", source=MONGO_SOURCE))),
    ("invalid_envelope", raw(key(1)), raw({"before": None, "after": row(1, "t", "b"), "source": SOURCE})),  # no op
    ("invalid_envelope", raw(key(1)), raw({"op": "c", "source": SOURCE, "ts_ms": 1})),  # neither before nor after
    ("invalid_envelope", raw(key(1)), raw(envelope("c", after=[1, 2]))),
    ("unknown_op", raw(key(1)), raw(envelope("x", after=row(1, "t", "b")))),
    ("unknown_op", raw(key(1)), raw(envelope("m", after=None))),
    ("missing_after", raw(key(1)), raw(envelope("u", before=row(1, "t", "b"), after=None))),
    ("missing_id", None, raw(envelope("c", after={"title": "t", "body": "b"}))),
    ("missing_id", raw({"a": 1, "b": 2}), raw(envelope("c", after={"title": "t", "body": "b"}))),  # composite key
    ("missing_id", None, None),  # tombstone without a key
    ("missing_id", raw(key(1)), raw(envelope("c", after=row("", "t", "b")))),
    ("invalid_id", raw(key(1)), raw(envelope("c", after=row([1, 2], "t", "b")))),
    ("invalid_id", raw(key(1)), raw(envelope("c", after=row(True, "t", "b")))),
    ("non_text_field", raw(key(1)), raw(envelope("c", after=row(1, "t", 42)))),
    ("non_text_field", raw(key(1)), raw(envelope("r", after=row(1, {"nested": "x"}, "b")))),
]


@pytest.mark.parametrize("code,key_bytes,value", BAD, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_bad_input_raises_a_typed_error(code, key_bytes, value):
    with pytest.raises(CdcError) as err:
        parse_change(key_bytes, value, CONFIG)
    assert err.value.code == code
    assert err.value.message and err.value.to_error_info().code == code


class RecordingPublisher:
    """What apply_change asks of a ChunkPublisher, in order."""

    def __init__(self):
        self.calls: list[tuple] = []

    def publish_chunks(self, document, chunks, trim=True, record=False):
        self.calls.append(("chunks", document.doc_id, document.text, document.metadata, list(chunks), trim, record))
        return len(chunks)

    def delete_document(self, doc_id):
        self.calls.append(("delete", doc_id))


def test_apply_change_publishes_in_the_order_the_index_needs():
    pub = RecordingPublisher()
    moved = Change("u", "d1", "a b", {"lang": "en"}, previous_doc_id="d0")
    assert apply_change(pub, moved, ["a", "b"]) == (2, 2)
    assert pub.calls == [("delete", "d0"), ("chunks", "d1", "a b", {"lang": "en"}, ["a", "b"], True, True)]
    pub.calls.clear()
    assert apply_change(pub, Change("tombstone", "d1"), []) == (0, 1)
    assert apply_change(pub, Change("d", "d2"), []) == (0, 1)
    assert apply_change(pub, Change("c", "d3", ""), []) == (0, 1)  # no text left: no chunks, the trim removes old ones
    assert pub.calls == [("delete", "d1"), ("delete", "d2"), ("chunks", "d3", "", {}, [], True, True)]


def test_publisher_trims_and_records_for_the_bridge(kafka_free_publisher):
    """publish_chunks(record=True): documents-log record, chunks, then DocumentDelete(from_chunk=n)."""
    pub, sent = kafka_free_publisher
    from producers.sources import Document

    pub.publish_chunks(Document("d1", "a\n\nb", {"lang": "en"}), ["a", "b"], trim=True, record=True)
    pub.delete_document("d1")
    topics = [topic for topic, _, _ in sent]
    assert topics == ["docs-log", "lane", "lane", "lane", "lane", "docs-log"]
    record = json.loads(sent[0][2])
    assert (record["kind"], record["doc_id"], record["text"]) == ("document", "d1", "a\n\nb")
    chunks = [json.loads(v) for t, _, v in sent[1:3]]
    assert [(c["chunk_id"], c["text"], c["metadata"]) for c in chunks] == [(0, "a", {"lang": "en"}), (1, "b", {"lang": "en"})]
    trim, delete = json.loads(sent[3][2]), json.loads(sent[4][2])
    assert (trim["kind"], trim["from_chunk"], trim["chunk_ids"]) == ("delete", 2, None)
    assert (delete["kind"], delete["from_chunk"], delete["chunk_ids"]) == ("delete", None, None)
    assert sent[5][2] is None and all(k == b"d1" for _, k, _ in sent)  # the tombstone


@pytest.fixture
def kafka_free_publisher(monkeypatch):
    """A ChunkPublisher whose producer only records what it is asked to send."""
    import producers.publisher as publisher_module
    from embedstream.config import KafkaSettings

    sent: list[tuple] = []

    class FakeProducer:
        def __init__(self, **_):
            pass

        def send(self, topic, key=None, value=None):
            sent.append((topic, key, value))

            class Future:
                def add_errback(self, _):
                    return self

            return Future()

    monkeypatch.setattr(publisher_module, "KafkaProducer", FakeProducer)
    settings = KafkaSettings(topic_chunks_online="lane", topic_documents="docs-log")
    return publisher_module.ChunkPublisher(settings, lane="online", create_topics=False), sent


def test_cdc_options_refuse_an_unknown_truncate_policy():
    with pytest.raises(ValueError):
        CdcOptions("t", CONFIG, on_truncate="delete")  # type: ignore[arg-type]


# -- the sink's "unchanged" check --------------------------------------------------------------------
def test_sink_unchanged_compares_hash_model_and_metadata(minilm_engine):
    import numpy as np

    from workers.sink import EmbeddedChunk, QdrantSink, SinkConfig

    sink = QdrantSink(memory_store(), minilm_engine.spec, minilm_engine.dimensions, "docs", SinkConfig())
    stored = [ChunkEvent(doc_id="d", chunk_id=i, text=f"text {i}", metadata={"lang": "en"}) for i in range(3)]
    vector = np.ones(minilm_engine.dimensions, dtype=np.float32) / np.sqrt(minilm_engine.dimensions)
    sink.upsert([EmbeddedChunk(e, vector, {"offset": 1}) for e in stored])
    again = [e.model_copy() for e in stored]
    assert sink.unchanged(again) == [True, True, True]
    edited = ChunkEvent(doc_id="d", chunk_id=1, text="text 1 edited", metadata={"lang": "en"})
    relabelled = ChunkEvent(doc_id="d", chunk_id=2, text="text 2", metadata={"lang": "de"})
    fresh = ChunkEvent(doc_id="d", chunk_id=3, text="text 3", metadata={"lang": "en"})
    assert sink.unchanged([stored[0], edited, relabelled, fresh]) == [True, False, False, False]
    # in one list, a chunk changed earlier in the list no longer matches the store: A -> B -> A must embed both
    assert sink.unchanged([edited, stored[1]]) == [False, False]
    assert sink.unchanged([stored[1], stored[1]]) == [True, True]


# -- on the broker ---------------------------------------------------------------------------------
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
    """A CDC topic, a bridge and an online embed worker, each in a thread, on one isolated namespace."""

    def __init__(self, bootstrap, engine, name: str, config: CdcConfig, chunker: Chunker, on_truncate="dead-letter"):
        self.settings = isolated_settings(bootstrap, name)
        kafka = self.settings.kafka
        kafka.group_cdc = f"{kafka.group_online}-cdc"
        self.topic = f"{kafka.topic_chunks_online}.cdc"
        # every topic up front, as in a deployment (a subscribed topic appearing later forces a rebalance)
        ensure_topics(kafka, partitions=2, topics=[self.topic, *all_topics(kafka)])
        self.store = memory_store()
        self.engine = CountingEngine(engine)
        self.collection = self.settings.qdrant.collection
        self.worker = build_embed_worker(self.settings, ("online",), store=self.store, engine=self.engine,
                                         options=WorkerOptions(lanes=("online",)))
        self.bridge = CdcBridge(self.settings, chunker, CdcOptions(self.topic, config, on_truncate=on_truncate))
        self.producer = KafkaProducer(**kafka.client_kwargs(), acks="all", enable_idempotence=True)
        self.probe = {group: KafkaConsumer(**kafka.client_kwargs(), group_id=group, enable_auto_commit=False)
                      for group in (kafka.group_cdc, kafka.group_online)}
        self.threads = [threading.Thread(target=w.run, daemon=True) for w in (self.worker, self.bridge)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        online = self.worker.consumers["online"]
        try:
            wait_for(lambda: any(tp.topic == self.settings.kafka.topic_chunks_online for tp in online.assignment())
                     and self.bridge.consumer.assignment(), 60, "the worker and the bridge to get their partitions")
        except AssertionError:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for w in (self.bridge, self.worker):
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
                       {k: p.payload.get(k) for k in ("lang", "views", "cdc_source") if k in p.payload})
                for p in points}


def latest_documents(settings, timeout_s: float = 30) -> dict[str, dict | None]:
    """The documents log (the re-index source) read to its end: doc_id -> last record (None: tombstone)."""
    import time

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


def _body(first: int, count: int, edit: int | None = None) -> str:
    paras = [_para(TOPICS[(first + i) % len(TOPICS)], i) for i in range(count)]
    if edit is not None:
        paras[edit] = paras[edit].replace("plain words", "other words")  # same length in tokens, new content
    return "\n\n".join(paras)


@pytest.fixture
def small_chunker(minilm_engine) -> Chunker:
    """40-token chunks, no overlap: each paragraph of _body is one chunk, so edits stay local."""
    return Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=40, overlap_tokens=0)


def _relational_meta(fields: dict) -> dict:
    return {"lang": fields["lang"], "cdc_source": "shop.public.articles"}


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_cdc_lifecycle_ends_as_the_source_table(kafka_bootstrap, minilm_engine, small_chunker):
    rig = Rig(kafka_bootstrap, minilm_engine, "cdclife", CONFIG, small_chunker, on_truncate="ignore")
    table: dict[str, dict] = {}

    def expected():
        return expected_state(table, small_chunker, ("title", "body"), _relational_meta)

    with rig:
        # 1. snapshot reads (schema wrapper, as JsonConverter writes with schemas.enable) and a live create
        for i, first in ((1, 0), (2, 3), (3, 6)):
            table[str(i)] = row(i, f"Guide {i}", _body(first, 4))
            rig.send(key(i, wrap=True), envelope("r", after=table[str(i)], wrap=True,
                                                 source={**SOURCE, "snapshot": "true" if i < 3 else "last"}))
        table["4"] = row(4, "Guide 4", _body(1, 3))
        rig.send(key(4), envelope("c", after=table["4"]))
        rig.settle()
        assert rig.state() == expected()
        first_pass = rig.engine.take()
        assert first_pass == Counter(f"{d}/{c}" for d, c, _, _ in expected().values())  # each chunk embedded once

        # 2. updates: one paragraph edited; a shrink; a metadata-only change; then a redelivered event
        old2 = small_chunker.chunk("Guide 2\n\n" + _body(3, 4))
        new2 = small_chunker.chunk("Guide 2\n\n" + _body(3, 4, edit=2))
        changed = [i for i, (a, b) in enumerate(zip(old2, new2)) if a != b]
        assert len(old2) == len(new2) == 4 and len(changed) == 1  # precondition: one chunk differs
        before2 = table["2"]
        table["2"] = row(2, "Guide 2", _body(3, 4, edit=2))
        update2 = envelope("u", before=before2, after=table["2"])
        rig.send(key(2), update2)
        before3 = table["3"]
        table["3"] = row(3, "Guide 3", _body(6, 2))  # 4 paragraphs -> 2: chunks 2 and 3 vanish
        rig.send(key(3, wrap=True), envelope("u", before=before3, after=table["3"], wrap=True))
        before4 = table["4"]
        table["4"] = {**before4, "lang": "de"}  # same text, new metadata: the payload must follow
        rig.send(key(4), envelope("u", before=before4, after=table["4"]))
        rig.send(key(2), update2)  # redelivery: harmless, nothing embedded again
        rig.settle()
        assert rig.state() == expected()
        assert len([p for p in rig.state().values() if p[0] == "3"]) == 2
        second_pass = rig.engine.take()
        assert second_pass == Counter([f"2/{changed[0]}"] + [f"4/{c}" for c in range(len(small_chunker.chunk(
            "Guide 4\n\n" + _body(1, 3))))]), "only the edited chunk and the re-labelled document are embedded"
        unchanged = rig.worker.metrics.chunks_unchanged.labels(lane="online")._value.get()
        assert unchanged == 3 + 2 + 4  # doc 2's other chunks, doc 3's kept chunks, the redelivered doc 2

        # 3. deletes, each followed by its tombstone (before row present; before null as with REPLICA IDENTITY DEFAULT)
        rig.send(key(1), envelope("d", before=table.pop("1")))
        rig.send(key(1), None)
        table.pop("3")
        rig.send(key(3, wrap=True), envelope("d", before=None, wrap=True))
        rig.send(key(3, wrap=True), None)
        rig.send(None, {"before": None, "after": None, "source": SOURCE, "op": "t", "ts_ms": 1})  # ignored here
        rig.settle()
        final = rig.state()
        assert not rig.engine.take()
    assert final == expected()
    assert {doc for doc, _, _, _ in final.values()} == {"2", "4"}
    assert all(meta["lang"] == "de" for doc, _, _, meta in final.values() if doc == "4")
    assert rig.bridge.metrics.events.labels(op="t")._value.get() == 1
    assert not read_dead_letters(rig.settings, 1, timeout_s=2)
    # the documents log (what a re-index replays) says the same: live rows whole, deleted ones tombstoned
    documents = latest_documents(rig.settings)
    assert {doc: (record or {}).get("text") for doc, record in documents.items()} == {
        "1": None, "3": None, **{doc: f"{r['title']}\n\n{r['body']}" for doc, r in table.items()}}
    assert documents["4"]["metadata"] == {"lang": "de", "cdc_source": "shop.public.articles"}


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_cdc_mongodb_documents(kafka_bootstrap, minilm_engine, small_chunker):
    rig = Rig(kafka_bootstrap, minilm_engine, "cdcmongo", MONGO, small_chunker)

    def doc(_id, title, body, views):
        return {"_id": _id, "title": title, "content": {"body": body}, "views": {"$numberLong": str(views)}}

    def mongo_key(_id) -> dict:
        return key(json.dumps(_id), wrap=True)  # the key's id is _id as extended JSON text

    oid = {"$oid": OID}
    with rig:
        rig.send(mongo_key(oid), envelope("c", after=json.dumps(doc(oid, "Backups", _body(0, 3), 10)),
                                          source=MONGO_SOURCE))
        rig.send(mongo_key("guide-1"), envelope("r", after=json.dumps(doc("guide-1", "Restores", _body(4, 2), 5)),
                                                source=MONGO_SOURCE))
        rig.settle()
        state = rig.state()
        assert {d for d, _, _, _ in state.values()} == {OID, "guide-1"}
        assert {m["views"] for _, _, _, m in state.values()} == {10, 5}
        rig.engine.take()
        # a full-document update (change_streams_update_full): one paragraph edited
        rig.send(mongo_key(oid), envelope("u", after=json.dumps(doc(oid, "Backups", _body(0, 3, edit=1), 10)),
                                          source=MONGO_SOURCE, updateDescription={"updatedFields": "{}"}))
        rig.settle()
        old, new = (small_chunker.chunk("Backups\n\n" + _body(0, 3, edit)) for edit in (None, 1))
        changed = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
        assert len(old) == len(new) == 3 and len(changed) == 1
        assert rig.engine.take() == Counter([f"{OID}/{changed[0]}"])  # only the edited chunk is embedded again
        # delete (no pre-image: before is null) and its tombstone
        rig.send(mongo_key(oid), envelope("d", source=MONGO_SOURCE))
        rig.send(mongo_key(oid), None)
        rig.settle()
        final = rig.state()
    table = {"guide-1": {"title": "Restores", "body": _body(4, 2)}}
    assert final == expected_state(table, small_chunker, ("title", "body"),
                                   lambda _: {"views": 5, "cdc_source": "kb.guides"})


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_cdc_bad_input_is_dead_lettered_and_the_bridge_carries_on(kafka_bootstrap, minilm_engine, small_chunker):
    rig = Rig(kafka_bootstrap, minilm_engine, "cdcbad", CONFIG, small_chunker)
    table = {str(i): row(i, f"Good {i}", _body(i, 2)) for i in (10, 11, 12)}
    bad = [
        ("invalid_envelope", key(20), {"op": "c", "source": SOURCE, "ts_ms": 1}),  # no before, no after
        ("unknown_op", key(21), envelope("x", after=row(21, "t", "b"))),
        ("missing_id", None, envelope("c", after={"title": "no id", "body": "and no key"})),
        ("non_text_field", key(22), envelope("c", after=row(22, "title", 12345))),
        ("truncate_refused", None, {"before": None, "after": None, "source": SOURCE, "op": "t", "ts_ms": 1}),
        ("malformed_json", key(23), b"{not json"),
    ]
    with rig:
        goods = [(key(int(i)), envelope("c", after=r)) for i, r in table.items()]
        for n, (good_key, good_value) in enumerate(goods):  # bad events between the good ones, same partitions
            rig.send(good_key, good_value)
            for _, bad_key, bad_value in bad[2 * n: 2 * n + 2]:
                rig.send(bad_key, bad_value)
        rig.settle()
        letters = read_dead_letters(rig.settings, len(bad))
        final = rig.state()
    assert final == expected_state(table, small_chunker, ("title", "body"), _relational_meta)
    assert sorted(letter.error.code for letter in letters) == sorted(code for code, _, _ in bad)
    assert all(letter.error.message and letter.source_topic == rig.topic for letter in letters)
    assert {letter.raw_bytes() for letter in letters} == {v if isinstance(v, bytes) else raw(v) for _, _, v in bad}
