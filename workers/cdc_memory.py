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

from kafka import KafkaConsumer, TopicPartition

from embedstream.config import KafkaSettings

FETCH_TIMEOUT_S = 30.0


class DocumentMemory:
    def __init__(self, kafka: KafkaSettings):
        self.kafka = kafka
        self.topic = kafka.topic_documents
        self._where: dict[str, tuple[int, int]] = {}
        self._gone: dict[str, tuple[int, int]] = {}  # deleted documents: where their last record was
        self._tail: KafkaConsumer | None = None
        self._fetch: KafkaConsumer | None = None

    def catch_up(self, timeout_s: float = FETCH_TIMEOUT_S) -> None:
        """Read the documents log on to its current end, noting where each document's latest record is."""
        if self._tail is None or not self._tail.assignment():
            self._tail = self._tail or self._consumer()
            tps = [TopicPartition(self.topic, p) for p in sorted(self._tail.partitions_for_topic(self.topic) or ())]
            self._tail.assign(tps)
            self._tail.seek_to_beginning()
        tps = list(self._tail.assignment())
        ends = self._tail.end_offsets(tps)
        deadline = time.monotonic() + timeout_s  # a long log takes as long as it takes; a stalled read does not
        while any(self._tail.position(tp) < ends[tp] for tp in tps):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the documents log {self.topic}: nothing for {timeout_s:.0f} s")
            polled = self._tail.poll(timeout_ms=200)
            if polled:
                deadline = time.monotonic() + timeout_s
            for records in polled.values():
                for r in records:
                    doc_id = r.key.decode("utf-8", "replace") if r.key is not None else None
                    if doc_id is None:
                        continue
                    if r.value is None:  # deleted: its last record stays reachable (a primary-key change)
                        if doc_id in self._where:
                            self._gone[doc_id] = self._where.pop(doc_id)
                    else:
                        self._where[doc_id] = (r.partition, r.offset)
                        self._gone.pop(doc_id, None)

    def latest(self, doc_id: str, deleted: bool = False, timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, Any] | None:
        """The document's latest record (as JSON) as of the last catch_up(); None when it has none. With
        ``deleted`` also a deleted document's last record, while compaction has not removed it."""
        for _ in range(2):
            where = self._where.get(doc_id) or (self._gone.get(doc_id) if deleted else None)
            if where is None:
                return None
            record = self._read(TopicPartition(self.topic, where[0]), where[1], timeout_s)
            if record is not None and record.offset == where[1]:
                return json.loads(record.value)
            if deleted and self._gone.get(doc_id) == where:
                return None  # compacted away after its tombstone
            self.catch_up(timeout_s)  # compacted away: a newer record of it came after the last catch_up
        raise TimeoutError(f"{doc_id!r}'s record in {self.topic} moved twice while being fetched")

    def _read(self, tp: TopicPartition, offset: int, timeout_s: float):
        """The first record at or after ``offset`` (None when the partition ends before)."""
        if self._fetch is None:
            self._fetch = self._consumer()
        self._fetch.assign([tp])
        self._fetch.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in self._fetch.poll(timeout_ms=200, max_records=1).get(tp, []):
                return r
            if self._fetch.position(tp) >= self._fetch.end_offsets([tp])[tp]:
                return None
        raise TimeoutError(f"fetching offset {offset} of {tp.topic}/{tp.partition} took over {timeout_s:.0f} s")

    def close(self) -> None:
        for consumer in (self._tail, self._fetch):
            if consumer is not None:
                consumer.close()
        self._tail = self._fetch = None

    def _consumer(self) -> KafkaConsumer:
        return KafkaConsumer(**self.kafka.client_kwargs(), enable_auto_commit=False, fetch_max_wait_ms=10,
                             isolation_level="read_committed")
