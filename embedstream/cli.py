"""The `embedstream` command line: engine, producers, workers, benchmarks and dev tooling."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer

from embedstream import logs
from embedstream.config import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Streaming embeddings and reranking over Kafka.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print side-by-side tables.")
dev_app = typer.Typer(no_args_is_help=True, help="Local development services.")
kafka_app = typer.Typer(no_args_is_help=True, help="The local single-node Apache Kafka broker (KRaft).")
schemas_app = typer.Typer(no_args_is_help=True, help="Wire schemas.")
app.add_typer(bench_app, name="bench")
app.add_typer(dev_app, name="dev")
dev_app.add_typer(kafka_app, name="kafka")
app.add_typer(schemas_app, name="schemas")


def _read_jsonl(stream, chunk: int):
    """Yield lists of (line number, parsed object or the JSON error) in chunks, so stdin can stream."""
    batch = []
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            batch.append((number, json.loads(line)))
        except json.JSONDecodeError as exc:
            batch.append((number, exc))
        if len(batch) >= chunk:
            yield batch
            batch = []
    if batch:
        yield batch


def _bad_line(number: int, obj, fields: tuple[str, ...]) -> dict | None:
    if isinstance(obj, json.JSONDecodeError):
        return {"id": None, "line": number, "error": {"code": "malformed_json", "message": str(obj)}}
    if not isinstance(obj, dict):
        return {"id": None, "line": number, "error": {"code": "invalid_input", "message": "each line must be a JSON object"}}
    missing = [f for f in fields if f not in obj]
    if missing:
        return {"id": obj.get("id"), "line": number, "error": {"code": "invalid_input", "message": f"missing field(s): {', '.join(missing)}"}}
    return None


@app.command()
def embed(
    model: str = typer.Option(None, help="Registry name or local model folder"),
    dimensions: Optional[int] = typer.Option(None, help="Matryoshka size (only for MRL-trained models)"),
    dtype: str = typer.Option("float32", help="float32 | float16 | int8 | binary"),
    no_normalize: bool = typer.Option(False, "--no-normalize", help="Skip L2 normalisation"),
    truncate: bool = typer.Option(False, "--truncate", help="Truncate over-long texts instead of rejecting them"),
    prompt: Optional[str] = typer.Option(None, help="query | document: prepend the model's prompt"),
    chunk: int = typer.Option(1024, help="Lines embedded together (stdin is processed in chunks)"),
) -> None:
    """Embed JSON lines {"id", "text"} from stdin; write {"id", "embedding", "tokens"} (or "error") lines."""
    from embedstream.engine.engine import EmbedRequest, Engine

    logs.configure()
    settings = Settings()
    engine = Engine.from_name(model or settings.default_model, settings)
    out = sys.stdout
    for batch in _read_jsonl(sys.stdin, chunk):
        replies: list[dict | None] = [_bad_line(n, obj, ("text",)) for n, obj in batch]
        todo = [i for i, r in enumerate(replies) if r is None]
        requests = [
            EmbedRequest(batch[i][1].get("id"), batch[i][1]["text"], dimensions, dtype,
                         False if no_normalize else None, True if truncate else None, prompt)
            for i in todo
        ]
        results, _ = engine.embed(requests)
        for i, result in zip(todo, results):
            replies[i] = result.to_json()
        for reply in replies:
            out.write(json.dumps(reply) + "\n")
        out.flush()


@app.command()
def score(
    model: str = typer.Option(..., help="Cross-encoder: registry name or local folder"),
    chunk: int = typer.Option(1024, help="Lines scored together"),
) -> None:
    """Score JSON lines {"id", "query", "passage"} from stdin with a cross-encoder; write {"id", "score"}."""
    from embedstream.engine.engine import Engine, ScoreRequest

    logs.configure()
    engine = Engine.from_name(model, Settings())
    for batch in _read_jsonl(sys.stdin, chunk):
        replies: list[dict | None] = [_bad_line(n, obj, ("query", "passage")) for n, obj in batch]
        todo = [i for i, r in enumerate(replies) if r is None]
        requests = [ScoreRequest(batch[i][1].get("id"), batch[i][1]["query"], batch[i][1]["passage"]) for i in todo]
        results, _ = engine.score(requests)
        for i, result in zip(todo, results):
            replies[i] = result.to_json()
        for reply in replies:
            sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


@bench_app.command("engine")
def bench_engine(
    model: str = typer.Option("all-MiniLM-L6-v2", help="Registry name or local folder"),
    threads: list[int] = typer.Option([1, 2], help="torch threads; repeat the flag for several"),
    texts: int = typer.Option(600, help="Corpus size"),
    repeats: int = typer.Option(3, help="Timed runs per method, taken in turns (median reported)"),
    no_baselines: bool = typer.Option(False, "--no-baselines", help="Only embedstream"),
    precision: Optional[list[str]] = typer.Option(
        None, help="Extra approximate rows (int8, bfloat16); default: int8, plus bfloat16 where the CPU has it"
    ),
) -> None:
    """Engine throughput vs sentence-transformers and naive padded batches, one corpus, one run."""
    from embedstream.bench import engine_bench

    rows, facts = engine_bench.run(model, threads, texts, repeats, baselines=not no_baselines, precisions=precision)
    engine_bench.print_table(rows, facts)


@app.command()
def produce(
    path: str = typer.Argument(..., help="File, folder, JSON lines file, or - for JSON lines on stdin"),
    lane: str = typer.Option("bulk", help="online | bulk"),
    model: Optional[str] = typer.Option(None, help="Model whose tokenizer and limit drive chunking"),
    chunk_tokens: int = typer.Option(200, help="Target tokens per chunk"),
    overlap: int = typer.Option(32, help="Tokens carried over between chunks"),
    collection: Optional[str] = typer.Option(None, help="Target collection (default: the worker's)"),
    replace: bool = typer.Option(False, help="Delete a document's old chunks before publishing its new ones"),
) -> None:
    """Chunk documents by tokens and publish ChunkEvents to the lane's topic (key = doc_id)."""
    from rich.progress import Progress

    from embedstream.engine.model_spec import resolve_model
    from embedstream.producers.chunker import Chunker
    from embedstream.producers.publisher import ChunkPublisher
    from embedstream.producers.sources import DocumentSource

    logs.configure()
    if lane not in ("online", "bulk"):
        raise typer.BadParameter("lane must be online or bulk")
    settings = Settings()
    spec = resolve_model(model or settings.default_model, settings.models)
    chunker = Chunker.for_model(spec, chunk_tokens, overlap)
    source = DocumentSource(path, stdin=sys.stdin.buffer if path == "-" else None)
    total = 0
    with ChunkPublisher(settings.kafka, lane=lane, collection=collection) as pub, Progress(transient=False) as bar:
        task = bar.add_task(f"publishing to {lane}", total=None)
        for doc in source:
            total += pub.publish_document(doc, chunker, replace=replace)
            bar.update(task, advance=1, description=f"{total} chunks published to {lane}")
    for err in source.errors:
        typer.echo(f"skipped: {err}", err=True)
    typer.echo(f"published {total} chunks ({len(source.errors)} bad inputs skipped)")


@app.command()
def query(
    text: str = typer.Argument(..., help="Query text"),
    model: Optional[str] = typer.Option(None),
    dimensions: Optional[int] = typer.Option(None),
    dtype: str = typer.Option("float32"),
    timeout: float = typer.Option(10.0, help="Seconds to wait for the reply"),
    show: int = typer.Option(8, help="Vector components to print"),
) -> None:
    """Embed one query through Kafka request-reply and print the reply with its stage timings."""
    from embedstream.producers.query_client import QueryClient

    logs.configure()
    with QueryClient(Settings().kafka) as client:
        reply = client.embed(text, model=model, dimensions=dimensions, dtype=dtype, timeout_s=timeout)
    out = reply.model_dump()
    if reply.embedding is not None:
        out["embedding"] = reply.embedding[:show] + (["..."] if len(reply.embedding) > show else [])
    typer.echo(json.dumps(out, indent=2))
    raise typer.Exit(1 if reply.error else 0)


@schemas_app.command("export")
def schemas_export(directory: str = typer.Argument(..., help="Output folder for <Name>.schema.json files")) -> None:
    """Write the JSON Schema of every wire model, for producers in other languages."""
    from embedstream.schemas.export import export_json_schemas

    for path in export_json_schemas(directory):
        typer.echo(str(path))


@app.command()
def demo(
    docs: int = typer.Option(150, help="Sample documents to index"),
    port: int = typer.Option(9092, help="Local broker port"),
) -> None:
    """End to end: local broker, embed worker, bulk indexing with progress, queries by request-reply."""
    from embedstream.demo import run_demo

    logs.configure(level="WARNING")
    run_demo(docs, port)


@app.command()
def reindex(
    to_collection: str = typer.Option(..., "--to-collection", help="New collection version, e.g. docs_v2"),
    start: str = typer.Option("earliest", "--from", help="earliest | epoch ms | ISO time | PARTITION:OFFSET,..."),
    alias: Optional[str] = typer.Option(None, help="Alias live traffic uses (default: settings.qdrant.collection)"),
    model: Optional[str] = typer.Option(None, help="Model whose tokenizer drives chunking (the bulk workers' model)"),
    chunk_tokens: int = typer.Option(200, help="Target tokens per chunk"),
    overlap: int = typer.Option(32, help="Tokens carried over between chunks"),
    drop_old: bool = typer.Option(False, "--drop-old", help="Delete the previous version after the switch"),
    restart: bool = typer.Option(False, "--restart", help="Ignore a previous run's position for this target"),
    wait_timeout: float = typer.Option(3600.0, help="Seconds to wait for the bulk embed workers to catch up"),
) -> None:
    """Replay the documents log into a new collection on the bulk lane, then switch the alias atomically."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from embedstream.engine.model_spec import output_dimensions, resolve_model
    from embedstream.reindex import ReindexError, Reindexer, ReindexPlan
    from embedstream.producers.replay import StartPosition
    from embedstream.workers.runtime import open_settings_store, sink_config_from

    logs.configure()
    settings = Settings()
    try:
        position = StartPosition.parse(start)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    spec = resolve_model(model or settings.default_model, settings.models)
    plan = ReindexPlan(to_collection, alias or settings.qdrant.collection, position, chunk_tokens, overlap,
                       drop_old, restart, wait_timeout)
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
    store = open_settings_store(settings)
    try:
        with Progress(*columns) as bar:
            tasks: dict[str, int] = {}

            def on_phase(phase: str, done: int, total: int) -> None:
                if phase not in tasks:
                    tasks[phase] = bar.add_task(phase, total=total)
                bar.update(tasks[phase], completed=done, total=total)

            result = Reindexer(settings, store, spec, output_dimensions(spec), sink_config_from(settings), plan,
                               on_phase).run()
    except ReindexError as exc:
        typer.echo(f"reindex: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        store.close()
    first = result.passes[0]
    typer.echo(f"{plan.alias} -> {result.target} (was {result.previous or 'unset'}); replayed {first.documents} "
               f"documents / {first.deletes} deletes into {first.chunks} chunks in {result.seconds:.1f} s"
               f"{' (resumed)' if first.resumed else ''}; catch-up pass: {result.passes[1].documents} documents"
               f"{'; old version dropped' if result.dropped else ''}")


worker_app = typer.Typer(no_args_is_help=True, help="Long-running Kafka workers.")
app.add_typer(worker_app, name="worker")


@worker_app.command("embed")
def worker_embed(
    lanes: str = typer.Option("online,bulk", help="online, bulk or both (each lane has its own consumer group)"),
    model: Optional[str] = typer.Option(None, help="Model served (default: settings.default_model)"),
    metrics_port: int = typer.Option(9400, help="Port of /metrics, /healthz, /readyz (0: off)"),
    threads: Optional[int] = typer.Option(None, help="torch threads (one per process often wins under load)"),
    skip_unchanged: bool = typer.Option(True, "--skip-unchanged/--no-skip-unchanged",
                                        help="Do not embed chunks whose point already has the same content hash, model and metadata"),
    nice: int = typer.Option(0, help="Lower this process's CPU priority by N (e.g. 10 for a bulk worker sharing "
                                     "cores with an online one: the bench's query p95 under backlog fell from 35-41 to 24-31 ms)"),
) -> None:
    """Consume chunk and query topics, embed in token-budget batches, upsert into Qdrant, reply to queries."""
    from embedstream.workers.runtime import build_embed_worker, run_until_signalled

    logs.configure()
    if nice:
        os.nice(nice)
    settings = Settings()
    if threads:
        settings.engine.threads = threads
    chosen = tuple(lane.strip() for lane in lanes.split(",") if lane.strip())
    bad = [lane for lane in chosen if lane not in ("online", "bulk")]
    if bad or not chosen:
        raise typer.BadParameter(f"lanes must be online and/or bulk, got {lanes!r}")
    worker = build_embed_worker(settings, chosen, model)
    worker.options.skip_unchanged = skip_unchanged
    run_until_signalled(worker, metrics_port or None)


@app.command()
def cdc(
    topic: str = typer.Option(..., help="Debezium change-event topic (JSON, with or without the schema wrapper)"),
    id_field: str = typer.Option(..., help="Row field holding the document id (MongoDB: _id); the key is the fallback"),
    text_fields: str = typer.Option(..., help="Comma-separated fields joined (blank line between) into the text"),
    metadata_fields: str = typer.Option("", help="Comma-separated fields stored as point payload"),
    lane: str = typer.Option("online", help="Chunk lane the bridge publishes to: online | bulk"),
    model: Optional[str] = typer.Option(None, help="Model whose tokenizer and limit drive chunking (the workers' model)"),
    chunk_tokens: int = typer.Option(200, help="Target tokens per chunk"),
    overlap: int = typer.Option(32, help="Tokens carried over between chunks"),
    collection: Optional[str] = typer.Option(None, help="Target collection (default: the workers')"),
    on_truncate: str = typer.Option("dead-letter", help="dead-letter | ignore: what a table truncate (op t) does"),
    group: Optional[str] = typer.Option(None, help="Consumer group (default: settings.kafka.group_cdc)"),
    metrics_port: int = typer.Option(9401, help="Port of /metrics, /healthz, /readyz (0: off)"),
) -> None:
    """Apply Debezium change events: c/r/u re-chunk and publish (unchanged chunks are not re-embedded), d/tombstone delete."""
    from embedstream.engine.model_spec import resolve_model
    from embedstream.producers.chunker import Chunker
    from embedstream.producers.debezium import CdcConfig
    from embedstream.workers.cdc_bridge import CdcBridge, CdcOptions, run_until_signalled

    logs.configure()
    if lane not in ("online", "bulk"):
        raise typer.BadParameter("lane must be online or bulk")
    if on_truncate not in ("dead-letter", "ignore"):
        raise typer.BadParameter("on-truncate must be dead-letter or ignore")
    fields = tuple(f.strip() for f in text_fields.split(",") if f.strip())
    if not fields:
        raise typer.BadParameter("give at least one text field")
    config = CdcConfig(id_field, fields, tuple(f.strip() for f in metadata_fields.split(",") if f.strip()))
    settings = Settings()
    spec = resolve_model(model or settings.default_model, settings.models)
    options = CdcOptions(topic, config, lane=lane, collection=collection, on_truncate=on_truncate, group=group)
    bridge = CdcBridge(settings, Chunker.for_model(spec, chunk_tokens, overlap), options)
    run_until_signalled(bridge, metrics_port or None)


@bench_app.command("pipeline")
def bench_pipeline(
    docs: int = typer.Option(300, help="Sample documents in each bulk backlog"),
    queries: int = typer.Option(200, help="Round trips measured idle and under backlog"),
    port: int = typer.Option(9092, help="Local broker port"),
    online_threads: int = typer.Option(1, help="torch threads of the online worker process"),
    online_precision: str = typer.Option("fast", help="Precision of the online worker (auto: exact float32 on CPU)"),
    bulk_nice: int = typer.Option(10, help="CPU niceness of the bulk worker process (0: same priority)"),
    warmup: int = typer.Option(150, help="Round trips before measuring (fresh topics and clients warm up)"),
    rounds: int = typer.Option(3, help="Throughput rounds (engine alone, then end to end); the ratio is their median"),
) -> None:
    """Bulk chunks/s Kafka -> Qdrant vs the engine alone; query round trips idle and under backlog."""
    from embedstream.bench import pipeline_bench

    logs.configure(level="WARNING")
    pipeline_bench.print_table(pipeline_bench.run(docs, queries, port, online_threads, bulk_nice, warmup, rounds,
                                                  online_precision))


@bench_app.command("stall")
def bench_stall(
    mode: list[str] = typer.Option(["fail", "block"], help="fail (writes raise) | block (writes hang); repeat for both"),
    chunks: int = typer.Option(20000, help="Chunks in the bulk backlog"),
    words: int = typer.Option(60, help="Words per chunk (about 80 tokens)"),
    warmup: float = typer.Option(8.0, help="Seconds of normal draining before the stall"),
    stall: float = typer.Option(30.0, help="Seconds the sink stalls"),
    recover: float = typer.Option(10.0, help="Seconds sampled after the sink recovers"),
    port: int = typer.Option(9092, help="Local broker port (started if not running)"),
) -> None:
    """Memory under a stalled sink: RSS, queued tokens, paused consumer, committed offsets, every second."""
    from embedstream.bench import stall_bench

    bad = [m for m in mode if m not in stall_bench.MODES]
    if bad:
        raise typer.BadParameter(f"mode must be one of {stall_bench.MODES}, got {bad}")
    logs.configure(level="ERROR")
    stall_bench.print_results(stall_bench.run(mode, port, chunks, words, warmup, stall, recover))


@kafka_app.command("start")
def kafka_start(port: int = typer.Option(9092), data_dir: Optional[str] = typer.Option(None)) -> None:
    """Resolve the broker jars (once), format KRaft storage (once) and start; returns when it answers."""
    from embedstream import devkafka

    info = devkafka.start(port=port, data_dir=data_dir)
    typer.echo(f"kafka broker answering on {info.bootstrap}")


@kafka_app.command("stop")
def kafka_stop(port: int = typer.Option(9092), data_dir: Optional[str] = typer.Option(None)) -> None:
    """Stop the local broker (data is kept)."""
    from embedstream import devkafka

    typer.echo("stopped" if devkafka.stop(port=port, data_dir=data_dir) else "not running")


@kafka_app.command("status")
def kafka_status(port: int = typer.Option(9092), data_dir: Optional[str] = typer.Option(None)) -> None:
    """Print the broker's state as JSON; exit 3 when it does not answer."""
    from embedstream import devkafka

    state = devkafka.status(port=port, data_dir=data_dir)
    typer.echo(json.dumps(state, indent=2, default=str))
    raise typer.Exit(0 if state.get("answering") else 3)


def _register_plan() -> None:
    from embedstream.plan.command import plan_command

    app.command("plan", help="Indexing, serving and storage arithmetic fed by measured throughput.")(plan_command)


_register_plan()


def _register_rerank() -> None:
    from embedstream import rerank_cli

    rerank_cli.register(app, bench_app, worker_app)


_register_rerank()


def _register_gateway() -> None:
    from embedstream.bench.gateway_bench import bench_gateway_cmd
    from embedstream.gateway.cli import gateway_cmd

    app.command("gateway")(gateway_cmd)
    bench_app.command("gateway")(bench_gateway_cmd)


_register_gateway()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
