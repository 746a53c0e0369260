"""Re-embed only what changed, through the real connector (issue #36): status flips rewrite payloads with no
forward pass, a one-sentence edit of a 20 KB row re-embeds the chunks around it, a full rewrite re-embeds the
new text and drops the stale chunks; interleaved status and text changes of one row keep their order. After
every mix the collection equals the table: text, metadata, no stale chunk."""

from __future__ import annotations

import pytest
from cdc_pipeline import Rig, expected_state
from conftest import read_dead_letters

from embedstream.corpus import edit_sentence, stdlib_paragraphs
from embedstream.corpus import long_text as long_body
from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig

CONFIG = CdcConfig("id", ("title", "body"), ("status",))
DDL = "CREATE TABLE {t} (id int PRIMARY KEY, title text, body text, status text)"


@pytest.fixture
def chunker(minilm_engine) -> Chunker:
    """The production default: 200-token chunks overlapping by 32."""
    return Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=200, overlap_tokens=32)


def _state_of(table, chunker):
    def expected() -> dict:
        rows = {str(r["id"]): r for r in table.rows()}
        return expected_state(rows, chunker, CONFIG.text_fields, lambda r: {
            "status": r["status"], "cdc_source": f"embedstream.public.{table.name}"})
    return expected


def _text(row: dict) -> str:
    return "\n\n".join(v for v in (row["title"], row["body"]) if v and v.strip())


def _new_texts(chunker: Chunker, old: str, new: str) -> int:
    """Chunks of ``new`` whose text no chunk of ``old`` had: what a change must embed, and all it may."""
    before = set(chunker.chunk(old))
    return sum(1 for chunk in chunker.chunk(new) if chunk not in before)


@pytest.mark.timeout(600)
def test_each_change_mix_costs_only_what_changed_and_ends_as_the_table(kafka_bootstrap, cdc_table, minilm_engine,
                                                                       chunker):
    rows = [(i, f"Guide {i}", long_body(i), "draft") for i in (1, 2, 3)] + \
           [(i, f"Note {i}", stdlib_paragraphs()[i], "draft") for i in (4, 5)]
    table = cdc_table(DDL, before_connector=[])
    for row in rows:
        table.sql("INSERT INTO {t} VALUES (%s, %s, %s, %s)", row)
    expected = _state_of(table, chunker)
    rig = Rig(kafka_bootstrap, minilm_engine, "incr", CONFIG, chunker, topic=table.topic,
              meta_keys=("status", "cdc_source"), partitions=1)
    metrics = rig.worker.metrics
    with rig:
        assert rig.reaches(expected()) == expected()
        chunks = len(expected())
        assert chunks >= 3 * 30 and sum(rig.engine.take().values()) == chunks

        # 1. status flips: two rounds over every row, no forward pass; the payloads follow
        for status in ("review", "published"):
            table.sql("UPDATE {t} SET status = %s", (status,))
        assert rig.reaches(expected()) == expected()
        assert not rig.engine.take(), "a status flip needs no forward pass"
        avoided = sum(metrics.forward_passes_avoided.labels(lane="online", reason=r)._value.get()
                      for r in ("metadata", "moved"))
        assert avoided >= chunks and metrics.payload_updates.labels(lane="online")._value.get() >= chunks

        # 2. one-sentence edits in the middle of the 20 KB rows, one change at a time
        forwarded, shifted = [], False
        for seed in range(6):
            doc = 1 + seed % 3
            (row,) = [r for r in table.rows() if r["id"] == doc]
            body = edit_sentence(row["body"], seed)
            old, new = _text(row), _text({**row, "body": body})
            shifted |= len(chunker.chunk(old)) != len(chunker.chunk(new))
            table.sql("UPDATE {t} SET body = %s WHERE id = %s", (body, doc))
            assert rig.reaches(expected()) == expected()
            taken = rig.engine.take()
            assert {key.split("/")[0] for key in taken} <= {str(doc)}
            must = _new_texts(chunker, old, new)
            # a change's chunk events split over two batches may embed one more (the first batch overwrote it)
            assert must <= sum(taken.values()) <= must + 1, (seed, must, taken)
            forwarded.append(sum(taken.values()))
        assert shifted, "precondition: some edit changed the chunk count, so later chunks moved to other ids"
        assert sum(forwarded) / len(forwarded) <= 3, forwarded  # issue #36: <= 3 chunks re-embedded per edit

        # 3. full rewrites: a 20 KB row becomes a short note (its stale chunks go), a note becomes a long text
        (long_row,) = [r for r in table.rows() if r["id"] == 1]
        (short_row,) = [r for r in table.rows() if r["id"] == 4]
        table.sql("UPDATE {t} SET body = %s, status = 'rewritten' WHERE id = 1", (stdlib_paragraphs()[10],))
        table.sql("UPDATE {t} SET body = %s WHERE id = 4", (long_body(40),))
        final = rig.reaches(expected())
        taken = rig.engine.take()
        (long_now,) = [r for r in table.rows() if r["id"] == 1]
        (short_now,) = [r for r in table.rows() if r["id"] == 4]
        assert sum(taken.values()) == _new_texts(chunker, _text(long_row), _text(long_now)) + \
            _new_texts(chunker, _text(short_row), _text(short_now))
    assert final == expected()
    assert len([p for p in final.values() if p[0] == "1"]) == len(chunker.chunk(_text(long_now))) <= 2
    assert not read_dead_letters(rig.settings, 1, timeout_s=2)


@pytest.mark.timeout(600)
def test_interleaved_status_and_text_changes_of_one_row_keep_their_order(kafka_bootstrap, cdc_table, minilm_engine,
                                                                          chunker):
    """A payload write never lands over a later text change of its points, nor an upsert over a later payload
    write: status flips and sentence edits of one 20 KB row, committed back to back (many in one batch, some
    both in one UPDATE), end with the row's last text and last status on every chunk."""
    table = cdc_table(DDL)
    table.sql("INSERT INTO {t} VALUES (1, 'Guide', %s, 'draft'), (2, 'Note', 'A short note.', 'draft')",
              (long_body(7),))
    expected = _state_of(table, chunker)
    rig = Rig(kafka_bootstrap, minilm_engine, "order", CONFIG, chunker, topic=table.topic,
              meta_keys=("status", "cdc_source"), partitions=1)
    with rig:
        assert rig.reaches(expected()) == expected()
        body = long_body(7)
        for step in range(18):
            if step % 3 == 0:
                table.sql("UPDATE {t} SET status = %s WHERE id = 1", (f"status-{step}",))
            elif step % 3 == 1:
                body = edit_sentence(body, step)
                table.sql("UPDATE {t} SET body = %s WHERE id = 1", (body,))
            else:
                body = edit_sentence(body, step)
                table.sql("UPDATE {t} SET body = %s, status = %s WHERE id = 1", (body, f"both-{step}"))
        table.sql("UPDATE {t} SET status = 'last' WHERE id = 1")
        final = rig.reaches(expected())
    assert final == expected()
    statuses = {meta["status"] for doc, _, _, meta in final.values() if doc == "1"}
    assert statuses == {"last"}
    assert not read_dead_letters(rig.settings, 1, timeout_s=2)
