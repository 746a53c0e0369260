"""Every record shape a production Debezium sends, through the real connector: the envelope with and without
schemas, the flattened record of ExtractNewRecordState (Debezium 3.x: rewrite-with-tombstone, add.fields=op),
REPLICA IDENTITY FULL; snapshot reads, inserts, updates, deletes, a primary-key change; heartbeats and
transaction metadata on the same topic (skipped with a metric); decimals and timestamps in metadata.
The collection must end equal to the table."""

from __future__ import annotations

import datetime

import pytest
from cdc_pipeline import Rig, expected_state, latest_documents
from conftest import read_dead_letters

from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig

CONFIG = CdcConfig("id", ("title", "body"), ("status", "price", "published"))
DDL = ("CREATE TABLE {t} (id int PRIMARY KEY, title text, body text, status text, price numeric(10,2), "
       "published timestamp)")
SHAPES = {
    "envelope": dict(),
    "envelope-schemas": dict(schemas=True),
    "flattened": dict(flatten=True),
    "flattened-schemas": dict(flatten=True, schemas=True),
    "replica-identity-full": dict(full=True),
}


@pytest.fixture
def chunker(minilm_engine) -> Chunker:
    return Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=64, overlap_tokens=0)


def _micros(moment: datetime.datetime) -> int:
    return round((moment - datetime.datetime(1970, 1, 1)).total_seconds() * 1_000_000)


def table_state(table, chunker, schemas: bool, flatten: bool) -> dict:
    """The table as PostgreSQL has it, as the collection must hold it. Decimals: with schemas the number
    (Debezium's precise bytes decoded by their scale), without them the string (decimal.handling.mode=string);
    timestamps: ISO-8601 with schemas, epoch microseconds (as sent) without."""
    rows = {str(r["id"]): r for r in table.rows()}
    source = None if flatten else f"embedstream.public.{table.name}"

    def meta(r):
        out = {"status": r["status"],
               "price": None if r["price"] is None else (float(r["price"]) if schemas else str(r["price"])),
               "published": None if r["published"] is None else (
                   r["published"].isoformat() if schemas else _micros(r["published"]))}
        return out | ({"cdc_source": source} if source else {})

    return expected_state(rows, chunker, ("title", "body"), meta)


def _para(n: int, word: str) -> str:
    return f"Row {n} explains {word} in plain words: what it reads, what it raises, which options change it."


@pytest.mark.timeout(600)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_ends_as_the_table(kafka_bootstrap, cdc_table, minilm_engine, chunker, shape):
    opts = SHAPES[shape]
    schemas, flatten = opts.get("schemas", False), opts.get("flatten", False)
    extra = {"heartbeat.interval.ms": "300", "provide.transaction.metadata": "true",
             # heartbeats and transaction records onto the table's own topic, as a shared topic would carry them
             "transforms": ("unwrap," if flatten else "") + "route",
             "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
             "transforms.route.regex": ".*"}
    if not schemas:
        extra["decimal.handling.mode"] = "string"
    before = [f"INSERT INTO {{t}} VALUES ({i}, 'Guide {i}', '{_para(i, 'csv')}', 'draft', {i}.25, "
              f"'2026-01-0{i} 10:30:00.123456')" for i in (1, 2)]
    if opts.get("full"):
        before.append("ALTER TABLE {t} REPLICA IDENTITY FULL")
    table = cdc_table(DDL, flatten=flatten, schemas=schemas, before_connector=before,
                      extra=extra | {"transforms.route.replacement": "{topic}"})
    rig = Rig(kafka_bootstrap, minilm_engine, "shape", CONFIG, chunker, topic=table.topic,
              meta_keys=("status", "price", "published", "cdc_source"), partitions=1)
    with rig:
        assert rig.reaches(table_state(table, chunker, schemas, flatten)) == table_state(table, chunker, schemas,
                                                                                            flatten)
        table.sql(f"INSERT INTO {{t}} VALUES (3, 'Guide 3', '{_para(3, 'json')}', 'draft', 99999999.99, NULL)")
        table.sql(f"UPDATE {{t}} SET body = '{_para(2, 'pathlib')}' WHERE id = 2")
        table.sql("UPDATE {t} SET status = 'published', price = 0.10 WHERE id = 1")
        table.sql("DELETE FROM {t} WHERE id = 2")
        table.sql("UPDATE {t} SET id = 4 WHERE id = 3")  # a primary-key change: delete + create
        final = rig.reaches(table_state(table, chunker, schemas, flatten))
        skipped = {kind: rig.bridge.metrics.skipped.labels(kind=kind)._value.get() for kind in ("heartbeat", "transaction")}
    assert final == table_state(table, chunker, schemas, flatten)
    assert {doc for doc, _, _, _ in final.values()} == {"1", "4"}
    assert not read_dead_letters(rig.settings, 1, timeout_s=2)
    assert skipped["heartbeat"] > 0 and skipped["transaction"] > 0, skipped
    documents = latest_documents(rig.settings)
    assert documents["2"] is None and documents["3"] is None and documents["4"]["text"].startswith("Guide 3")


@pytest.mark.timeout(300)
def test_a_truncate_through_the_real_connector_is_dead_lettered(kafka_bootstrap, cdc_table, minilm_engine, chunker):
    """Debezium sends truncates when skipped.operations lets it; the bridge cannot tell which documents the
    table held, so the truncate is dead-lettered with its reason and the rows around it are applied."""
    table = cdc_table(DDL, extra={"skipped.operations": "none"})
    rig = Rig(kafka_bootstrap, minilm_engine, "trunc", CONFIG, chunker, topic=table.topic, partitions=1,
              meta_keys=("status",))
    with rig:
        table.sql(f"INSERT INTO {{t}} VALUES (1, 'Guide 1', '{_para(1, 'csv')}', 'draft', 1, NULL)")
        table.sql("TRUNCATE {t}")
        table.sql(f"INSERT INTO {{t}} VALUES (2, 'Guide 2', '{_para(2, 'json')}', 'draft', 2, NULL)")
        rows = {"1": {"title": "Guide 1", "body": _para(1, "csv"), "status": "draft"}, **{
            str(r["id"]): r for r in table.rows()}}
        final = rig.reaches(expected_state(rows, chunker, ("title", "body"), lambda r: {"status": r["status"]}))
        (letter,) = read_dead_letters(rig.settings, 1)
    assert {doc for doc, _, _, _ in final.values()} == {"1", "2"}  # the truncate changed nothing
    assert letter.error.code == "truncate_refused" and table.name in letter.error.message


@pytest.mark.timeout(300)
def test_an_incremental_snapshot_fills_the_index(kafka_bootstrap, cdc_rig, cdc_table, minilm_engine, chunker):
    """A connector started without an initial snapshot, then asked for an incremental one through its signal
    table: the rows arrive as reads (source.snapshot "incremental"), interleaved with live changes."""
    signals = f"signals_{id(chunker) % 100000}"
    table = cdc_table(DDL, before_connector=[
        *(f"INSERT INTO {{t}} VALUES ({i}, 'Guide {i}', '{_para(i, 'csv')}', 'draft', {i}, NULL)" for i in (1, 2, 3)),
        f"CREATE TABLE IF NOT EXISTS {signals} (id varchar(42) PRIMARY KEY, type varchar(32), data text)"],
        extra={"snapshot.mode": "no_data", "signal.enabled.channels": "source",
               "signal.data.collection": f"public.{signals}",
               "incremental.snapshot.chunk.size": "2"}, include=[f"public.{signals}"])
    rig = Rig(kafka_bootstrap, minilm_engine, "incr", CONFIG, chunker, topic=table.topic, partitions=1,
              meta_keys=("status",))

    def expected():
        rows = {str(r["id"]): r for r in table.rows()}
        return expected_state(rows, chunker, ("title", "body"), lambda r: {"status": r["status"]})

    with rig:
        table.sql(f"INSERT INTO {{t}} VALUES (4, 'Guide 4', '{_para(4, 'json')}', 'draft', 4, NULL)")  # live
        table.sql(f"INSERT INTO {signals} VALUES ('snap-{table.name}', 'execute-snapshot', "
                  f"'{{\"data-collections\": [\"public.{table.name}\"], \"type\": \"incremental\"}}')")
        table.sql("UPDATE {t} SET status = 'published' WHERE id = 2")
        final = rig.reaches(expected())
    assert final == expected() and {doc for doc, _, _, _ in final.values()} == {"1", "2", "3", "4"}
    assert not read_dead_letters(rig.settings, 1, timeout_s=2)
