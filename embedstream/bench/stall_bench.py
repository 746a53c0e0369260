"""`embedstream bench stall`: the worker's memory stays flat while its sink is stalled.

A large bulk backlog waits in Kafka. An embed worker (a thread of this process, the real
``EmbedWorker``) drains it into an in-memory Qdrant; after a warm-up the sink stalls for
``stall_s`` seconds, then recovers:

* ``fail``: every upsert raises (Qdrant down): the worker backs off with its consumers paused;
* ``block``: the upsert hangs until the stall ends (Qdrant unresponsive): the loop is stuck inside
  the write while the client's IO thread keeps the group membership.

Every second the process RSS (psutil) is sampled with the lane's queued tokens, whether its
consumer is paused, the group's committed offsets and the points in the store. The verdict is the
RSS growth during the stall (max during the stall minus the value when it began): bounded lane
queues and paused consumers keep it near zero however large the backlog.
"""

from __future__ import annotations

import threading
import time
import uuid

from embedstream import devkafka
from embedstream.config import Settings
from embedstream.vectorstore.locked import LockedStore

MODES = ("fail", "block")
FLAT_MIB = 50  # about one in-flight forward pass of a full batch; a leak or an unbounded queue grows past it


class StallingStore(LockedStore):
    """A vector store whose writes fail or block while ``stalled`` is set; every call is serialised."""

    def __init__(self, store, mode: str):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        super().__init__(store)
        self.mode = mode
        self.stalled = threading.Event()
        self.failed_writes = 0

    def upsert(self, *args, **kwargs):
        if self.stalled.is_set():
            if self.mode == "fail":
                self.failed_writes += 1
                raise ConnectionError("sink stalled (bench stall)")
            while self.stalled.is_set():  # an unresponsive server: the write just hangs
                time.sleep(0.05)
        with self._lock:
            return self._store.upsert(*args, **kwargs)


def _texts(count: int, words: int) -> list[str]:
    """Chunk-sized windows of real prose (about 1.3 tokens per word)."""
    from embedstream.corpus import stdlib_paragraphs

    pool = " ".join(stdlib_paragraphs()[:4000]).split()
    step = max(1, (len(pool) - words) // max(1, count))
    return [f"[{i}] " + " ".join(pool[(i * step) % (len(pool) - words):][:words]) for i in range(count)]


def _publish(settings: Settings, texts: list[str]) -> None:
    from kafka import KafkaProducer

    from embedstream.schemas import ChunkEvent
    from embedstream.schemas.codec import encode

    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all", linger_ms=20, batch_size=256 * 1024)
    for i, text in enumerate(texts):
        event = ChunkEvent(doc_id=f"stall-{i // 8}", chunk_id=i % 8, text=text)
        producer.send(settings.kafka.topic_chunks_bulk, key=event.doc_id.encode(), value=encode(event))
    producer.flush()
    producer.close()


def _points(store, collection: str) -> int:
    try:  # the collection (or its alias) appears with the first write
        return store.count(collection)
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def run_mode(mode: str, engine, bootstrap: str, chunks: int, words: int, warmup_s: float, stall_s: float,
             recover_s: float, sink_backoff_s: tuple[float, float] = (0.2, 2.0)) -> dict:
    import psutil
    from kafka import KafkaConsumer, TopicPartition

    from embedstream.config import KafkaSettings
    from embedstream.vectorstore.factory import open_store
    from embedstream.producers.topics import ensure_topics
    from embedstream.workers.runtime import build_embed_worker

    prefix = f"stall-{mode}-{uuid.uuid4().hex[:6]}"
    settings = Settings(kafka=KafkaSettings(
        bootstrap_servers=bootstrap, topic_chunks_bulk=f"{prefix}.chunks.bulk", topic_dead_letters=f"{prefix}.dlq",
        group_bulk=f"{prefix}-bulk"))
    ensure_topics(settings.kafka, partitions=4, topics=[settings.kafka.topic_chunks_bulk, settings.kafka.topic_dead_letters])
    texts = _texts(chunks, words)
    _publish(settings, texts)
    backlog_mib = sum(len(t) for t in texts) / 2**20

    store = StallingStore(open_store(":memory:", None, None), mode)
    worker = build_embed_worker(settings, ("bulk",), store=store, engine=engine)
    worker.options.sink_backoff_s = sink_backoff_s
    lane = worker.lanes["bulk"]
    consumer = lane.consumer
    probe = KafkaConsumer(**settings.kafka.client_kwargs(), group_id=settings.kafka.group_bulk, enable_auto_commit=False)
    topic = settings.kafka.topic_chunks_bulk
    partitions = [TopicPartition(topic, p) for p in sorted(probe.partitions_for_topic(topic))]
    collection = settings.qdrant.collection
    process = psutil.Process()
    thread = threading.Thread(target=worker.run, name=f"stall-bench-{mode}", daemon=True)
    rows: list[dict] = []
    start = time.monotonic()
    phases = (("warm-up", warmup_s), ("stall", stall_s), ("recover", recover_s))
    thread.start()
    try:
        for phase, length in phases:
            if phase == "stall":
                store.stalled.set()
            elif phase == "recover":
                store.stalled.clear()
            phase_end = time.monotonic() + length
            while True:
                now = time.monotonic()
                rows.append({
                    "t": now - start,
                    "phase": phase,
                    "rss_mib": process.memory_info().rss / 2**20,
                    "queued_tokens": lane.queue.tokens,
                    "queued_items": len(lane.queue),
                    "paused": bool(lane.paused or consumer.paused()),
                    "committed": sum(probe.committed(tp, timeout_ms=5000) or 0 for tp in partitions),
                    "points": _points(store, collection),
                })
                if now >= phase_end:
                    break
                time.sleep(max(0.0, min(1.0 - (time.monotonic() - now), phase_end - time.monotonic())))
    finally:
        store.stalled.clear()
        worker.stop()
        thread.join(60)
        probe.close()
    stall_rows = [r for r in rows if r["phase"] == "stall"]
    return {
        "mode": mode, "chunks": chunks, "backlog_mib": backlog_mib, "rows": rows,
        "stall_start_rss": stall_rows[0]["rss_mib"], "stall_max_rss": max(r["rss_mib"] for r in stall_rows),
        "growth_mib": max(r["rss_mib"] for r in stall_rows) - stall_rows[0]["rss_mib"],
        "end_growth_mib": stall_rows[-1]["rss_mib"] - stall_rows[0]["rss_mib"],
        "stall_s": stall_rows[-1]["t"] - stall_rows[0]["t"],
        "committed_during_stall": stall_rows[-1]["committed"] - stall_rows[0]["committed"],
        "max_queued_tokens": max(r["queued_tokens"] for r in rows),
        "queue_limit": worker.options.max_queue_tokens,
        "failed_writes": store.failed_writes, "worker_alive": thread.is_alive(),
    }


def run(modes: list[str], port: int, chunks: int, words: int, warmup_s: float, stall_s: float, recover_s: float,
        model: str | None = None) -> list[dict]:
    from embedstream.engine.engine import Engine

    info = devkafka.start(port=port)  # reuses a running broker
    settings = Settings()
    engine = Engine.from_name(model or settings.default_model, settings)
    return [run_mode(mode, engine, info.bootstrap, chunks, words, warmup_s, stall_s, recover_s) for mode in modes]


def print_results(results: list[dict]) -> None:
    from rich.table import Table

    from embedstream import logs

    console = logs.console()
    for res in results:
        table = Table(title=f"bench stall ({res['mode']}): backlog {res['chunks']} chunks ({res['backlog_mib']:.1f} MiB of text); "
                            f"lane queue limit {res['queue_limit']} tokens")
        for col in ("t s", "phase", "RSS MiB", "queued tokens", "queued items", "consumer paused", "committed offset", "points"):
            table.add_column(col, justify="left" if col == "phase" else "right")
        for r in res["rows"]:
            table.add_row(f"{r['t']:.0f}", r["phase"], f"{r['rss_mib']:.1f}", str(r["queued_tokens"]), str(r["queued_items"]),
                          "yes" if r["paused"] else "no", str(r["committed"]), str(r["points"]))
        console.print(table)
        flat = res["growth_mib"] < FLAT_MIB
        console.print(
            f"verdict ({res['mode']}): RSS growth during the {res['stall_s']:.0f} s stall (max - start of stall) = "
            f"{res['growth_mib']:+.1f} MiB ({res['stall_start_rss']:.1f} -> max {res['stall_max_rss']:.1f}; end of stall "
            f"{res['end_growth_mib']:+.1f}): {'flat' if flat else 'NOT flat'} (threshold {FLAT_MIB} MiB); "
            f"offsets committed during the stall: {res['committed_during_stall']}; failed writes {res['failed_writes']}; "
            f"max queued tokens {res['max_queued_tokens']} (pause threshold {res['queue_limit']}, checked before each poll)"
        )
