"""What the CDC bridge knows of each document: the documents log (compacted, key = doc_id), materialised
per document on demand.

Debezium leaves out values it could not read (an unchanged TOASTed column: its placeholder). The
bridge fills them in from the document's latest documents-log record, which it wrote itself when it
last applied the document. Only where each key's latest record lies is kept in memory
(partition, offset); the record is fetched when a change needs it. The index is built by reading
the log from the start on first use and kept current by reading on from there before each lookup
(everything the bridge published earlier is acknowledged by then), so a restarted bridge knows
what the one before it wrote. A deleted document's last record stays reachable while compaction
keeps it: a primary-key change arrives as a delete of the old key and a create of the new one.
"""

from __future__ import annotations

import json
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from embedstream import logs
from embedstream.config import KafkaSettings

log = logs.get("embedstream.cdc")

FETCH_TIMEOUT_S = 30.0


class DocumentMemory:
    def __init__(self, kafka: KafkaSettings):
        self.kafka = kafka
        self.topic = kafka.topic_documents
        self._where: dict[str, tuple[int, int]] = {}
        self._gone: dict[str, tuple[int, int]] = {}  # deleted documents: where their last record was
        self._tail: Consumer | None = None
        self._fetch: Consumer | None = None
        self._read_to: dict[int, int] = {}  # partition -> the offset the tail has read the log to

    def catch_up(self, timeout_s: float = FETCH_TIMEOUT_S) -> None:
        """Read the documents log on to its current end, noting where each document's latest record is."""
        if not self._read_to:  # first use, or the topic had no partitions yet
            self._tail = self._tail or self._consumer()
            found = self._tail.list_topics(self.topic, timeout=timeout_s).topics.get(self.topic)
            partitions = sorted(found.partitions) if found is not None and found.error is None else []
            self._tail.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
            self._read_to = dict.fromkeys(partitions, 0)
        ends = {p: self._tail.get_watermark_offsets(TopicPartition(self.topic, p), timeout=timeout_s)[1]
                for p in self._read_to}
        deadline = time.monotonic() + timeout_s  # a long log takes as long as it takes; a stalled read does not
        while any(self._read_to[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the documents log {self.topic}: nothing for {timeout_s:.0f} s")
            polled = self._tail.consume(500, 0.2)
            if polled:
                deadline = time.monotonic() + timeout_s
            for r in polled:
                kind = _kind(r)
                if kind == END:  # the end of the log, past compacted records and transaction markers
                    self._read_to[r.partition()] = max(self._read_to[r.partition()], r.offset())
                if kind != RECORD:
                    continue
                self._read_to[r.partition()] = r.offset() + 1
                doc_id = r.key().decode("utf-8", "replace") if r.key() is not None else None
                if doc_id is None:
                    continue
                if r.value() is None:  # deleted: its last record stays reachable (a primary-key change)
                    if doc_id in self._where:
                        self._gone[doc_id] = self._where.pop(doc_id)
                else:
                    self._where[doc_id] = (r.partition(), r.offset())
                    self._gone.pop(doc_id, None)

    def latest(self, doc_id: str, deleted: bool = False, timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, Any] | None:
        """The document's latest record (as JSON) as of the last catch_up(); None when it has none. With
        ``deleted`` also a deleted document's last record, while compaction has not removed it."""
        for _ in range(2):
            where = self._where.get(doc_id) or (self._gone.get(doc_id) if deleted else None)
            if where is None:
                return None
            record = self._read(where[0], where[1], timeout_s)
            if record is not None and record.offset() == where[1]:
                return json.loads(record.value())
            if deleted and self._gone.get(doc_id) == where:
                return None  # compacted away after its tombstone
            self.catch_up(timeout_s)  # compacted away: a newer record of it came after the last catch_up
        raise TimeoutError(f"{doc_id!r}'s record in {self.topic} moved twice while being fetched")

    def _read(self, partition: int, offset: int, timeout_s: float):
        """The first record at or after ``offset`` (None when the partition ends before)."""
        if self._fetch is None:
            self._fetch = self._consumer()
        self._fetch.assign([TopicPartition(self.topic, partition, offset)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in self._fetch.consume(1, 0.2):
                kind = _kind(r)
                if kind != SKIP and r.partition() == partition and (kind == END or r.offset() >= offset):
                    return None if kind == END else r
        raise TimeoutError(f"fetching offset {offset} of {self.topic}/{partition} took over {timeout_s:.0f} s")

    def close(self) -> None:
        for consumer in (self._tail, self._fetch):
            if consumer is not None:
                consumer.close()
        self._tail = self._fetch = None

    def _consumer(self) -> Consumer:
        """librdkafka, no group (assigned partitions): committed records only; an event at each partition's end."""
        return Consumer(self.kafka.librdkafka_config(**{
            "group.id": "embedstream-cdc-memory", "enable.auto.commit": False, "fetch.wait.max.ms": 10,
            "isolation.level": "read_committed", "enable.partition.eof": True, "client.id": "embedstream-cdc-memory"}))


RECORD, END, SKIP = "record", "end", "skip"


def _kind(message) -> str:
    """A record, the end of a partition (its offset: where the log ends now) or a passing error (a fatal one raises)."""
    error = message.error()
    if error is None:
        return RECORD
    if error.code() == KafkaError._PARTITION_EOF:
        return END
    if error.fatal():
        raise KafkaException(error)
    log.warning("documents log read error", error=error.str()[:300])
    return SKIP
