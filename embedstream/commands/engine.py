"""`embedstream embed` and `embedstream score`: the engine on JSON lines from stdin, no Kafka involved."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from embedstream import logs
from embedstream.config import Settings

app = typer.Typer()
PANEL = "Engine (JSON lines on stdin, no Kafka)"  # where `embedstream --help` lists these commands


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


@app.command(rich_help_panel=PANEL)
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

    settings = Settings()
    logs.configure(json=settings.log_json)
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


@app.command(rich_help_panel=PANEL)
def score(
    model: str = typer.Option(..., help="Cross-encoder: registry name or local folder"),
    chunk: int = typer.Option(1024, help="Lines scored together"),
) -> None:
    """Score JSON lines {"id", "query", "passage"} from stdin with a cross-encoder; write {"id", "score"}."""
    from embedstream.engine.engine import Engine, ScoreRequest

    settings = Settings()
    logs.configure(json=settings.log_json)
    engine = Engine.from_name(model, settings)
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


tune_app = typer.Typer(no_args_is_help=True, help="The engine's measured path choice on this host.")


@tune_app.command("tune")
def tune(
    model: str = typer.Option(None, help="Registry name or local model folder"),
    threads: Optional[list[int]] = typer.Option(None, help="Worker threads to tune for; repeat for several "
                                                "(default: the engine settings', else all cores)"),
    floor: Optional[str] = typer.Option(None, help="Quality floor (default: EMBEDSTREAM_ENGINE__QUALITY_FLOOR): "
                                        "exact | 0.98 | recall@10>=0.98,min_cos>=0.999"),
    backend: str = typer.Option("auto", help="auto (packed and OpenVINO) or packed"),
    again: bool = typer.Option(False, "--again", help="Measure even when this host's measurements are cached"),
) -> None:
    """Measure every path (packed / OpenVINO, float32, bf16, int8 recipes) at a thread count, cache it, and
    print the frontier with the path each lane shape gets at the floor. Workers on precision tuned read it."""
    import torch

    from embedstream.bench.engine_bench import print_frontier
    from embedstream.engine import tuner
    from embedstream.engine.engine import Engine
    from embedstream.engine.model_spec import resolve_model
    from embedstream.engine.tuning import SHAPES, choose, parse_floor

    settings = Settings()
    logs.configure(json=settings.log_json)
    floor = parse_floor(floor or settings.engine.quality_floor)
    spec = resolve_model(model or settings.default_model, settings.models)
    backends = ("packed",) if backend == "packed" else ("openvino", "packed")
    for n in threads or [settings.engine.threads or torch.get_num_threads()]:
        if again:
            tuner.cache_path(spec, n, backends).unlink(missing_ok=True)
        settings.engine.precision, settings.engine.threads, settings.engine.backend = "tuned", n, backend
        engine = Engine(spec, settings.engine)
        measured = engine.runner.tuning
        choices = {shape: choose(measured.measurements, floor, shape) for shape in SHAPES}
        print_frontier(measured, choices, f"{spec.name}, {n} thread(s), floor {floor}")
