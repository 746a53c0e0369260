"""`embedstream dev kafka start|restart|stop|status`: the local single-node broker for development and tests."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from embedstream.commands.options import BROKER_PORT, BrokerDataDir, BrokerPort

app = typer.Typer(no_args_is_help=True, help="Local development services.")
kafka_app = typer.Typer(no_args_is_help=True, help="The local single-node Apache Kafka broker (KRaft).")
app.add_typer(kafka_app, name="kafka")

Secure = Annotated[bool, typer.Option(
    "--secure", help="SASL_SSL (SCRAM-SHA-512) with TLS from the data dir's own CA and ACLs enforced; "
                     "the admin's EMBEDSTREAM_KAFKA__* settings go to DATA_DIR/security/admin.env")]


def _started(info) -> None:
    typer.echo(f"kafka {info.version} answering on {info.bootstrap} (pid {info.pid}, data {info.data_dir})")
    if info.admin_env is not None:
        typer.echo(f"SASL_SSL: clients trust {info.ca_file}; admin settings in {info.admin_env}")


@kafka_app.command("start")
def kafka_start(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None, secure: Secure = False) -> None:
    """Resolve the broker jars (once), format KRaft storage (once) and start; returns when it answers."""
    from embedstream import devkafka

    _started(devkafka.start(port=port, data_dir=data_dir, security="sasl_ssl" if secure else "plaintext"))


@kafka_app.command("restart")
def kafka_restart(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None, secure: Secure = False) -> None:
    """Stop and start again with the same data (topics and committed offsets kept)."""
    from embedstream import devkafka

    _started(devkafka.restart(port=port, data_dir=data_dir, security="sasl_ssl" if secure else "plaintext"))


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
