"""The main job, end to end on this machine: real Kafka broker, embed worker, embedded Qdrant.

Starts the local broker, runs an embed worker (both lanes), publishes a sample corpus through the
bulk lane with a progress bar, then sends a few queries by request-reply and searches with them.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from embedstream import devkafka, logs
from embedstream.corpus import documents
from embedstream.config import Settings
from embedstream.engine.engine import Engine
from embedstream.producers.chunker import Chunker
from embedstream.producers.publisher import ChunkPublisher
from embedstream.producers.topics import ensure_topics
from embedstream.producers.query_client import QueryClient
from embedstream.workers.runtime import build_embed_worker, open_settings_store

QUERIES = [
    "How do I read a file line by line?",
    "Parse command line arguments",
    "compress data with gzip",
    "What happens when a thread is a daemon?",
]


def run_demo(doc_count: int = 150, port: int = 9092) -> None:
    console = logs.console()
    console.print(f"[bold]1.[/bold] starting Apache Kafka (KRaft) on 127.0.0.1:{port} ...")
    with devkafka.borrowed(port=port) as info:  # a broker this run started is stopped however the run ends
        _run(console, info.bootstrap, doc_count)


def _run(console: Console, bootstrap: str, doc_count: int) -> None:
    settings = Settings()
    settings.kafka.bootstrap_servers = bootstrap
    settings.qdrant.collection = "demo"
    ensure_topics(settings.kafka, partitions=4)
    console.print("[bold]2.[/bold] loading the model and starting the embed worker (online + bulk lanes) ...")
    engine = Engine.from_name(settings.default_model, settings)
    store = open_settings_store(settings)
    try:
        store.drop("demo")  # a fresh demo collection each run
        worker = build_embed_worker(settings, ("online", "bulk"), store=store, engine=engine)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        console.print(f"   model {engine.spec.name} via {engine.runner.describe()}; vectors: {type(store).__name__}")
        try:
            _index(console, settings, engine, store, doc_count)
            _ask(console, settings, store)
        finally:
            worker.stop()
            thread.join(30)
    finally:
        store.close()


def _index(console: Console, settings: Settings, engine: Engine, store, doc_count: int) -> None:
    chunker = Chunker.for_model(engine.spec, chunk_tokens=160, overlap_tokens=24)
    docs = documents(doc_count, seed=11)
    start = time.perf_counter()
    with ChunkPublisher(settings.kafka, lane="bulk") as pub:
        total = pub.publish_documents(docs, chunker)
    console.print(f"[bold]3.[/bold] published {total} chunks of {doc_count} documents to the bulk lane; indexing ...")
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("chunks in Qdrant", total=total)
        done = 0
        while done < total:
            time.sleep(0.5)
            done = store.count("demo") if store.exists("demo") else 0
            bar.update(task, completed=done)
    seconds = time.perf_counter() - start
    console.print(f"   indexed {total} chunks in {seconds:.1f} s ({total / seconds:.1f} chunks/s end to end)")


def _ask(console: Console, settings: Settings, store) -> None:
    console.print("[bold]4.[/bold] queries by request-reply on the online lane, then a Qdrant search:")
    table = Table(show_lines=True)
    for col in ("query", "round trip ms", "worker ms (queue/tokenize/forward)", "top hit (score)"):
        table.add_column(col)
    with QueryClient(settings.kafka) as client:
        for text in QUERIES:
            sent = time.perf_counter()
            reply = client.embed(text, timeout_s=30)
            rtt = (time.perf_counter() - sent) * 1000
            if reply.error:
                table.add_row(text, f"{rtt:.1f}", "-", f"error: {reply.error.message}")
                continue
            hits = store.search("demo", "full", np.array(reply.embedding, dtype=np.float32), 1)
            t = reply.timings_ms
            best = f"{hits[0].payload['text'][:110]}... ({hits[0].score:.3f})" if hits else "-"
            table.add_row(text, f"{rtt:.1f}", f"{t.get('queue_wait', 0):.1f} / {t.get('tokenize_ms', 0):.1f} / "
                          f"{t.get('forward_ms', 0):.1f}", best)
    console.print(table)
