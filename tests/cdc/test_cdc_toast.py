"""Unchanged TOASTed values through the real connector: PostgreSQL keeps a long value out of line and does not
log it again when an UPDATE leaves it alone, so Debezium sends its placeholder instead. The index and the
documents log must keep the real value, also after a bridge restart."""

from __future__ import annotations

import random

import pytest
from cdc_pipeline import Rig, expected_state, latest_documents
from kafka import KafkaConsumer, TopicPartition

from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig

CONFIG = CdcConfig("id", ("title", "body"), ("status", "summary"))
DDL = "CREATE TABLE {t} (id int PRIMARY KEY, title text, body text, status text, summary text)"


def words(seed: int, chars: int) -> str:
    """Text that pglz cannot shrink below the TOAST threshold: random made-up words."""
    rnd = random.Random(seed)
    vocab = ["".join(rnd.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rnd.randint(3, 9))) for _ in range(3000)]
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < chars:
        out.append(rnd.choice(vocab))
    return " ".join(out)


@pytest.fixture
def chunker(minilm_engine) -> Chunker:
    return Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=200, overlap_tokens=0)


def table_state(table, chunker) -> dict:
    """What the collection must hold: the table as PostgreSQL has it now."""
    rows = {str(r["id"]): r for r in table.rows()}
    source = f"embedstream.public.{table.name}"
    return expected_state(rows, chunker, ("title", "body"),
                          lambda r: {"status": r["status"], "summary": r["summary"], "cdc_source": source})


def placeholders(topic: str, bootstrap: str, marker: str) -> int:
    """How many change events on the topic carry ``marker`` (precondition: Debezium did send it)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
    tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(tps)
    consumer.seek_to_beginning()
    ends, found = consumer.end_offsets(tps), 0
    while any(consumer.position(tp) < ends[tp] for tp in tps):
        for records in consumer.poll(timeout_ms=200).values():
            found += sum(1 for r in records if r.value and marker.encode() in r.value)
    consumer.close()
    return found


@pytest.mark.timeout(420)
@pytest.mark.parametrize("placeholder", [None, "__toasted__"], ids=["default-placeholder", "configured-placeholder"])
def test_unchanged_toasted_values_are_kept(kafka_bootstrap, cdc_table, minilm_engine, chunker, placeholder):
    extra = {"unavailable.value.placeholder": placeholder} if placeholder else None
    config = CdcConfig(CONFIG.id_field, CONFIG.text_fields, CONFIG.metadata_fields,
                       unavailable_placeholder=placeholder or CdcConfig.unavailable_placeholder)
    table = cdc_table(DDL, extra=extra)
    rig = Rig(kafka_bootstrap, minilm_engine, "toast", config, chunker, topic=table.topic,
              meta_keys=("status", "summary", "cdc_source"), partitions=1)
    with rig:
        table.sql("INSERT INTO {t} VALUES (1, 'Long guide', %s, 'draft', %s), (2, 'Short note', 'tiny body', "
                  "'draft', 'short')", (words(1, 20_000), words(2, 6_000)))
        assert rig.reaches(table_state(table, chunker)) == table_state(table, chunker)
        # status only; then the title (body and summary unchanged: both stay out of line, unlogged)
        table.sql("UPDATE {t} SET status = 'published' WHERE id = 1")
        table.sql("UPDATE {t} SET title = 'Long guide, revised' WHERE id = 1")
        table.sql("UPDATE {t} SET status = 'published' WHERE id = 2")
        assert rig.reaches(table_state(table, chunker)) == table_state(table, chunker)
        assert placeholders(table.topic, kafka_bootstrap, placeholder or "__debezium_unavailable_value") >= 2
        # a new bridge (nothing in memory) still recovers the values from the documents log
        rig.bridge.stop()
        rig.threads[1].join(60)
        rig.bridge = rig.new_bridge()
        rig.threads[1] = __import__("threading").Thread(target=rig.bridge.run, daemon=True)
        rig.threads[1].start()
        table.sql("UPDATE {t} SET status = 'archived' WHERE id = 1")
        assert rig.reaches(table_state(table, chunker)) == table_state(table, chunker)
        # a primary-key change: Debezium sends a delete of the old key and a create of the new one, whose
        # unchanged TOASTed values are placeholders too; they come from the old key's record
        table.sql("UPDATE {t} SET id = 3 WHERE id = 1")
        final = rig.reaches(table_state(table, chunker))
    assert final == table_state(table, chunker)
    (row,) = [r for r in table.rows() if r["id"] == 3]
    documents = latest_documents(rig.settings)
    assert documents["1"] is None
    assert documents["3"]["text"] == f"{row['title']}\n\n{row['body']}"
    assert documents["3"]["metadata"]["summary"] == row["summary"]
    assert "unavailable" not in str(documents) and "__toasted__" not in str(documents)
