"""The `embedstream` command line: engine, producers, workers, benchmarks and dev tooling."""

from __future__ import annotations

import json
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
    texts: int = typer.Option(1000, help="Corpus size"),
    repeats: int = typer.Option(3, help="Timed runs per method (median reported)"),
    no_baselines: bool = typer.Option(False, "--no-baselines", help="Only embedstream"),
) -> None:
    """Engine throughput vs sentence-transformers and naive padded batches, one corpus, one run."""
    from embedstream.bench import engine_bench

    rows, facts = engine_bench.run(model, threads, texts, repeats, baselines=not no_baselines)
    engine_bench.print_table(rows, facts)


worker_app = typer.Typer(no_args_is_help=True, help="Long-running Kafka workers.")
app.add_typer(worker_app, name="worker")


@worker_app.command("embed")
def worker_embed(
    lanes: str = typer.Option("online,bulk", help="online, bulk or both (each lane has its own consumer group)"),
    model: Optional[str] = typer.Option(None, help="Model served (default: settings.default_model)"),
    metrics_port: int = typer.Option(9400, help="Port of /metrics, /healthz, /readyz (0: off)"),
    threads: Optional[int] = typer.Option(None, help="torch threads (one per process often wins under load)"),
) -> None:
    """Consume chunk and query topics, embed in token-budget batches, upsert into Qdrant, reply to queries."""
    from workers.runtime import build_embed_worker, run_until_signalled

    logs.configure()
    settings = Settings()
    if threads:
        settings.engine.threads = threads
    chosen = tuple(lane.strip() for lane in lanes.split(",") if lane.strip())
    bad = [lane for lane in chosen if lane not in ("online", "bulk")]
    if bad or not chosen:
        raise typer.BadParameter(f"lanes must be online and/or bulk, got {lanes!r}")
    run_until_signalled(build_embed_worker(settings, chosen, model), metrics_port or None)


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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
