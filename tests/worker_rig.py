"""Workers running in a thread of the test process, for the broker tests."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request

from embedstream.workers.runtime import build_embed_worker


class Running:
    """Any worker (embed, rerank, CDC bridge) in a daemon thread; stopped and joined on exit."""

    def __init__(self, worker):
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, name=f"embedstream-{worker.name}", daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.worker

    def __exit__(self, *exc):
        self.worker.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the worker did not stop within 60 s"


class RunningWorker(Running):
    """An embed worker on ``lanes`` over ``store``."""

    def __init__(self, settings, engine, store, lanes=("online", "bulk")):
        super().__init__(build_embed_worker(settings, lanes, store=store, engine=engine))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str) -> tuple[int, bytes]:
    """A worker endpoint's status and body (error statuses too)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def publish_bulk_chunks(settings, texts: list[str]) -> None:
    """Chunk ``i`` of document ``d{i}`` for each text, on the bulk lane, flushed."""
    from kafka import KafkaProducer

    from embedstream.schemas import ChunkEvent
    from embedstream.schemas.codec import encode

    producer = KafkaProducer(**settings.kafka.client_kwargs(), acks="all")
    for i, text in enumerate(texts):
        producer.send(settings.kafka.topic_chunks_bulk, key=f"d{i}".encode(),
                      value=encode(ChunkEvent(doc_id=f"d{i}", chunk_id=0, text=text)))
    producer.flush()
    producer.close()
