"""Command functions of the rerank side: `worker rerank`, `search`, `bench rerank`, `bench quality`.

They are plain typer command functions; ``embedstream/cli.py`` registers them (see :func:`register`).
Heavy imports (torch, Kafka, Qdrant) happen inside the commands so ``embedstream --help`` stays fast.
"""

from __future__ import annotations

import json
from typing import Optional

import typer

from embedstream import logs
from embedstream.config import Settings


def worker_rerank(
    model: str = typer.Option(..., help="Cross-encoder served: registry name or local model folder"),
    embed_model: Optional[str] = typer.Option(
        None, help="In-process query embedder for search requests (default: settings.default_model)"
    ),
    max_candidates: int = typer.Option(50, help="Most candidates per rerank request (more: refused, or cut when cut=true)"),
    metrics_port: int = typer.Option(9400, help="Port of /metrics, /healthz, /readyz on 0.0.0.0 (0: off)"),
    threads: Optional[int] = typer.Option(None, help="torch threads"),
    search: bool = typer.Option(True, "--search/--no-search",
                                help="Also serve the search topic (needs the vector store: a Qdrant URL for shared use)"),
    remote_embed: bool = typer.Option(False, "--remote-embed",
                                      help="Embed search queries through the embed workers over Kafka instead of in-process"),
) -> None:
    """Consume rerank and search requests, score candidates in packed cross-encoder passes, reply; runs until SIGTERM."""
    from embedstream.workers.rerank_worker import RerankOptions, build_rerank_worker, run_until_signalled

    logs.configure()
    settings = Settings()
    if threads:
        settings.engine.threads = threads
    if max_candidates < 1:
        raise typer.BadParameter("max_candidates must be at least 1")
    options = RerankOptions(max_candidates=max_candidates, default_collection=settings.qdrant.collection,
                            batch_window_ms=settings.kafka.online_batch_window_ms)
    worker = build_rerank_worker(settings, model, embed_model, options=options, search=search, remote_embed=remote_embed)
    run_until_signalled(worker, metrics_port or None)


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


def search(
    text: str = typer.Argument(..., help="Query text"),
    collection: Optional[str] = typer.Option(None, help="Collection or alias (default: the worker's)"),
    top_k: int = typer.Option(50, help="Chunks retrieved by vector search"),
    top_n: int = typer.Option(10, help="Hits shown (after reranking)"),
    rerank: bool = typer.Option(True, "--rerank/--no-rerank", help="Rerank the retrieved chunks with the cross-encoder"),
    filter: Optional[list[str]] = typer.Option(None, "--filter", help="Payload filter field=value; repeat (same field: any of)"),
    timeout: float = typer.Option(30.0, help="Seconds to wait for the reply"),
    width: int = typer.Option(90, help="Characters of chunk text shown"),
) -> None:
    """Retrieve -> rerank through the rerank workers (Kafka request-reply); print the hits and every stage's time."""
    import uuid

    from rich.table import Table

    from embedstream.producers.query_client import QueryClient
    from embedstream.schemas.events import now_ms
    from embedstream.schemas.rerank import SearchReply, SearchRequest

    logs.configure()
    settings = Settings()
    filters = parse_filters(filter)
    with QueryClient(settings.kafka) as client:
        sent = now_ms()
        request = SearchRequest(request_id=uuid.uuid4().hex, query=text, collection=collection, top_k=top_k, top_n=top_n,
                                filters=filters, rerank=rerank, reply_to=client.reply_topic,
                                deadline_ms=sent + int(timeout * 1000), sent_at_ms=sent)
        try:
            reply = client.request(settings.kafka.topic_search, request, SearchReply, timeout_s=timeout)
        except TimeoutError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2) from None
        round_trip = now_ms() - sent
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
    stages = ["queue_wait", "embed", "search", "rerank", "total"]
    times = "  ".join(f"{s} {reply.timings_ms[s]:.1f} ms" for s in stages if s in reply.timings_ms)
    console.print(f"stages: {times}  |  round trip {round_trip} ms")


def bench_rerank(
    model: Optional[str] = typer.Option(None, help="Cross-encoder (default: a MiniLM-sized one built once into the cache)"),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: all cores)"),
    requests: int = typer.Option(4, help="Rerank requests timed per method"),
    candidates: int = typer.Option(50, help="Candidates per request"),
    tokens: int = typer.Option(256, help="Mean passage length in tokens"),
    spread: int = typer.Option(64, help="Passage lengths vary by up to this many tokens either way"),
    no_baseline: bool = typer.Option(False, "--no-baseline", help="Skip sentence-transformers"),
    no_search: bool = typer.Option(False, "--no-search", help="Skip the full search path"),
    search_chunks: int = typer.Option(250, help="Real chunks indexed for the search path"),
    search_queries: int = typer.Option(8, help="Searches timed"),
    top_k: int = typer.Option(30, help="Search: chunks retrieved then reranked"),
    top_n: int = typer.Option(10, help="Search: hits kept"),
    store: str = typer.Option("memory", help="memory (qdrant-client :memory:) or edge (embedded qdrant-edge in a temp dir)"),
    chunk_tokens: int = typer.Option(128, help="Search: target tokens per indexed chunk"),
) -> None:
    """Cross-encoder pairs/s and request p50/p95 vs sentence-transformers, then the in-process search path by stage."""
    from embedstream.bench import rerank_bench

    logs.configure(level="WARNING")
    if store not in ("memory", "edge"):
        raise typer.BadParameter("store must be memory or edge")
    result = rerank_bench.run(model, threads, requests, candidates, tokens, spread, not no_baseline, not no_search,
                              search_chunks=search_chunks, search_queries=search_queries, top_k=top_k, top_n=top_n,
                              store=store, chunk_tokens=chunk_tokens)
    rerank_bench.print_table(result)


def bench_quality(
    model: str = typer.Option("all-MiniLM-L6-v2", help="Embedding model (registry name or folder)"),
    queries: int = typer.Option(200, help="Held-out paragraphs used as queries"),
    k: int = typer.Option(10, help="recall@k"),
    rescore: int = typer.Option(4, help="Rescoring pass: k x this many candidates rescored on float32"),
    threads: Optional[int] = typer.Option(None, help="torch threads for the (cached) embedding run"),
) -> None:
    """recall@k of float16 / int8 / uint8-as-stored / binary vs exact float32 on ≥10k real chunks, with and without rescoring."""
    from embedstream.bench import quality_bench

    logs.configure(level="WARNING")
    quality_bench.print_table(quality_bench.run(model, queries, k, rescore, threads))


def register(app: typer.Typer, bench_app: typer.Typer, worker_app: typer.Typer) -> None:
    """Attach the commands to embedstream's CLI groups."""
    worker_app.command("rerank")(worker_rerank)
    app.command("search")(search)
    bench_app.command("rerank")(bench_rerank)
    bench_app.command("quality")(bench_quality)
