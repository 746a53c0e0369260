"""`embedstream bench …`: benchmarks that print side-by-side tables.

Each command imports its bench module (torch, Kafka, Qdrant) only when it runs, so `--help` stays fast.
"""

from __future__ import annotations

from typing import Optional

import typer

from embedstream import logs
from embedstream.commands.options import BROKER_PORT, BrokerPort

def _broker(port: int):
    """The local broker for one benchmark: a running one is used and left running, one started is stopped
    however the benchmark ends (each bench module starts it when none answers: ``devkafka.borrowed``)."""
    from embedstream import devkafka

    return devkafka.borrowed(port=port)


app = typer.Typer(no_args_is_help=True, help="Benchmarks that print side-by-side tables.")


@app.command("engine")
def bench_engine(
    model: str = typer.Option("all-MiniLM-L6-v2", help="Registry name or local folder"),
    threads: list[int] = typer.Option([1, 2], help="torch threads; repeat the flag for several"),
    texts: int = typer.Option(600, help="Corpus size"),
    repeats: int = typer.Option(3, help="Timed runs per method, taken in turns (median reported)"),
    no_baselines: bool = typer.Option(False, "--no-baselines", help="Only embedstream"),
    no_peers: bool = typer.Option(False, "--no-peers", help="Leave out the OpenVINO / ONNX Runtime rows"),
    precision: Optional[list[str]] = typer.Option(
        None, help="Extra approximate rows (int8, bfloat16); default: int8, plus bfloat16 where the CPU has it"
    ),
    device: Optional[str] = typer.Option(
        None, help="auto, cpu or cuda for embedstream and the baselines (default: the engine settings'); "
        "on cuda the default extra row is bfloat16"
    ),
    floor: Optional[list[str]] = typer.Option(
        None, help="A precision-tuned row per quality floor, and the frontier (default: the settings' floor and "
        "exact; 'none' leaves them out)"
    ),
) -> None:
    """Engine throughput vs sentence-transformers and naive padded batches, one corpus, one run; the tuned
    paths on the speed / quality frontier."""
    from embedstream.bench import engine_bench

    if device not in (None, "auto", "cpu", "cuda"):
        raise typer.BadParameter(f"device must be auto, cpu or cuda, got {device!r}")
    rows, facts = engine_bench.run(model, threads, texts, repeats, baselines=not no_baselines, precisions=precision,
                                   peers=not no_peers, device=device,
                                   floors=[] if floor == ["none"] else floor)
    engine_bench.print_table(rows, facts)


@app.command("pipeline")
def bench_pipeline(
    docs: int = typer.Option(300, help="Sample documents in each bulk backlog"),
    queries: int = typer.Option(200, help="Round trips measured idle and under backlog"),
    port: BrokerPort = BROKER_PORT,
    online_threads: int = typer.Option(1, help="torch threads of the online worker process"),
    online_precision: str = typer.Option("fast", help="Precision of the online worker (auto: exact float32 on CPU)"),
    bulk_nice: int = typer.Option(10, help="CPU niceness of the bulk worker process (0: same priority)"),
    warmup: int = typer.Option(150, help="Round trips before measuring (fresh topics and clients warm up)"),
    rounds: int = typer.Option(3, help="Throughput rounds (engine alone, then end to end); the ratio is their median"),
) -> None:
    """Bulk chunks/s Kafka -> Qdrant vs the engine alone; query round trips idle and under backlog."""
    from embedstream.bench import pipeline_bench

    logs.configure(level="WARNING")
    with _broker(port):
        result = pipeline_bench.run(docs, queries, port, online_threads, bulk_nice, warmup, rounds, online_precision)
    pipeline_bench.print_table(result)


@app.command("stall")
def bench_stall(
    mode: list[str] = typer.Option(["fail", "block"], help="fail (writes raise) | block (writes hang); repeat for both"),
    chunks: int = typer.Option(20000, help="Chunks in the bulk backlog"),
    words: int = typer.Option(60, help="Words per chunk (about 80 tokens)"),
    warmup: float = typer.Option(8.0, help="Seconds of normal draining before the stall"),
    stall: float = typer.Option(30.0, help="Seconds the sink stalls"),
    recover: float = typer.Option(10.0, help="Seconds sampled after the sink recovers"),
    port: BrokerPort = BROKER_PORT,
) -> None:
    """Memory under a stalled sink: RSS, queued tokens, paused consumer, committed offsets, every second."""
    from embedstream.bench import stall_bench

    bad = [m for m in mode if m not in stall_bench.MODES]
    if bad:
        raise typer.BadParameter(f"mode must be one of {stall_bench.MODES}, got {bad}")
    logs.configure(level="ERROR")
    with _broker(port):
        results = stall_bench.run(mode, port, chunks, words, warmup, stall, recover)
    stall_bench.print_results(results)


@app.command("rerank")
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


@app.command("latency")
def bench_latency(
    rate: Optional[list[float]] = typer.Option(None, help="Offered query rates (QPS), repeat the flag; default: "
                                                           "10 25 50 75 100 150 200 (quick: 10 25 50 100)"),
    rerank_rate: Optional[list[float]] = typer.Option(None, help="Offered rerank rates; default 0.25 0.5 1 1.5 2 3 "
                                                                 "(quick: 0.5 1 2)"),
    policy: Optional[list[str]] = typer.Option(None, help="fixed-0 fixed-2 fixed-5 fixed-10 aimd deadline (default: all)"),
    step_s: Optional[float] = typer.Option(None, help="Seconds per offered rate (default 6, quick 3)"),
    max_requests: int = typer.Option(2000, help="Most requests per step"),
    target_ms: Optional[float] = typer.Option(None, help="Query p95 target (default: EMBEDSTREAM_WORKER__LATENCY_TARGET_MS)"),
    rerank_target_ms: float = typer.Option(1000.0, help="Rerank p95 target (50 candidates: 250-700 ms of compute on "
                                                        "1 thread of this shared 2-vCPU host)"),
    deadline_ms: Optional[float] = typer.Option(None, help="Deadline each query carries (default: the target)"),
    no_backlog: bool = typer.Option(False, "--no-backlog", help="Only idle workers (no bulk backlog steps)"),
    no_rerank: bool = typer.Option(False, "--no-rerank", help="Leave out the rerank worker"),
    quick: bool = typer.Option(False, "--quick", help="Fewer rates, shorter steps"),
    out: str = typer.Option("bench-results", help="Folder for the table (JSON) and the PNG"),
    port: BrokerPort = BROKER_PORT,
) -> None:
    """Open-loop query load at stepped rates per batching policy, idle and under a bulk backlog: p95 curves, shed %."""
    from embedstream.bench import latency_bench
    from embedstream.config import Settings

    logs.configure(level="WARNING")
    bad = [p for p in policy or [] if p not in latency_bench.POLICIES]
    if bad:
        raise typer.BadParameter(f"policy must be among {list(latency_bench.POLICIES)}, got {bad}")
    with _broker(port):
        result = latency_bench.run(
            rate or ([10, 25, 50, 100] if quick else [10, 25, 50, 75, 100, 150, 200]),
            rerank_rate or ([0.5, 1, 2] if quick else [0.25, 0.5, 1, 1.5, 2, 3]), policy or list(latency_bench.POLICIES),
            port=port, step_s=step_s or (3.0 if quick else 6.0), rerank_step_s=(6.0 if quick else 10.0),
            max_requests=max_requests, target_ms=target_ms or Settings().worker.latency_target_ms,
            rerank_target_ms=rerank_target_ms, deadline_ms=deadline_ms, backlog=not no_backlog, rerank=not no_rerank,
            out_dir=out, warmup=60 if quick else 120)
    latency_bench.print_table(result)


@app.command("cdc")
def bench_cdc(
    mix: Optional[list[str]] = typer.Option(None, help="Change mix, repeat the flag: flips (status of short rows), "
                                            "long-flips (status of 20 KB rows), edits (one sentence of 20 KB rows), "
                                            "rewrites (whole text of short rows); default all four"),
    rate: Optional[list[float]] = typer.Option(None, help="Row changes per second for every mix, repeat the flag; "
                                               "default per mix: flips 20 50 100 200 300, long-flips 5 10 20 50, "
                                               "edits 1 2 5 10, rewrites 1 2 5 10 20"),
    step_s: float = typer.Option(10.0, help="Seconds per rate"),
    writers: int = typer.Option(4, min=1, help="Writer processes, each on its own PostgreSQL connection, committing "
                                "one UPDATE per transaction; together they make the rate"),
    backlog_docs: int = typer.Option(400, help="Documents put on the bulk lane before each backlog step (0: idle only)"),
    target_ms: float = typer.Option(1000.0, help="The p95 freshness target the summary line reports against"),
    port: BrokerPort = BROKER_PORT,
    pg_port: int = typer.Option(5432, help="Port of the dev PostgreSQL (started when not running)"),
    rest_port: int = typer.Option(8083, help="Port of the dev Connect worker's REST API"),
    out: str = typer.Option("bench-results", help="Folder for the table (JSON) and the PNG"),
) -> None:
    """CDC freshness and cost by change mix on the real rig: COMMIT in PostgreSQL -> readable in Qdrant,
    p50/p95/p99, forward passes per change and each stage's p50/p95 and share (COMMIT -> Debezium -> Kafka ->
    bridge -> embed worker -> store write -> searchable) at stepped rates, idle and while a bulk backlog
    drains; after each mix, whether the index equals the table."""
    from embedstream.bench import cdc_bench

    try:
        cdc_bench.check_mixes(mix)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--mix") from None
    logs.configure(level="WARNING")
    cdc_bench.print_table(cdc_bench.run(rate, step_s, backlog_docs, port, pg_port, rest_port, target_ms, out,
                                        mixes=mix, writers=writers))


@app.command("cdc-settings")
def bench_cdc_settings(
    rate: float = typer.Option(200.0, help="Row changes per second"),
    step_s: float = typer.Option(10.0, help="Seconds of changes per setting"),
    idle_s: float = typer.Option(10.0, help="Seconds the Connect worker's CPU is measured with the connector idle"),
    writers: int = typer.Option(4, min=1, help="Writer processes, each on its own PostgreSQL connection"),
    port: BrokerPort = BROKER_PORT,
    pg_port: int = typer.Option(5432, help="Port of the dev PostgreSQL (started when not running)"),
    rest_port: int = typer.Option(8083, help="Port of the dev Connect worker's REST API"),
    out: str = typer.Option("bench-results", help="Folder for the table (JSON)"),
) -> None:
    """What each latency setting of the CDC rig buys: COMMIT -> the change record in Kafka (Debezium's part alone),
    p50/p95, with the rig's settings and one changed at a time (synchronous_commit, poll.interval.ms, Connect's
    producer linger), and the Connect worker's CPU idle and busy, in one run."""
    from embedstream.bench import cdc_settings

    logs.configure(level="WARNING")
    cdc_settings.print_table(cdc_settings.run(rate, step_s, idle_s, writers, port, pg_port, rest_port, out))


@app.command("quality")
def bench_quality(
    model: str = typer.Option("all-MiniLM-L6-v2", help="Embedding model (registry name or folder)"),
    queries: int = typer.Option(200, help="Held-out paragraphs used as queries"),
    k: int = typer.Option(10, help="recall@k"),
    rescore: int = typer.Option(4, help="Rescoring pass: k x this many candidates rescored on float32"),
    threads: Optional[int] = typer.Option(None, help="torch threads for the (cached) embedding run"),
    hybrid: bool = typer.Option(False, "--hybrid", help="Dense vs BM25 vs SPLADE vs every fusion on labelled sets "
                                "(known-item + exact-term queries) per corpus, and the sparse vectors' bulk cost"),
    chunks: int = typer.Option(3000, help="--hybrid: indexed texts per corpus (at most)"),
    corpus: list[str] = typer.Option(["prose", "api"], help="--hybrid: prose (stdlib docstring chunks) and/or api "
                                     "(stdlib API reference records); repeat the flag"),
    reranker: Optional[str] = typer.Option(None, help="--hybrid: cross-encoder for the hybrid + rerank row"),
    cost_chunks: int = typer.Option(1000, min=1, help="--hybrid: chunks of the bulk-cost table (engine alone)"),
) -> None:
    """recall@k of float16 / int8 / uint8-as-stored / binary vs exact float32 on ≥10k real chunks, with and without
    rescoring; with --hybrid, MRR@k and recall@k of dense, sparse and hybrid retrieval."""
    logs.configure(level="WARNING")
    if hybrid:
        from embedstream.bench import hybrid_bench

        from embedstream.bench import hybrid_set

        bad = [c for c in corpus if c not in hybrid_set.CORPORA]
        if bad:
            raise typer.BadParameter(f"unknown corpus {bad[0]!r}; choose from {', '.join(hybrid_set.CORPORA)}")
        hybrid_bench.print_table(hybrid_bench.run(model, chunks, queries, queries, k, threads or 1, reranker=reranker,
                                                  cost_chunks=cost_chunks, corpora=tuple(corpus)))
        return
    from embedstream.bench import quality_bench

    quality_bench.print_table(quality_bench.run(model, queries, k, rescore, threads))


@app.command("fusion")
def bench_fusion(
    model: str = typer.Option("all-MiniLM-L6-v2", help="Embedding model (registry name or folder)"),
    tune: str = typer.Option("api", help="Corpus the unit and the dense scale are chosen on (prose, api or numpy)"),
    report: list[str] = typer.Option(["prose", "numpy"], help="Corpora the choice is reported on, never used for "
                                     "choosing; repeat the flag"),
    chunks: int = typer.Option(3000, help="Indexed texts per corpus (at most)"),
    queries: int = typer.Option(200, help="Queries of each kind (known-item, exact-term, long) per corpus"),
    threads: Optional[int] = typer.Option(1, help="torch threads for the (cached) embedding run"),
) -> None:
    """The default hybrid fusion's sparse unit and dense scale: swept on one corpus, reported on another (every
    query through the searcher's own hybrid path; docs/fusion.md)."""
    from embedstream.bench import fusion_bench, hybrid_set

    for name in (tune, *report):
        if name not in hybrid_set.CORPORA:
            raise typer.BadParameter(f"unknown corpus {name!r}; choose from {', '.join(hybrid_set.CORPORA)}")
    if tune in report:
        raise typer.BadParameter("--report must name other corpora than --tune (never used for choosing)")
    logs.configure(level="WARNING")
    fusion_bench.print_table(fusion_bench.run(model, tune, tuple(report), chunks, queries, threads))


@app.command("exact")
def bench_exact(
    url: str = typer.Option(..., help="A Qdrant server (http://127.0.0.1:6333); the bench writes and drops the "
                            "collection embedstream-exact-bench there"),
    chunks: int = typer.Option(20_000, help="Real chunks written (enough to pass the server's indexing threshold)"),
    queries: int = typer.Option(1000, help="Queries asked (the labelled queries of bench fusion's report sets)"),
    threads: Optional[int] = typer.Option(1, help="torch threads for the (cached) embedding run"),
    wait: float = typer.Option(900.0, help="Seconds to wait for the server to index the collection"),
) -> None:
    """A Qdrant server's top-10 (HNSW above its indexing threshold) against exact search and the embedded store,
    dense and hybrid, through the searcher (docs/fusion.md)."""
    from embedstream.bench import hybrid_server_bench

    logs.configure(level="WARNING")
    hybrid_server_bench.print_table(hybrid_server_bench.run(url, chunks, queries, threads=threads, wait_s=wait))


@app.command("host")
def bench_host(
    chunks: int = typer.Option(20_000, help="~200-token chunks in the tiny model's backlog"),
    minilm_chunks: int = typer.Option(2_000, help="Chunks in all-MiniLM-L6-v2's backlog"),
    processes: list[int] = typer.Option([1, 2], help="Worker processes in one consumer group; repeat the flag"),
    model: list[str] = typer.Option(["tiny", "minilm"], help="tiny (2-layer, hidden-32 BERT with MiniLM's tokenizer: "
                                                              "measures the host path) and/or minilm"),
    quick: bool = typer.Option(False, "--quick", help="CI-size smoke: 600 tiny chunks, 100 MiniLM chunks, 1 process"),
    timeout: float = typer.Option(900.0, help="Seconds one run may take (start-up included) before the bench fails"),
    port: BrokerPort = BROKER_PORT,
) -> None:
    """Kafka -> worker -> Qdrant chunks/s and tokens/s, text vs pre-tokenized events, 1 and 2 processes, vs the engine alone."""
    from embedstream.bench import host_bench

    bad = [m for m in model if m not in host_bench.MODELS]
    if bad:
        raise typer.BadParameter(f"model must be one of {host_bench.MODELS}, got {bad}")
    if quick:
        chunks, minilm_chunks, processes = min(chunks, 600), min(minilm_chunks, 100), [1]
    logs.configure(level="WARNING")
    with _broker(port):
        result = host_bench.run(chunks, minilm_chunks, tuple(processes), port, tuple(model), timeout_s=timeout)
    host_bench.print_table(result)


@app.command("transport")
def bench_transport(
    count: int = typer.Option(200, help="Timed round trips per client pair (after 30 untimed)"),
    gap_ms: float = typer.Option(20.0, help="Pause between requests (one at a time, as an online lane's traffic)"),
    port: BrokerPort = BROKER_PORT,
) -> None:
    """One request-reply round trip through the broker, kafka-python vs librdkafka on each side."""
    from embedstream.bench import transport_bench

    if count < 1 or gap_ms < 0:
        raise typer.BadParameter("count must be at least 1 and gap-ms not negative")
    logs.configure(level="WARNING")
    with _broker(port):
        rows = transport_bench.run(port, count, gap_ms)
    transport_bench.print_table(rows)


@app.command("fleet")
def bench_fleet(
    port: int = typer.Option(9192, "--port", help="First port of the 3-broker dev cluster (nodes on PORT..PORT+5; "
                                                  "workers' metrics on PORT+10.. ); one answering there is used"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="The cluster's folder (default: "
                                           "$EMBEDSTREAM_KAFKA_DATA_DIR, else ~/.cache/embedstream/kafka-data/PORT)"),
    protocol: list[str] = typer.Option(list(("consumer", "cooperative-sticky", "eager")),
                                       help="Rebalance protocols to measure; repeat the flag for several"),
    rate: float = typer.Option(30.0, help="Most chunks/s the producer adds to keep the backlog"),
    backlog: int = typer.Option(300, help="Chunks kept in the bulk backlog (published, not yet committed)"),
    qps: float = typer.Option(10.0, help="Queries/s on the online lane throughout"),
    client: list[str] = typer.Option(["librdkafka"], help="Bulk lane client(s): librdkafka, kafka-python (no KIP-848 "
                                                           "client: its consumer row is left out)"),
    out: Optional[str] = typer.Option(None, help="Also write the rows as JSON to this file"),
    failover: str = typer.Option("on", help="on: also kill -9 the leader of most query and reply partitions under "
                                            "20 queries/s (QueryClient, then a gateway); off; only: that alone"),
) -> None:
    """Bulk lane group changes on a 3-broker cluster (1 -> 3 -> 1 workers, kill -9 of a member, a rolling restart
    with static membership), per rebalance protocol: pause, query p95, chunks lost and re-embedded; then a
    broker failover under queries: answered %, the reply gap, p99 recovery."""
    from embedstream.bench import fleet_bench

    bad = [p for p in protocol if p not in fleet_bench.PROTOCOLS]
    if bad:
        raise typer.BadParameter(f"protocol must be one of {fleet_bench.PROTOCOLS}, got {bad}")
    logs.configure(level="WARNING")
    if any(c not in ("librdkafka", "kafka-python") for c in client):
        raise typer.BadParameter(f"client must be librdkafka or kafka-python, got {client}")
    from pathlib import Path

    if failover not in ("on", "off", "only"):
        raise typer.BadParameter(f"failover must be on, off or only, got {failover!r}")
    def say(line: str) -> None:
        typer.echo(line, err=True)

    if failover != "only":
        result = fleet_bench.run(port, data_dir, protocol, rate, backlog, qps, clients=client,
                                 out=Path(out) if out else None, say=say)
        fleet_bench.print_table(result)
    if failover != "off":
        from embedstream.bench import failover_bench

        rows = failover_bench.run(port, data_dir, say=say, out=Path(out).with_suffix(".failover.json") if out else None)
        failover_bench.print_rows(rows)


@app.command("lookup")
def bench_lookup(
    chunks: int = typer.Option(2000, help="Chunks of the one document"),
    batch: int = typer.Option(56, help="Chunks per batch (a lookup each)"),
    url: Optional[str] = typer.Option(None, help="A Qdrant server (http://host:port); default: the embedded store "
                                      "in a temporary folder"),
) -> None:
    """The unchanged-chunk lookup's time and points read per batch as one long document is sent (whole, then with
    a paragraph inserted), beside the whole-document read it replaced; the weights' hash at start."""
    from embedstream.bench import lookup_bench

    logs.configure(level="WARNING")
    lookup_bench.main(chunks, batch, url)
