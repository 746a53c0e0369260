"""Commands that feed or ask a running pipeline: `produce`, `query`, `search`, `reindex`, and the `demo`
that runs one end to end on this machine."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from pydantic import ValidationError

from embedstream import logs
from embedstream.commands.options import BROKER_PORT, BrokerPort
from embedstream.config import Settings
from embedstream.ranking import DEFAULT_FUSION, FUSIONS

app = typer.Typer()
PANEL = "Pipeline clients"  # where `embedstream --help` lists these commands


@app.command(rich_help_panel=PANEL)
def produce(
    path: str = typer.Argument(..., help="File, folder, JSON lines file, or - for JSON lines on stdin"),
    lane: str = typer.Option("bulk", help="online | bulk"),
    model: Optional[str] = typer.Option(None, help="Model whose tokenizer and limit drive chunking"),
    chunk_tokens: int = typer.Option(200, help="Target tokens per chunk"),
    overlap: int = typer.Option(32, help="Tokens carried over between chunks"),
    collection: Optional[str] = typer.Option(None, help="Target collection (default: the worker's)"),
    replace: bool = typer.Option(False, help="Delete the chunks a document's earlier version had beyond its new "
                                 "ones (the embed workers re-embed only chunks whose text changed)"),
) -> None:
    """Chunk documents by tokens and publish ChunkEvents to the lane's topic (key = doc_id)."""
    from rich.progress import Progress

    from embedstream.engine.model_spec import resolve_model
    from embedstream.producers.chunker import Chunker
    from embedstream.producers.publisher import ChunkPublisher
    from embedstream.producers.sources import DocumentSource

    settings = Settings()
    logs.configure(json=settings.log_json)
    if lane not in ("online", "bulk"):
        raise typer.BadParameter("lane must be online or bulk")
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


@app.command(rich_help_panel=PANEL)
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

    settings = Settings()
    logs.configure(json=settings.log_json)
    with QueryClient(settings.kafka, start_timeout_s=timeout) as client:
        reply = client.embed(text, model=model, dimensions=dimensions, dtype=dtype, timeout_s=timeout)
    out = reply.model_dump()
    if reply.embedding is not None:
        out["embedding"] = reply.embedding[:show] + (["..."] if len(reply.embedding) > show else [])
    typer.echo(json.dumps(out, indent=2))
    raise typer.Exit(1 if reply.error else 0)


def parse_filters(items: list[str] | None) -> dict:
    """["lang=en", "year=2024", "tag=a", "tag=b"] -> {"lang": "en", "year": 2024, "tag": ["a", "b"]}."""
    out: dict = {}
    for item in items or []:
        field, sep, raw = item.partition("=")
        if not sep or not field.strip():
            raise typer.BadParameter(f"filter {item!r} is not field=value")
        try:
            value = json.loads(raw)
            if not isinstance(value, (str, int, float, bool)):
                value = raw
        except json.JSONDecodeError:
            value = raw
        field = field.strip()
        if field in out:
            previous = out[field] if isinstance(out[field], list) else [out[field]]
            out[field] = previous + [value]
        else:
            out[field] = value
    return out


@app.command(rich_help_panel=PANEL)
def search(
    text: str = typer.Argument(..., help="Query text"),
    collection: Optional[str] = typer.Option(None, help="Collection or alias (default: EMBEDSTREAM_QDRANT__COLLECTION, "
                                                        "the deployment's)"),
    top_k: int = typer.Option(50, help="Chunks retrieved by vector search"),
    top_n: int = typer.Option(10, help="Hits shown (after reranking)"),
    rerank: bool = typer.Option(True, "--rerank/--no-rerank", help="Rerank the retrieved chunks with the cross-encoder"),
    filter: Optional[list[str]] = typer.Option(None, "--filter", help="Payload filter field=value; repeat (same field: any of)"),
    mode: str = typer.Option("dense", help="dense | hybrid (dense and sparse searches fused; the collection needs its "
                                           "sparse vector)"),
    fusion: str = typer.Option(DEFAULT_FUSION, help=f"hybrid: how the lists are fused: {' | '.join(FUSIONS)} "
                                                    "(docs/fusion.md)"),
    dense_limit: Optional[int] = typer.Option(None, help="hybrid: candidates of the dense search (default top-k)"),
    sparse_limit: Optional[int] = typer.Option(None, help="hybrid: candidates of the sparse search (default top-k)"),
    timeout: float = typer.Option(30.0, help="Seconds to wait for the reply"),
    width: int = typer.Option(90, help="Characters of chunk text shown"),
    as_json: bool = typer.Option(False, "--json", help="Print the reply as JSON (for scripts)"),
) -> None:
    """Embed -> vector search [-> rerank] through Kafka request-reply; print the hits and every stage's time.

    The search goes to the deployment writing its collection (``producers/search_routing.py``): its embed
    workers answer in vector order, or hand a search asking for a rerank to the rerank workers while one runs."""
    import uuid

    from rich.table import Table

    from embedstream.producers.query_client import QueryClient
    from embedstream.producers.search_routing import route, unanswered
    from embedstream.schemas.events import now_ms
    from embedstream.schemas.rerank import SearchReply, SearchRequest

    settings = Settings()
    logs.configure(json=settings.log_json)
    filters = parse_filters(filter)
    with QueryClient(settings.kafka) as client:
        sent = now_ms()
        try:
            request = SearchRequest(request_id=uuid.uuid4().hex, query=text, collection=collection, top_k=top_k,
                                    top_n=top_n, filters=filters, rerank=rerank, mode=mode, fusion=fusion,
                                    dense_limit=dense_limit, sparse_limit=sparse_limit, reply_to=client.reply_topic,
                                    deadline_ms=sent + int(timeout * 1000), sent_at_ms=sent)
        except ValidationError as exc:
            typer.echo(f"invalid search: {exc.errors()[0]['loc'][-1]}: {exc.errors()[0]['msg']}", err=True)
            raise typer.Exit(2) from None
        topic, request = route(settings.kafka, settings.qdrant.collection, request)
        try:
            reply = client.request(topic, request, SearchReply, timeout_s=timeout)
        except TimeoutError:
            typer.echo(unanswered(topic, request.collection, timeout), err=True)
            raise typer.Exit(2) from None
        round_trip = now_ms() - sent
    if as_json:
        typer.echo(reply.model_dump_json(indent=2))
        raise typer.Exit(1 if reply.error else 0)
    console = logs.console()
    if reply.error is not None:
        console.print(f"[red]{reply.error.code}[/red]: {reply.error.message}")
        raise typer.Exit(1)
    table = Table(title=f"{len(reply.hits)} hits from {reply.collection!r}"
                        + (f", reranked by {reply.model}" if reply.model else " (vector order)"))
    for col in ("rank", "rerank", "vector", "doc_id", "chunk", "text"):
        table.add_column(col, justify="right" if col in ("rank", "rerank", "vector", "chunk") else "left",
                         overflow="fold" if col == "text" else "ellipsis")
    for hit in reply.hits:
        snippet = hit.text if len(hit.text) <= width else hit.text[: width - 1] + "…"
        table.add_row(str(hit.rank), "-" if hit.rerank_score is None else f"{hit.rerank_score:.4f}",
                      f"{hit.vector_score:.4f}", str(hit.doc_id), str(hit.chunk_id), snippet)
    console.print(table)
    stages = ["queue_wait", "embed", "sparse", "search", "rerank", "total"]
    times = "  ".join(f"{s} {reply.timings_ms[s]:.1f} ms" for s in stages if s in reply.timings_ms)
    console.print(f"stages: {times}  |  round trip {round_trip} ms")


@app.command(rich_help_panel=PANEL)
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

    settings = Settings()
    logs.configure(json=settings.log_json)
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


@app.command(rich_help_panel=PANEL)
def demo(
    docs: int = typer.Option(150, help="Sample documents to index"),
    port: BrokerPort = BROKER_PORT,
) -> None:
    """End to end: local broker, embed worker, bulk indexing with progress, queries by request-reply."""
    from embedstream.demo import run_demo

    logs.configure(level="WARNING")
    run_demo(docs, port)
