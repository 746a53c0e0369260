"""CDC bridge on the real broker with change events the real connector cannot be made to send here (MongoDB,
malformed records, a broker refusing a change); the PostgreSQL connector's own records are tested in tests/cdc/."""

from __future__ import annotations

import base64
import json
import random
from collections import Counter

import pytest
from cdc_pipeline import Rig, expected_state, paragraph_chunker
from cdc_pipeline import body as _body
from conftest import read_dead_letters
from kafka.errors import MessageSizeTooLargeError

from embedstream.producers.chunker import Chunker
from cdc_events import CONFIG, MONGO, MONGO_SOURCE, OID, SOURCE, envelope, key, raw, row


@pytest.fixture
def small_chunker(minilm_engine) -> Chunker:
    return paragraph_chunker(minilm_engine)


def _relational_meta(fields: dict) -> dict:
    return {"lang": fields["lang"], "cdc_source": "shop.public.articles"}


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


class RefusingPublisher:
    """The bridge's real publisher, except that the broker refuses one document's records as too large."""

    def __init__(self, publisher, refused_doc: str):
        self.publisher, self.refused_doc = publisher, refused_doc
        self.refusals = 0

    def publish_chunks(self, document, chunks, **kwargs):
        if document.doc_id == self.refused_doc:
            self.refusals += 1
            raise MessageSizeTooLargeError(f"document {document.doc_id} is larger than the broker accepts")
        return self.publisher.publish_chunks(document, chunks, **kwargs)

    def __getattr__(self, name):
        return getattr(self.publisher, name)


def _one_refused_between_good_ones(rig, table: dict, refused: tuple, chunker):
    """Send the first good change, the refused one, the second good one; the bridge goes on: the table is
    indexed exactly and one dead letter is written, which is returned."""
    (first, second), (refused_id, refused_value) = sorted(table), refused
    with rig:
        rig.send(key(int(first)), envelope("c", after=table[first]))
        rig.send(key(refused_id), refused_value)
        rig.send(key(int(second)), envelope("c", after=table[second]))
        rig.settle()
        (letter,) = read_dead_letters(rig.settings, 1)
        final = rig.state()
        assert rig.bridge.failure is None
    assert final == expected_state(table, chunker, ("title", "body"), _relational_meta)
    return letter


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_cdc_change_the_chunk_lane_refuses_is_dead_lettered_and_the_bridge_carries_on(kafka_bootstrap, minilm_engine,
                                                                                      small_chunker):
    """A permanent publish failure (non-retriable Kafka error) costs one change, not the bridge."""
    rig = Rig(kafka_bootstrap, minilm_engine, "cdcrefused", CONFIG, small_chunker)
    table = {str(i): row(i, f"Good {i}", _body(i, 2)) for i in (30, 31)}
    refused = envelope("c", after=row(32, "Too large", _body(32, 2)))
    rig.bridge.publisher = RefusingPublisher(rig.bridge.publisher, refused_doc="32")
    letter = _one_refused_between_good_ones(rig, table, (32, refused), small_chunker)
    assert letter.error.code == "write_rejected" and "MessageSizeTooLargeError" in letter.error.message
    assert letter.raw_bytes() == raw(refused) and letter.source_topic == rig.topic


@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_a_change_the_broker_refuses_costs_that_change_only(kafka_bootstrap, minilm_engine, small_chunker):
    """The broker itself refuses one change's chunks (over the chunk topic's max.message.bytes): that change is
    dead-lettered, and the bridge's producer still publishes the changes after it."""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    rig = Rig(kafka_bootstrap, minilm_engine, "cdcbroker", CONFIG, small_chunker)
    admin = KafkaAdminClient(**rig.settings.kafka.client_kwargs())
    admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, rig.settings.kafka.topic_chunks_online,
                                        configs={"max.message.bytes": str(32 * 1024)})])
    admin.close()
    table = {str(i): row(i, f"Good {i}", _body(i, 2)) for i in (40, 41)}
    noise = base64.b64encode(random.Random(42).randbytes(45_000)).decode()  # 60,000 characters lz4 cannot shrink
    refused = envelope("c", after=row(42, "Huge metadata", _body(42, 1), lang=noise))
    letter = _one_refused_between_good_ones(rig, table, (42, refused), small_chunker)
    assert letter.error.code == "write_rejected" and "MessageSizeTooLarge" in letter.error.message
    assert letter.raw_bytes() == raw(refused)
