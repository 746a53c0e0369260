"""Pre-tokenized chunk events through a real worker: ids used as sent, bad ids dead-lettered with the
reason, the good events around them indexed; and `bench host` runs end to end at smoke size."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import isolated_settings, memory_store, read_dead_letters, wait_for
from kafka import KafkaProducer

from embedstream.corpus import documents
from embedstream.engine.engine import EmbedRequest
from embedstream.producers.chunker import Chunker
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode
from embedstream.schemas.token_ids import encode_token_ids
from embedstream.workers.sink import point_id

from worker_rig import RunningWorker

pytestmark = pytest.mark.kafka


def _event(doc_id: str, text: str, ids, fingerprint: str, dtype: str = "int32") -> bytes:
    return encode(ChunkEvent(doc_id=doc_id, chunk_id=0, text=text, token_ids=encode_token_ids(ids, dtype),
                             token_dtype=dtype, tokenizer=fingerprint))


def test_bad_token_ids_are_dead_lettered_and_the_good_events_around_them_indexed(kafka_bootstrap, minilm_engine):
    settings = isolated_settings(kafka_bootstrap, "pretok")
    ensure_topics(settings.kafka, partitions=2)
    store = memory_store()
    fp = minilm_engine.document_fingerprint
    chunker = Chunker.for_model(minilm_engine.spec, chunk_tokens=80, overlap_tokens=0)
    texts = [c for d in documents(6, seed=9) for c in chunker.chunk(d["text"])][:24]
    good = {f"ids-{i}": encode(ChunkEvent(doc_id=f"ids-{i}", chunk_id=0, text=t, token_ids=ids,
                                          token_dtype=chunker.ids.dtype, tokenizer=chunker.ids.fingerprint))
            for i, (t, ids) in enumerate(zip(texts, chunker.token_ids_many(texts)))}
    good["text-only"] = encode(ChunkEvent(doc_id="text-only", chunk_id=0, text=texts[0]))
    good["foreign-with-text"] = _event("foreign-with-text", texts[1], [101, 1, 102], "0" * 32)  # tokenized from text
    limit, vocab = minilm_engine.spec.max_tokens, minilm_engine.tokenizer.vocab_size
    bad = {
        "token_id_out_of_range": _event("b1", "", [101, vocab + 5, 102], fp),
        "too_long": _event("b2", "", [101] + [2088] * limit + [102], fp),
        "tokenizer_mismatch": _event("b3", "", [101, 2088, 102], "f" * 32),
        "invalid_event": json.dumps({"doc_id": "b4", "chunk_id": 0, "text": "t", "token_ids": "ZQ==",  # one byte
                                     "token_dtype": "uint16", "tokenizer": fp}).encode(),
    }
    values = list(good.values())
    for i, raw in enumerate(bad.values()):  # interleave the bad ones between good events
        values.insert(5 * i + 3, raw)
    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
    for value in values:
        producer.send(settings.kafka.topic_chunks_bulk, key=b"k", value=value)
    producer.flush()
    collection = settings.qdrant.collection
    with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)) as worker:
        wait_for(lambda: store.collection_exists(collection) and store.count(collection) == len(good), 120,
                 "good events indexed")
        letters = read_dead_letters(settings, len(bad))
        wait_for(lambda: worker.lanes["bulk"].offsets.outstanding() == 0, 30, "all records finished")
    assert sorted(letter.error.code for letter in letters) == sorted(bad)
    assert {letter.raw_bytes() for letter in letters} == set(bad.values())
    by_code = {letter.error.code: letter.error.message for letter in letters}
    assert str(limit) in by_code["too_long"] and "vocabulary" in by_code["token_id_out_of_range"]
    assert "whole number" in by_code["invalid_event"]
    points = {p.id: p for p in store.scroll(collection, with_vectors=True)}
    reference, _ = minilm_engine.embed([EmbedRequest(0, texts[0], prompt="document")])
    stored = np.asarray(points[point_id("ids-0", 0)].vectors["full"], dtype=np.float32)
    assert float(np.dot(stored / np.linalg.norm(stored), reference[0].full)) >= 0.9999  # the text path's vector


def test_the_produce_path_sends_ids_by_default(kafka_bootstrap, minilm_engine):
    """A model chunker makes the publisher attach ids + fingerprint; a worker then skips tokenizing them."""
    settings = isolated_settings(kafka_bootstrap, "pretok-pub")
    ensure_topics(settings.kafka, partitions=1)
    chunker = Chunker.for_model(minilm_engine.spec, chunk_tokens=64, overlap_tokens=8)
    store = memory_store()
    docs = documents(4, seed=3)
    with ChunkPublisher(settings.kafka, lane="bulk") as pub:
        total = pub.publish_documents(docs, chunker)
    prepared = []
    original = minilm_engine.tokenizer.encode_many

    def counting(texts, truncate):  # the worker's engine must not be asked to tokenize any chunk
        prepared.extend(texts)
        return original(texts, truncate)

    minilm_engine.tokenizer.encode_many = counting
    try:
        with RunningWorker(settings, minilm_engine, store, lanes=("bulk",)):
            wait_for(lambda: store.collection_exists(settings.qdrant.collection)
                     and store.count(settings.qdrant.collection) == total, 120, f"{total} chunks indexed")
    finally:
        del minilm_engine.tokenizer.encode_many
    assert total > 4 and prepared == []


def test_bench_host_smoke(kafka_bootstrap):
    from embedstream.bench import host_bench

    out = host_bench.run(chunks=300, processes=(1,), models=("tiny",), bootstrap=kafka_bootstrap, timeout_s=300)
    rows = {(r.path, r.events): r for r in out["rows"]}
    assert set(rows) == {(p, e) for p in ("engine alone", "end to end") for e in ("text", "ids")} | {
        (host_bench.PADDED_PATH, "text")}
    for row in rows.values():
        assert 0 < row.chunks <= 300 and row.chunks_per_s > 0 and row.tokens > row.chunks
    assert rows[("end to end", "ids")].rss_peak_mb > 0
    assert host_bench.summary(out)  # the target lines render from the rows
