"""The `embedstream plan` command: flags in, :func:`build_plan`, :func:`render` out; bad input exits 2."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from embedstream.plan.arithmetic import build_plan
from embedstream.plan.inputs import PlanError
from embedstream.plan.render import render


def plan_command(
    chunks: Optional[int] = typer.Option(None, "--chunks", help="Indexing: number of chunks to embed"),
    tokens: Optional[float] = typer.Option(None, "--tokens", help="Indexing: average tokens per chunk"),
    tokens_per_s: Optional[float] = typer.Option(None, "--tokens-per-s", help="Indexing: measured tokens/s per device"),
    devices: int = typer.Option(1, "--devices", help="Indexing: devices working in parallel"),
    price_per_device_hour: float = typer.Option(2.0, "--price-per-device-hour", help="$ per device-hour"),
    qps: Optional[float] = typer.Option(None, "--qps", help="Serving: queries per second"),
    candidates: int = typer.Option(50, "--candidates", help="Serving: passages reranked per query"),
    pairs_per_s: Optional[float] = typer.Option(None, "--pairs-per-s", help="Serving: measured rerank pairs/s per device"),
    texts_per_s: Optional[float] = typer.Option(None, "--texts-per-s", help="Serving: measured query embeddings/s per device"),
    headroom: float = typer.Option(0.7, "--headroom", help="Usable fraction of measured throughput, (0, 1]"),
    vectors: Optional[int] = typer.Option(None, "--vectors", help="Storage: number of stored vectors"),
    dims: Optional[int] = typer.Option(None, "--dims", help="Storage: full embedding size"),
    mrl: Optional[str] = typer.Option(None, "--mrl", help="Storage: Matryoshka sizes, e.g. 256,128"),
    from_bench: Optional[Path] = typer.Option(
        None, "--from-bench",
        help='JSON object {"tokens_per_s", "pairs_per_s", "texts_per_s"} (any subset, per device); flags override it'),
    stage_ms: Optional[str] = typer.Option(
        None, "--stage-ms", help="Per-request ms as STAGE=MS, stages queue, embed, search, rerank, llm; e.g. embed=5,search=4,rerank=40"),
    lag_thresholds: bool = typer.Option(
        False, "--lag-thresholds", help="Autoscaling: KEDA lagThreshold per lane and topic from the measured throughputs "
                                        "(per worker) and --tokens, --candidates, --events-per-s"),
    events_per_s: Optional[float] = typer.Option(None, "--events-per-s", help="Autoscaling: measured CDC bridge change events/s per worker"),
    online_tokens_per_s: Optional[float] = typer.Option(
        None, "--online-tokens-per-s", help="Autoscaling: measured tokens/s of an online-lane worker (its threads and "
                                           "precision; default --tokens-per-s)"),
    drain_s: Optional[str] = typer.Option(
        None, "--drain-s", help="Autoscaling: seconds a lane's backlog may take to drain, LANE=S for online, bulk, "
                                "rerank, cdc (default online=2,bulk=300,rerank=2,cdc=10)"),
    helm_values: Optional[Path] = typer.Option(
        None, "--helm-values", help="Autoscaling: also write the thresholds as a Helm values file "
                                    "(helm install -f FILE; implies --lag-thresholds)"),
) -> None:
    """Indexing time and cost, serving device counts, vector storage, per-stage request latency/cost and KEDA lag thresholds."""
    try:
        plan = build_plan(
            chunks=chunks, tokens=tokens, tokens_per_s=tokens_per_s, devices=devices,
            price_per_device_hour=price_per_device_hour, qps=qps, candidates=candidates,
            pairs_per_s=pairs_per_s, texts_per_s=texts_per_s, headroom=headroom, vectors=vectors,
            dims=dims, mrl=mrl, from_bench=from_bench, stage_ms=stage_ms,
            lag_thresholds=lag_thresholds or helm_values is not None, events_per_s=events_per_s, drain_s=drain_s,
            online_tokens_per_s=online_tokens_per_s,
        )
        if helm_values is not None:
            plan.autoscaling.write_values(helm_values)
    except PlanError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    render(plan)
    if helm_values is not None:
        typer.echo(f"wrote {helm_values}: helm upgrade --install ... -f {helm_values}")
