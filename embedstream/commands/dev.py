"""`embedstream dev kafka|postgres|connect ...`: the local broker, and the CDC rig (PostgreSQL, Connect + Debezium);
`embedstream dev compose|images ...`: the container engine and the compose stack's images (commands.containers)."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from embedstream.commands.containers import compose_app, images_app
from embedstream.commands.options import BROKER_PORT, BrokerDataDir, BrokerPort

app = typer.Typer(no_args_is_help=True, help="Local development services.")
kafka_app = typer.Typer(no_args_is_help=True, help="The local Apache Kafka broker (KRaft), or a cluster of N (--brokers).")
app.add_typer(kafka_app, name="kafka")
app.add_typer(compose_app, name="compose")
app.add_typer(images_app, name="images")

Secure = Annotated[bool, typer.Option(
    "--secure", help="SASL_SSL (SCRAM-SHA-512) with TLS from the data dir's own CA and ACLs enforced; "
                     "the admin's EMBEDSTREAM_KAFKA__* settings go to DATA_DIR/security/admin.env")]


Brokers = Annotated[Optional[int], typer.Option(
    "--brokers", min=1, help="Nodes of a KRaft cluster on PORT, PORT+2, ... (each broker and controller; 3: the project's "
                             "topics get replication factor 3 and min.insync.replicas 2). Default: what the data dir "
                             "holds, else 1")]


def _started(info) -> None:
    for node in getattr(info, "nodes", ()):  # a cluster: each node, then the list clients are given
        typer.echo(f"node {node.data_dir.name}: {node.bootstrap} (pid {node.pid}, data {node.data_dir})")
    typer.echo(f"kafka {info.version} answering on {info.bootstrap} (pid {info.pid}, data {info.data_dir})")
    if info.admin_env is not None:
        typer.echo(f"SASL_SSL: clients trust {info.ca_file}; admin settings in {info.admin_env}")


@kafka_app.command("start")
def kafka_start(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None, secure: Secure = False,
                brokers: Brokers = None) -> None:
    """Resolve the broker jars (once), format KRaft storage (once) and start; returns when it answers (a
    cluster: when every node answers and lists all); prints the bootstrap list."""
    from embedstream import devkafka

    _started(devkafka.start(port=port, data_dir=data_dir, security="sasl_ssl" if secure else "plaintext",
                            brokers=brokers))


@kafka_app.command("restart")
def kafka_restart(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None, secure: Secure = False,
                  brokers: Brokers = None) -> None:
    """Stop and start again with the same data (topics and committed offsets kept)."""
    from embedstream import devkafka

    _started(devkafka.restart(port=port, data_dir=data_dir, security="sasl_ssl" if secure else "plaintext",
                              brokers=brokers))


@kafka_app.command("stop")
def kafka_stop(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None) -> None:
    """Stop the local broker, or every node of the data dir's cluster (data is kept)."""
    from embedstream import devkafka

    _stopped(devkafka.stop(port=port, data_dir=data_dir))


@kafka_app.command("status")
def kafka_status(port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None) -> None:
    """Print the broker's (or cluster's, each node's) state as JSON, with the project's topics whose replication
    factor or min.insync.replicas is below the settings (under_replicated); exit 3 when it (any node) does not answer."""
    from embedstream import devkafka
    from embedstream.devkafka.cli import with_replication

    _state(with_replication(devkafka.status(port=port, data_dir=data_dir)), "answering")


def _state(state: dict, up: str) -> None:
    """Print a status as JSON and exit 0 when ``state[up]``, else 3."""
    typer.echo(json.dumps(state, indent=2, default=str))
    raise typer.Exit(0 if state.get(up) else 3)


def _stopped(was_running: bool) -> None:
    typer.echo("stopped" if was_running else "not running")


postgres_app = typer.Typer(no_args_is_help=True, help="A throwaway PostgreSQL cluster for CDC (wal_level=logical).")
connect_app = typer.Typer(no_args_is_help=True, help="Kafka Connect with the Debezium PostgreSQL connector.")
app.add_typer(postgres_app, name="postgres")
app.add_typer(connect_app, name="connect")

PgPort = Annotated[int, typer.Option("--pg-port", help="Port of the local PostgreSQL on 127.0.0.1")]
PgDataDir = Annotated[Optional[str], typer.Option(
    "--pg-data-dir", help="Cluster folder (default: /tmp/embedstream-postgres/PORT as root, else "
                          "~/.cache/embedstream/postgres-data/PORT)")]
RestPort = Annotated[int, typer.Option("--rest-port", help="Port of the Connect worker's REST API on 127.0.0.1")]
ConnectDataDir = Annotated[Optional[str], typer.Option(
    "--connect-data-dir", help="Worker folder (default: ~/.cache/embedstream/connect-data/REST_PORT)")]


@postgres_app.command("start")
def postgres_start(pg_port: PgPort = 5432, pg_data_dir: PgDataDir = None) -> None:
    """initdb (once) and start; returns when it accepts connections, with the database 'embedstream'."""
    from embedstream.devcdc import postgres

    info = postgres.start(pg_port, pg_data_dir)
    typer.echo(f"postgresql answering on {info.host}:{info.port} (pid {info.pid}, data {info.data_dir}); "
               f"dsn: {info.dsn}")


@postgres_app.command("stop")
def postgres_stop(pg_port: PgPort = 5432, pg_data_dir: PgDataDir = None) -> None:
    """Stop the cluster (data is kept)."""
    from embedstream.devcdc import postgres

    _stopped(postgres.stop(pg_port, pg_data_dir))


@postgres_app.command("status")
def postgres_status(pg_port: PgPort = 5432, pg_data_dir: PgDataDir = None) -> None:
    """Print the cluster's state as JSON; exit 3 when it does not run."""
    from embedstream.devcdc import postgres

    _state(postgres.status(pg_port, pg_data_dir), "running")


@connect_app.command("start")
def connect_start(
    table: Annotated[Optional[str], typer.Option("--table", help="Register a Debezium connector for this "
                                                 "table (schema.table); it is saved and re-registered on restart")] = None,
    topic_prefix: Annotated[str, typer.Option("--topic-prefix", help="Debezium topic.prefix: the change topic "
                                              "is PREFIX.schema.table")] = "cdc",
    flatten: Annotated[bool, typer.Option("--flatten", help="Add Debezium's ExtractNewRecordState transform "
                                          "(rewrite-with-tombstone, add.fields=op)")] = False,
    schemas: Annotated[bool, typer.Option("--schemas", help="JSON converter with schemas.enable=true")] = False,
    port: BrokerPort = BROKER_PORT, data_dir: BrokerDataDir = None,
    pg_port: PgPort = 5432, pg_data_dir: PgDataDir = None,
    rest_port: RestPort = 8083, connect_data_dir: ConnectDataDir = None,
) -> None:
    """Start (or reuse) the dev broker, PostgreSQL and a standalone Connect worker; with --table, register
    a Debezium connector (pgoutput, its own slot and publication) and print its change topic."""
    from embedstream import devkafka
    from embedstream.devcdc import connect, postgres

    broker = devkafka.start(port=port, data_dir=data_dir)
    pg = postgres.start(pg_port, pg_data_dir)
    info = connect.start(broker.bootstrap, rest_port, connect_data_dir)
    typer.echo(f"{info.versions} answering on {info.url} (pid {info.pid}, data {info.data_dir})")
    if table:
        config = connect.debezium_config(pg, table, topic_prefix, flatten=flatten, schemas=schemas)
        connect.register(info, topic_prefix, config)
        typer.echo(f"connector {topic_prefix} running for {table} (database {pg.database} on port {pg.port}); "
                   f"change topic: {connect.topic_for(config)}")


@connect_app.command("stop")
def connect_stop(rest_port: RestPort = 8083, connect_data_dir: ConnectDataDir = None) -> None:
    """Stop the worker (connectors and their offsets are kept and resume on the next start)."""
    from embedstream.devcdc import connect

    _stopped(connect.stop(rest_port, connect_data_dir))


@connect_app.command("status")
def connect_status(rest_port: RestPort = 8083, connect_data_dir: ConnectDataDir = None) -> None:
    """Print the worker's and its connectors' state as JSON; exit 3 when it does not run."""
    from embedstream.devcdc import connect

    _state(connect.status(rest_port, connect_data_dir), "running")
