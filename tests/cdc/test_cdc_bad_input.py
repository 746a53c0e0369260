"""Bad input through the real connector, between good rows: a NULL text field, a row with no text at all, a
table without a primary key (no record key), a row without an id, a binary column named as a text field.
Each has a clear outcome (applied as the table says, or dead-lettered with a reason); the good rows are indexed."""

from __future__ import annotations

import pytest
from cdc_pipeline import Rig, expected_state, latest_documents
from conftest import read_dead_letters

from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig

# No primary key: Debezium's records have no key, the id comes from the row only. (PostgreSQL itself refuses
# UPDATE and DELETE on such a table once it is published without a replica identity, so inserts are all it sends.)
DDL = "CREATE TABLE {t} (id int, title text, body text, blob bytea)"


@pytest.fixture
def chunker(minilm_engine) -> Chunker:
    return Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=64, overlap_tokens=0)


@pytest.mark.timeout(600)
def test_bad_rows_get_a_clear_outcome_and_good_rows_are_indexed(kafka_bootstrap, cdc_table, minilm_engine, chunker):
    table = cdc_table(DDL, schemas=True)
    table.sql("INSERT INTO {t} VALUES (1, 'Good one', 'A good row about csv files.', NULL), "
              "(2, NULL, 'Only a body: the NULL title is left out.', NULL), "
              "(3, NULL, NULL, NULL), "  # no text at all: a document without chunks
              "(NULL, 'No id', 'Neither the row nor the key says which document.', NULL), "
              "(5, 'Binary', 'Has a blob.', '\\x89504e470d0a1a0a'::bytea), "
              "(6, 'Good two', 'Another good row about json.', NULL)")
    good = {str(r["id"]): r for r in table.rows() if r["id"] is not None}

    # text fields title, body: the NULL-id row is dead-lettered (missing_id), the rest indexed as the table says
    rig = Rig(kafka_bootstrap, minilm_engine, "bad", CdcConfig("id", ("title", "body")), chunker, topic=table.topic,
              partitions=1, meta_keys=())
    expected = expected_state(good, chunker, ("title", "body"), lambda r: {})
    with rig:
        final = rig.reaches(expected)
        letters = read_dead_letters(rig.settings, 1)
    assert final == expected
    assert [letter.error.code for letter in letters] == ["missing_id"]
    documents = latest_documents(rig.settings)
    assert documents["2"]["text"] == good["2"]["body"] and documents["3"]["text"] == ""

    # a binary column named as a text field: the rows with bytes in it are dead-lettered (non_text_field), not
    # indexed as base64; the rows around them are
    rig = Rig(kafka_bootstrap, minilm_engine, "bin", CdcConfig("id", ("title", "blob")), chunker, topic=table.topic,
              partitions=1, meta_keys=())
    without_blob = {k: r for k, r in good.items() if r["blob"] is None}
    expected = expected_state(without_blob, chunker, ("title",), lambda r: {})
    with rig:
        final = rig.reaches(expected)
        letters = read_dead_letters(rig.settings, 2)
    assert final == expected
    assert sorted(letter.error.code for letter in letters) == ["missing_id", "non_text_field"]
    assert "binary" in next(letter.error.message for letter in letters if letter.error.code == "non_text_field")
