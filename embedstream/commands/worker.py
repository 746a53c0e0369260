"""`embedstream worker embed|rerank|cdc`: the long-running Kafka workers, each until SIGTERM."""

from __future__ import annotations

import os
from typing import Optional

import typer

from embedstream import logs
from embedstream.config import Settings

app = typer.Typer(no_args_is_help=True, help="Long-running Kafka workers (each runs until SIGTERM).")


@app.command("embed")
def worker_embed(
    lanes: str = typer.Option("online,bulk", help="online, bulk or both (each lane has its own consumer group)"),
    model: Optional[str] = typer.Option(None, help="Model served (default: settings.default_model)"),
    metrics_port: int = typer.Option(9400, help="Port of /metrics, /healthz, /readyz (0: off)"),
    threads: Optional[int] = typer.Option(None, help="torch threads (one per process often wins under load)"),
    skip_unchanged: Optional[bool] = typer.Option(
        None, "--skip-unchanged/--no-skip-unchanged",
        help="Run no forward pass for a chunk the store already holds: same text and model in its point (the "
             "payload is rewritten when the metadata changed) or in another point of its document (those vectors are "
             "used); docs/incremental.md (default: EMBEDSTREAM_WORKER__SKIP_UNCHANGED, true)"),
    nice: int = typer.Option(0, help="Lower this process's CPU priority by N (e.g. 10 for a bulk worker sharing "
                                     "cores with an online one: the bench's query p95 under backlog fell from 35-41 to 24-31 ms)"),
    search: bool = typer.Option(True, "--search/--no-search",
                                help="Also answer search requests on the store this worker writes (vector order; "
                                     "rerank requests are left to the rerank workers while any run)"),
) -> None:
    """Consume chunk and query topics, embed in token-budget batches, upsert into Qdrant, reply to queries."""
    from embedstream.workers.runtime import build_embed_worker
    from embedstream.workers.serve import run_until_signalled

    settings = Settings()
    logs.configure(json=settings.log_json)
    if nice:
        os.nice(nice)
    if threads:
        settings.engine.threads = threads
    if skip_unchanged is not None:  # flags override EMBEDSTREAM_WORKER__*, they do not replace it
        settings.worker.skip_unchanged = skip_unchanged
    chosen = tuple(lane.strip() for lane in lanes.split(",") if lane.strip())
    bad = [lane for lane in chosen if lane not in ("online", "bulk")]
    if bad or not chosen:
        raise typer.BadParameter(f"lanes must be online and/or bulk, got {lanes!r}")
    from embedstream.workers.claim import CollectionClaim, claim_store

    # one owner per collection (workers/claim.py): refused before the model loads
    CollectionClaim(settings.kafka, settings.qdrant.collection, claim_store(settings.qdrant)).check()
    worker = build_embed_worker(settings, chosen, model)
    companions = ()
    if search:  # on the store the worker writes: the embedded one belongs to this process
        from embedstream.workers.vector_search import VectorSearchWorker

        companions = (VectorSearchWorker(settings, worker.sink.store, worker.engine.spec.name, worker.metrics),)
    run_until_signalled(worker, metrics_port or None, companions=companions)


@app.command("rerank")
def worker_rerank(
    model: str = typer.Option(..., help="Cross-encoder served: registry name or local model folder"),
    embed_model: Optional[str] = typer.Option(
        None, help="In-process query embedder for search requests (default: settings.default_model)"
    ),
    max_candidates: Optional[int] = typer.Option(
        None, min=1, help="Most candidates per rerank request, more: refused, or cut when cut=true "
                          "(default: EMBEDSTREAM_WORKER__MAX_CANDIDATES, 50)"),
    metrics_port: int = typer.Option(9400, help="Port of /metrics, /healthz, /readyz on 0.0.0.0 (0: off)"),
    threads: Optional[int] = typer.Option(None, help="torch threads"),
    search: bool = typer.Option(True, "--search/--no-search",
                                help="Also serve the search topic (needs the vector store: a Qdrant URL for shared use)"),
    remote_embed: bool = typer.Option(False, "--remote-embed",
                                      help="Embed search queries through the embed workers over Kafka instead of in-process"),
) -> None:
    """Consume rerank and search requests, score candidates in packed cross-encoder passes, reply; runs until SIGTERM."""
    from embedstream.workers.runtime import build_rerank_worker
    from embedstream.workers.serve import run_until_signalled

    settings = Settings()
    logs.configure(json=settings.log_json)
    if threads:
        settings.engine.threads = threads
    if max_candidates is not None:
        settings.worker.max_candidates = max_candidates
    worker = build_rerank_worker(settings, model, embed_model, search=search, remote_embed=remote_embed)
    run_until_signalled(worker, metrics_port or None)


@app.command("cdc")
def worker_cdc(
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
    instance_id: Optional[str] = typer.Option(
        None, help="Static group member id (one per bridge process): a bridge restarted under it takes its "
                   "partitions back at once instead of waiting out the dead one's session (10 s)"),
    unavailable_placeholder: str = typer.Option(
        "__debezium_unavailable_value", help="The connector's unavailable.value.placeholder (unchanged TOASTed "
                                             "values): filled in from the documents log, never indexed"),
    metrics_port: int = typer.Option(9401, help="Port of /metrics, /healthz, /readyz (0: off)"),
) -> None:
    """Apply Debezium change events: c/r/u re-chunk and publish (unchanged chunks are not re-embedded), d/tombstone delete."""
    from embedstream.engine.model_spec import resolve_model
    from embedstream.producers.chunker import Chunker
    from embedstream.producers.debezium import CdcConfig
    from embedstream.workers.cdc_bridge import CdcBridge, CdcOptions
    from embedstream.workers.serve import run_until_signalled

    settings = Settings()
    logs.configure(json=settings.log_json)
    if lane not in ("online", "bulk"):
        raise typer.BadParameter("lane must be online or bulk")
    if on_truncate not in ("dead-letter", "ignore"):
        raise typer.BadParameter("on-truncate must be dead-letter or ignore")
    fields = tuple(f.strip() for f in text_fields.split(",") if f.strip())
    if not fields:
        raise typer.BadParameter("give at least one text field")
    config = CdcConfig(id_field, fields, tuple(f.strip() for f in metadata_fields.split(",") if f.strip()),
                       unavailable_placeholder=unavailable_placeholder)
    spec = resolve_model(model or settings.default_model, settings.models)
    options = CdcOptions(topic, config, lane=lane, collection=collection, on_truncate=on_truncate, group=group,
                         instance_id=instance_id)
    bridge = CdcBridge(settings, Chunker.for_model(spec, chunk_tokens, overlap), options)
    run_until_signalled(bridge, metrics_port or None)
