"""A table's life through the real connector: snapshot, insert, an edited paragraph, a shrink, a metadata-only
change, a redelivered change record, deletes. The collection ends as the table, each chunk is embedded once,
and an update re-embeds only what changed."""

from __future__ import annotations

from collections import Counter

import pytest
from cdc_pipeline import Rig, body, expected_state, latest_documents, paragraph_chunker
from conftest import read_dead_letters
from kafka import KafkaConsumer, TopicPartition

from embedstream.producers.debezium import CdcConfig

CONFIG = CdcConfig("id", ("title", "body"), ("lang",))
DDL = "CREATE TABLE {t} (id int PRIMARY KEY, title text, body text, lang text)"


def last_record(topic: str, bootstrap: str, key: bytes):
    """The topic's last record under ``key`` (to send it again: a redelivery)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=10)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning()
    end, found = consumer.end_offsets([tp])[tp], None
    while consumer.position(tp) < end:
        for records in consumer.poll(timeout_ms=200).values():
            found = next((r for r in reversed(records) if r.key == key and r.value), found)
    consumer.close()
    return found


@pytest.mark.timeout(420)
def test_a_tables_life_ends_as_the_table(kafka_bootstrap, cdc_table, minilm_engine):
    chunker = paragraph_chunker(minilm_engine)
    snapshot = [f"INSERT INTO {{t}} VALUES ({i}, 'Guide {i}', '{body(first, 4)}', 'en')" for i, first in
                ((1, 0), (2, 3), (3, 6))]
    table = cdc_table(DDL, before_connector=snapshot)
    rig = Rig(kafka_bootstrap, minilm_engine, "life", CONFIG, chunker, topic=table.topic, partitions=1,
              meta_keys=("lang", "cdc_source"))

    def expected():
        rows = {str(r["id"]): r for r in table.rows()}
        return expected_state(rows, chunker, ("title", "body"),
                              lambda r: {"lang": r["lang"], "cdc_source": f"embedstream.public.{table.name}"})

    with rig:
        table.sql(f"INSERT INTO {{t}} VALUES (4, 'Guide 4', '{body(1, 3)}', 'en')")
        assert rig.reaches(expected()) == expected()
        assert rig.engine.take() == Counter(f"{d}/{c}" for d, c, _, _ in expected().values())  # each chunk once

        old2, new2 = (chunker.chunk("Guide 2\n\n" + body(3, 4, edit)) for edit in (None, 2))
        changed = [i for i, (a, b) in enumerate(zip(old2, new2)) if a != b]
        assert len(old2) == len(new2) == 4 and len(changed) == 1  # precondition: one chunk differs
        table.sql(f"UPDATE {{t}} SET body = '{body(3, 4, edit=2)}' WHERE id = 2")
        table.sql(f"UPDATE {{t}} SET body = '{body(6, 2)}' WHERE id = 3")  # 4 paragraphs -> 2
        table.sql("UPDATE {t} SET lang = 'de' WHERE id = 4")  # same text, new metadata: the payload must follow
        assert rig.reaches(expected()) == expected()
        rig.send(*(lambda r: (r.key, r.value))(last_record(table.topic, kafka_bootstrap, b'{"id":2}')))  # redelivery
        rig.settle()
        assert rig.state() == expected()
        assert len([p for p in rig.state().values() if p[0] == "3"]) == 2
        assert rig.engine.take() == Counter([f"2/{changed[0]}"]), "only the edited chunk (the re-labelled document: none)"
        avoided = rig.worker.metrics.forward_passes_avoided
        relabelled = len(chunker.chunk("Guide 4\n\n" + body(1, 3)))
        assert avoided.labels(lane="online", reason="unchanged")._value.get() == 3 + 2 + 4
        assert avoided.labels(lane="online", reason="metadata")._value.get() == relabelled
        assert rig.worker.metrics.payload_updates.labels(lane="online")._value.get() == relabelled

        table.sql("DELETE FROM {t} WHERE id IN (1, 3)")
        final = rig.reaches(expected())
        assert not rig.engine.take()
    assert final == expected() and {doc for doc, _, _, _ in final.values()} == {"2", "4"}
    assert not read_dead_letters(rig.settings, 1, timeout_s=2)
    documents = latest_documents(rig.settings)
    assert {doc: (record or {}).get("text") for doc, record in documents.items()} == {
        "1": None, "3": None, **{str(r["id"]): f"{r['title']}\n\n{r['body']}" for r in table.rows()}}
    assert documents["4"]["metadata"] == {"lang": "de", "cdc_source": f"embedstream.public.{table.name}"}
