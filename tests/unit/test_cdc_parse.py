"""CDC bridge, pure parts: Debezium envelope parsing, publish order, the unchanged-chunk check."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from embedstream.errors import CodedError
from embedstream.vectorstore import CollectionNotFound
from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import (CdcConfig, CdcError, Change, complete, from_extended_json, logical_value,
                                           parse_change, unwrap)
from embedstream.producers.topics import all_topics, ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.workers.cdc_bridge import CdcBridge, CdcOptions, apply_change, truncate_error
from embedstream.workers.embed_worker import WorkerOptions
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.sink import point_id
from cdc_events import CONFIG, MONGO, MONGO_SOURCE, OID, SOURCE, envelope, key, raw, row


@pytest.mark.parametrize("wrap", [False, True], ids=["plain", "schema-wrapper"])
def test_create_with_and_without_schema_wrapper(wrap):
    change = parse_change(raw(key(7, wrap=wrap)), raw(envelope("c", after=row(7, "Title", "Body"), wrap=wrap)), CONFIG)
    assert change == Change("c", "7", "Title\n\nBody", {"lang": "en", "cdc_source": "shop.public.articles"},
                            "shop.public.articles", fields={"title": "Title", "body": "Body"})
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
    ("invalid_id", raw(key(1)), raw(envelope("c", after=row("x" * 1025, "t", "b")))),  # over the doc_id bound
    ("invalid_id", raw(key("a\nb")), None),  # a tombstone whose key id holds a control character
    ("invalid_metadata", raw(key(1)), raw(envelope("c", after=row(1, "t", "b", lang={"a": {"b": {"c": {"d": 1}}}})))),
    ("invalid_metadata", raw(key(1)), raw(envelope("c", after=row(1, "t", "b", lang="x" * 70_000)))),
    ("non_text_field", raw(key(1)), raw(envelope("c", after=row(1, "t", 42)))),
    ("non_text_field", raw(key(1)), raw(envelope("r", after=row(1, {"nested": "x"}, "b")))),
]


@pytest.mark.parametrize("code,key_bytes,value", BAD, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(BAD)])
def test_bad_input_raises_a_typed_error(code, key_bytes, value):
    with pytest.raises(CdcError) as err:
        parse_change(key_bytes, value, CONFIG)
    assert err.value.code == code
    assert err.value.message and err.value.to_error_info().code == code
    assert isinstance(err.value, CodedError) and isinstance(err.value, ValueError) and str(err.value) == err.value.message


class RecordingPublisher:
    """What apply_change asks of a ChunkPublisher, in order."""

    def __init__(self):
        self.calls: list[tuple] = []

    def publish_chunks(self, document, chunks, trim=True, record=False, ids=None, fields=None):
        self.calls.append(("chunks", document.doc_id, document.text, document.metadata, list(chunks), trim, record))
        self.ids = ids
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
    marker = object()
    apply_change(pub, Change("c", "d4", "x"), ["x"], marker)
    assert pub.ids is marker  # the model chunker's ids travel to the publisher: chunks carry their token ids


def test_publisher_trims_and_records_for_the_bridge(kafka_free_publisher):
    """publish_chunks(record=True): documents-log record, chunks, then DocumentDelete(from_chunk=n)."""
    pub, sent = kafka_free_publisher
    from embedstream.producers.sources import Document

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
    import embedstream.producers.publisher as publisher_module
    from embedstream.config import KafkaSettings

    sent: list[tuple] = []

    class FakeProducer:
        def __init__(self, _config):
            pass

        def produce(self, topic, key=None, value=None, on_delivery=None):
            sent.append((topic, key, value))

        def poll(self, _timeout=0):
            return 0

    monkeypatch.setattr(publisher_module, "Producer", FakeProducer)
    settings = KafkaSettings(topic_chunks_online="lane", topic_documents="docs-log")
    return publisher_module.ChunkPublisher(settings, lane="online", create_topics=False), sent


def test_cdc_options_refuse_an_unknown_truncate_policy():
    with pytest.raises(ValueError):
        CdcOptions("t", CONFIG, on_truncate="delete")  # type: ignore[arg-type]


# -- what the real connector sends but cannot be made to send on demand (tests/cdc/ has the rest) -----
PLACEHOLDER = "__debezium_unavailable_value"
META = CdcConfig("id", ("title", "body"), ("lang", "summary"))


def test_unavailable_values_are_left_out_and_filled_in_from_the_previous_record():
    after = {"id": 1, "title": "New title", "body": PLACEHOLDER, "lang": "en", "summary": [PLACEHOLDER]}
    change = parse_change(raw(key(1)), raw(envelope("u", after=after)), META)
    assert change.unavailable == ("body", "summary") and change.text is None and "summary" not in change.metadata
    previous = {"text": "Old title\n\nThe body", "metadata": {"lang": "de", "summary": "kept"},
                "fields": {"title": "Old title", "body": "The body"}}
    done = complete(change, previous, META)
    assert done.text == "New title\n\nThe body" and done.fields == {"title": "New title", "body": "The body"}
    assert done.metadata == {"lang": "en", "summary": "kept", "cdc_source": "shop.public.articles"}
    assert not done.unavailable


def test_an_unavailable_value_nobody_recorded_is_refused_never_indexed():
    change = parse_change(raw(key(1)), raw(envelope("u", after={"id": 1, "title": "t", "body": PLACEHOLDER})), META)
    for previous in (None, {"text": "t\n\nb", "metadata": {}}):  # no record; a record without fields (2 text fields)
        with pytest.raises(CdcError) as err:
            complete(change, previous, META)
        assert err.value.code == "unavailable_value" and "body" in err.value.message
    one_field = CdcConfig("id", ("body",))
    change = parse_change(raw(key(1)), raw(envelope("u", after={"id": 1, "body": PLACEHOLDER})), one_field)
    assert complete(change, {"text": "the body", "metadata": {}}, one_field).text == "the body"


def test_binary_and_configured_placeholders_are_recognised():
    import base64

    config = CdcConfig("id", ("body",), unavailable_placeholder="__toasted__")
    for value in ("__toasted__", base64.b64encode(b"__toasted__").decode(), ["__toasted__"]):
        assert parse_change(raw(key(1)), raw(envelope("u", after={"id": 1, "body": value})), config).unavailable
    assert not parse_change(raw(key(1)), raw(envelope("u", after={"id": 1, "body": PLACEHOLDER})), config).unavailable


def test_flattened_records_without_op_and_bare_rows():
    update = parse_change(raw(key(3)), raw({"id": 3, "title": "t", "body": "b", "__deleted": "false"}), CONFIG)
    assert update.op == "u" and update.text == "t\n\nb"
    deleted = parse_change(raw(key(3)), raw({"id": 3, "title": None, "body": None, "__deleted": "true"}), CONFIG)
    assert deleted.op == "d" and deleted.doc_id == "3"
    with pytest.raises(CdcError) as err:  # ExtractNewRecordState without add.fields=op nor the delete rewrite
        parse_change(raw(key(3)), raw({"id": 3, "title": "t", "body": "b"}), CONFIG)
    assert err.value.code == "invalid_envelope" and "add.fields=op" in err.value.message


@pytest.mark.parametrize("value,kind", [
    ({"ts_ms": 1_700_000_000_000}, "heartbeat"),
    ({"status": "END", "id": "571:53195832", "event_count": 2, "data_collections": [], "ts_ms": 1}, "transaction"),
    ({"source": {"server": "shop"}, "databaseName": "shop", "ddl": "ALTER TABLE t ADD c int", "tableChanges": []},
     "schema_change"),  # MySQL / SQL Server schema history record: PostgreSQL's connector has none
])
def test_records_that_change_no_document_are_skipped(value, kind):
    change = parse_change(raw({"serverName": "shop"}), raw(value), CONFIG)
    assert change.op == kind and change.is_skipped and not change.is_upsert and not change.is_delete


def test_logical_types_with_a_schema():
    import base64

    decimal_schema = {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}
    assert logical_value(base64.b64encode((1234).to_bytes(2, "big", signed=True)).decode(), decimal_schema) == 12.34
    assert logical_value(base64.b64encode((-5).to_bytes(1, "big", signed=True)).decode(), decimal_schema) == -0.05
    big = 10**30 + 1
    assert logical_value(base64.b64encode(big.to_bytes(16, "big", signed=True)).decode(), decimal_schema) == \
        "10000000000000000000000000000.01"
    assert logical_value(1_767_263_400_123_456, {"type": "int64", "name": "io.debezium.time.MicroTimestamp"}) == \
        "2026-01-01T10:30:00.123456"
    assert logical_value(20454, {"type": "int32", "name": "io.debezium.time.Date"}) == "2026-01-01"
    assert logical_value("2026-01-01T10:30:00Z", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}) == \
        "2026-01-01T10:30:00Z"
    assert logical_value(7, None) == 7
