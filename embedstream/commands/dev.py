"""`embedstream dev kafka start|stop|status`: the local single-node broker for development and tests."""

from __future__ import annotations

import json

import typer

from embedstream.commands.options import BROKER_PORT, BrokerDataDir, BrokerPort

app = typer.Typer(no_args_is_help=True, help="Local development services.")
kafka_app = typer.Typer(no_args_is_help=True, help="The local single-node Apache Kafka broker (KRaft).")
app.add_typer(kafka_app, name="kafka")


@kafka_app.command("start")
def kafka_start(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None) -> None:
    """Resolve the broker jars (once), format KRaft storage (once) and start; returns when it answers."""
    from embedstream import devkafka

    info = devkafka.start(port=port, data_dir=data_dir)
    typer.echo(f"kafka broker answering on {info.bootstrap}")


@kafka_app.command("stop")
def kafka_stop(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None) -> None:
    """Stop the local broker (data is kept)."""
    from embedstream import devkafka

    typer.echo("stopped" if devkafka.stop(port=port, data_dir=data_dir) else "not running")


@kafka_app.command("status")
def kafka_status(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None) -> None:
    """Print the broker's state as JSON; exit 3 when it does not answer."""
    from embedstream import devkafka

    state = devkafka.status(port=port, data_dir=data_dir)
    typer.echo(json.dumps(state, indent=2, default=str))
    raise typer.Exit(0 if state.get("answering") else 3)
