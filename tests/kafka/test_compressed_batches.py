"""What third-party producers put in a log, read by every consumer the workers run: record batches
compressed with each codec Kafka defines, and transactions (aborted ones skipped, markers committed past).

A producer picks its compression (librdkafka, the Java client and Debezium's Connect workers often use
lz4, zstd or snappy); the worker must read them all. Found necessary: with kafka-python and no lz4
package installed, the first lz4 batch stopped the bulk worker (``UnsupportedCodecError``).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from conftest import isolated_settings, make_engine, memory_store, read_dead_letters, wait_for
from fault_rig import _committed, _committed_to_the_end
from worker_rig import RunningWorker

from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent
from embedstream.schemas.codec import encode

pytestmark = pytest.mark.kafka

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
PER_CODEC = 6


def publish_compressed(settings, topic: str, batches: dict[str, list[bytes]]) -> None:
    """Each codec's values as their own compressed batches (one producer per codec, lingering to batch)."""
    for codec, values in batches.items():
        producer = Producer(settings.kafka.librdkafka_config(**{"compression.type": codec, "linger.ms": 50, "acks": "all"}))
        failed: list = []
        for i, value in enumerate(values):
            producer.produce(topic, key=f"{codec}-{i % 2}".encode(), value=value,
                             on_delivery=lambda err, _msg: err is not None and failed.append(err))
        assert producer.flush(30) == 0 and not failed, f"{codec}: {failed}"


@pytest.mark.parametrize("client", ["kafka-python", "librdkafka"])
def test_the_bulk_lane_indexes_batches_in_every_codec(kafka_bootstrap, tiny_bert_dir, client):
    settings = isolated_settings(kafka_bootstrap, f"codec{client[:5]}")
    settings.kafka.bulk_client = client
    ensure_topics(settings.kafka, partitions=2)
    topic = settings.kafka.topic_chunks_bulk
    batches = {codec: [encode(ChunkEvent(doc_id=f"{codec}-{i}", chunk_id=0, text=f"a {codec} chunk number {i}"))
                       for i in range(PER_CODEC)] for codec in CODECS}
    publish_compressed(settings, topic, batches)
    store = memory_store()
    total = len(CODECS) * PER_CODEC
    with RunningWorker(settings, make_engine(tiny_bert_dir), store, lanes=("bulk",)) as worker:
        count = lambda: store.count("docs") if store.collection_exists("docs") else 0  # noqa: E731
        wait_for(lambda: count() == total, 90, f"all {total} chunks indexed")
        wait_for(lambda: _committed(settings, topic, settings.kafka.group_bulk) == total, 60, "offsets committed")
        assert worker.failure is None
    assert {p.payload["doc_id"] for p in store.scroll("docs")} == {f"{c}-{i}" for c in CODECS for i in range(PER_CODEC)}
    assert not read_dead_letters(settings, 1, timeout_s=2)


@pytest.mark.parametrize("client", ["kafka-python", "librdkafka"])
def test_the_bulk_lane_skips_aborted_transactions(kafka_bootstrap, tiny_bert_dir, client):
    """A transactional producer's aborted chunks are never indexed; its committed ones are (read_committed,
    as the online lanes and the CDC bridge read). Its commit markers take offsets, so the group commits
    to the log end although fewer records than offsets reach the worker."""
    settings = isolated_settings(kafka_bootstrap, f"txn{client[:5]}")
    settings.kafka.bulk_client = client
    ensure_topics(settings.kafka, partitions=1)
    topic = settings.kafka.topic_chunks_bulk
    producer = Producer(settings.kafka.librdkafka_config(**{"transactional.id": f"txn-{topic}", "acks": "all"}))
    producer.init_transactions(30)
    for outcome in ("aborted", "committed", "aborted-again", "committed-again"):
        producer.begin_transaction()
        for i in range(3):
            producer.produce(topic, key=b"k", value=encode(ChunkEvent(doc_id=f"{outcome}-{i}", chunk_id=0,
                                                                      text=f"an {outcome} chunk {i}")))
        producer.flush(30)
        (producer.abort_transaction if outcome.startswith("aborted") else producer.commit_transaction)(30)
    store = memory_store()
    with RunningWorker(settings, make_engine(tiny_bert_dir), store, lanes=("bulk",)) as worker:
        count = lambda: store.count("docs") if store.collection_exists("docs") else 0  # noqa: E731
        wait_for(lambda: count() >= 6, 60, "the committed chunks indexed")
        _committed_to_the_end(settings, topic, settings.kafka.group_bulk)
        assert worker.failure is None
    assert {p.payload["doc_id"] for p in store.scroll("docs")} == {
        f"{outcome}-{i}" for outcome in ("committed", "committed-again") for i in range(3)}

