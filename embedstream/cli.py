"""The `embedstream` command line, assembled from one module per command group (embedstream.commands).

    embedstream embed | score                    the engine on JSON lines (commands.engine)
    embedstream engine tune                      measure the engine's paths on this host (commands.engine)
    embedstream produce | query | search | reindex | demo
                                                 feed or ask a running pipeline (commands.pipeline)
    embedstream worker embed | rerank | cdc      long-running Kafka workers (commands.worker)
    embedstream bench …                          benchmarks (commands.bench)
    embedstream dev kafka start | stop | status  the local broker (commands.dev)
    embedstream dev compose | images …           the container engine, the compose images (commands.containers)
    embedstream schemas export                   JSON Schema of the wire (commands.schemas)
    embedstream plan                             capacity arithmetic (embedstream.plan.command)

Heavy imports (torch, Kafka, Qdrant) happen inside the commands, so `embedstream --help` stays fast.
"""

from __future__ import annotations

import typer

from embedstream.commands import bench, dev, engine, pipeline, schemas, worker
from embedstream.errors import CodedError
from embedstream.plan.command import plan_command

SERVICES = "Services (run until SIGTERM)"
TOOLING = "Measure, plan, develop"

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Streaming embeddings and reranking over Kafka.")
# Top-level commands outside a group are registered on these, so `--help` lists the panels in this order.
services_app = typer.Typer()
tooling_app = typer.Typer()
bench_app = bench.app  # other packages register their benchmarks here (bench gateway)

app.add_typer(engine.app)
app.add_typer(engine.tune_app, name="engine", rich_help_panel=engine.PANEL)
app.add_typer(pipeline.app)
app.add_typer(worker.app, name="worker", rich_help_panel=SERVICES)
app.add_typer(services_app)
app.add_typer(bench_app, name="bench", rich_help_panel=TOOLING)
app.add_typer(tooling_app)
app.add_typer(dev.app, name="dev", rich_help_panel=TOOLING)
app.add_typer(schemas.app, name="schemas", rich_help_panel=TOOLING)

tooling_app.command("plan", help="Indexing, serving and storage arithmetic fed by measured throughput.",
                    rich_help_panel=TOOLING)(plan_command)
# The CDC bridge was a top-level command before the worker group had it; old scripts keep working.
services_app.command("cdc", hidden=True)(worker.worker_cdc)


def _register_gateway() -> None:
    from embedstream.bench.gateway_bench import bench_gateway_cmd
    from embedstream.gateway.cli import gateway_cmd

    services_app.command("gateway", rich_help_panel=SERVICES)(gateway_cmd)
    bench_app.command("gateway")(bench_gateway_cmd)


_register_gateway()


def main() -> None:
    """Run the CLI. A CodedError that reaches here is a refusal the user can act on (an unknown model, a
    configuration that cannot work, a store that is locked): one line and exit 2, not a traceback."""
    try:
        app()
    except CodedError as exc:
        typer.echo(f"error: {exc.message} ({exc.code})", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
