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
