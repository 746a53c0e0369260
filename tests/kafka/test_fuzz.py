"""Fuzzing the embed worker on the real broker (issue #13): a bounded stream of 5,000 records, one in ten
generated bad, ends with every good chunk indexed exactly once, every good query answered, every bad
record dead-lettered with a reason (dead letters == bad records), the worker alive, and the committed
offsets at the end of every log. Deterministic: one seeded generator decides every record.
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import pytest
from conftest import isolated_settings, make_engine, memory_store, read_dead_letters, wait_for
from fault_rig import _committed
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from worker_rig import RunningWorker

from embedstream.producers.topics import ensure_topics
from embedstream.schemas import ChunkEvent, QueryRequest
from embedstream.schemas.codec import encode

pytestmark = pytest.mark.kafka

SEED = 20261203
RECORDS = 5_000
BAD_SHARE = 0.10
HUGE_BYTES = (1 << 20) + 4096  # over 1 MiB: the producer and the topics below take up to 8 MiB
MAX_MESSAGE = 8 << 20


class Stream:
    """The records of one run: (topic, value) in send order, and what each bad one is."""

    def __init__(self, settings, seed: int = SEED):
        self.rng = random.Random(seed)
        k = settings.kafka
        self.chunk_topics = (k.topic_chunks_bulk, k.topic_chunks_bulk, k.topic_chunks_online)
        self.queries, self.replies = k.topic_queries, k.topic_replies
        self.records: list[tuple[str, bytes]] = []
        self.bad: Counter = Counter()
        self.good_chunks: set[tuple[str, int]] = set()
        self.good_queries = 0

    # -- good records --------------------------------------------------------------------------
    def chunk(self, n: int) -> ChunkEvent:
        words = self.rng.choices(("file", "socket", "thread", "queue", "vector", "index", "parse", "open"), k=12)
        return ChunkEvent(doc_id=f"doc-{n}", chunk_id=self.rng.randrange(3), text=f"{n} " + " ".join(words),
                          metadata={"n": n, "lang": self.rng.choice(("en", "de"))})

    def query(self, n: int, reply_to: str | None = None) -> QueryRequest:
        return QueryRequest(request_id=f"q-{n}", text=f"query {n} about files", reply_to=reply_to or self.replies)

    def add_good(self, n: int) -> None:
        if self.rng.random() < 0.06:
            self.records.append((self.queries, encode(self.query(n))))
            self.good_queries += 1
            return
        event = self.chunk(n)
        self.good_chunks.add((event.doc_id, event.chunk_id))
        self.records.append((self.rng.choice(self.chunk_topics), encode(event)))

    # -- bad records (each generator returns topic, value) -------------------------------------
    def _chunk_json(self, n: int, **fields) -> bytes:
        body = json.loads(encode(self.chunk(n)))
        body.update(fields)
        return json.dumps(body).encode()

    def random_bytes(self, n):
        return self.rng.choice(self.chunk_topics + (self.queries,)), self.rng.randbytes(self.rng.randint(1, 300))

    def truncated_json(self, n):
        whole = encode(self.chunk(n)) if n % 2 else encode(self.query(n))
        topic = self.rng.choice(self.chunk_topics) if n % 2 else self.queries
        return topic, whole[: self.rng.randint(1, len(whole) - 1)]

    def wrong_types(self, n):
        field, value = self.rng.choice([("chunk_id", "seven"), ("text", ["a", "list"]), ("doc_id", {"an": "object"}),
                                        ("metadata", [1, 2]), ("chunk_id", 1.5), ("text", None)])
        return self.rng.choice(self.chunk_topics), self._chunk_json(n, **{field: value})

    def huge_field(self, n):
        if self.rng.random() < 0.25:  # over 1 MiB: refused before tokenizing (text_too_large or record too large)
            return self.rng.choice(self.chunk_topics), self._chunk_json(n, text="word " * (HUGE_BYTES // 5))
        field, value = self.rng.choice([("metadata", {"blob": "x" * 70_000}), ("doc_id", "d" * 5_000),
                                        ("metadata", {f"k{i}": i for i in range(300)})])
        return self.rng.choice(self.chunk_topics), self._chunk_json(n, **{field: value})

    def bad_name(self, n):
        field, value = self.rng.choice([("doc_id", "line\nbreak"), ("doc_id", ""), ("collection", "../etc"),
                                        ("collection", ".hidden"), ("model", "\x00model")])
        return self.rng.choice(self.chunk_topics), self._chunk_json(n, **{field: value})

    def id_out_of_bounds(self, n):
        return self.rng.choice(self.chunk_topics), self._chunk_json(n, chunk_id=self.rng.choice([-1, 2**64, 2**53]))

    def disallowed_collection(self, n):
        return self.rng.choice(self.chunk_topics), self._chunk_json(n, collection=f"attacker-made-{n}")

    def bad_reply_to(self, n):
        body = json.loads(encode(self.query(n)))
        body["reply_to"] = self.rng.choice(["__consumer_offsets", "someone-elses-topic", "bad topic!", "t" * 300, ""])
        return self.queries, json.dumps(body).encode()

    KINDS = ("random_bytes", "truncated_json", "wrong_types", "huge_field", "bad_name", "id_out_of_bounds",
             "disallowed_collection", "bad_reply_to")

    def build(self, total: int = RECORDS) -> Stream:
        bad_positions = set(self.rng.sample(range(total), int(total * BAD_SHARE)))
        for n in range(total):
            if n in bad_positions:  # every kind once, then chosen at random
                made = sum(self.bad.values())
                kind = self.KINDS[made] if made < len(self.KINDS) else self.rng.choice(self.KINDS)
                self.records.append(getattr(self, kind)(n))
                self.bad[kind] += 1
            else:
                self.add_good(n)
        return self


def _create_topics(settings) -> None:
    """Every topic with 2 partitions; the chunk and query topics take records up to 8 MiB."""
    k = settings.kafka
    big = {"max.message.bytes": str(MAX_MESSAGE)}
    admin = KafkaAdminClient(**k.client_kwargs())
    admin.create_topics([NewTopic(t, 2, 1, topic_configs=big)
                         for t in (k.topic_chunks_bulk, k.topic_chunks_online, k.topic_queries)])
    admin.close()
    ensure_topics(k, partitions=2)


def _count_records(settings, topic: str) -> int:
    consumer = KafkaConsumer(**settings.kafka.client_kwargs(), enable_auto_commit=False)
    tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    ends = consumer.end_offsets(tps)
    consumer.close()
    return sum(ends.values())


@pytest.mark.timeout(900)
def test_a_fuzzed_stream_ends_indexed_once_dead_lettered_once_and_committed(kafka_bootstrap, tiny_bert_dir):
    settings = isolated_settings(kafka_bootstrap, "fuzz")
    settings.worker.record_retry_limit_s = 5.0
    _create_topics(settings)
    stream = Stream(settings).build()
    bad_total = sum(stream.bad.values())
    assert bad_total == RECORDS * BAD_SHARE and set(stream.bad) == set(Stream.KINDS)
    engine = make_engine(tiny_bert_dir, name="tiny-bert")
    store = memory_store()
    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all", max_request_size=MAX_MESSAGE,
                             linger_ms=20)
    for topic, value in stream.records:
        producer.send(topic, key=None, value=value)
    producer.flush()
    producer.close()
    sent = Counter(topic for topic, _ in stream.records)
    running = RunningWorker(settings, engine, store, lanes=("online", "bulk"))
    with running as worker:
        wait_for(lambda: store.collection_exists("docs") and store.count("docs") == len(stream.good_chunks), 300,
                 f"{len(stream.good_chunks)} good chunks indexed")
        letters = read_dead_letters(settings, bad_total, timeout_s=120)
        k = settings.kafka
        groups = {k.topic_chunks_bulk: k.group_bulk, k.topic_chunks_online: k.group_online, k.topic_queries: k.group_online}
        for topic, group in groups.items():
            wait_for(lambda: _committed(settings, topic, group) == sent[topic], 120, f"{topic} committed to its end")
        assert running.thread.is_alive() and worker.failure is None and worker.stalled() is None
    assert len(read_dead_letters(settings, bad_total + 1, timeout_s=3)) == bad_total  # and not one more
    assert all(letter.error.code and letter.error.message for letter in letters)
    stored = Counter((p.payload["doc_id"], p.payload["chunk_id"]) for p in store.scroll("docs"))
    assert set(stored) == stream.good_chunks and max(stored.values()) == 1
    assert _count_records(settings, settings.kafka.topic_replies) == stream.good_queries
    assert not [name for name in store.list_collections() if name.startswith("attacker")]
    codes = Counter(letter.error.code for letter in letters)
    print(f"\nfuzz (seed {SEED}): {len(stream.records)} records, bad by kind {dict(sorted(stream.bad.items()))}, "
          f"good chunks {len(stream.good_chunks)}, good queries {stream.good_queries}, "
          f"dead letters by code {dict(sorted(codes.items()))}")
    if os.environ.get("EMBEDSTREAM_FUZZ_REPORT"):
        with open(os.environ["EMBEDSTREAM_FUZZ_REPORT"], "w") as out:
            json.dump({"bad": stream.bad, "codes": codes, "good_chunks": len(stream.good_chunks),
                       "good_queries": stream.good_queries, "records": len(stream.records)}, out, indent=1)
