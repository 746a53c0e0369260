"""Shell use without the main CLI: ``python -m embedstream.devkafka start|stop|restart|status|jars [--port N] [--brokers N]``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import IO, Sequence

from embedstream.devkafka.broker import DEFAULT_STOP_TIMEOUT_S, DEFAULT_WAIT_S
from embedstream.devkafka.cluster import restart, start, status, stop
from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.jars import ensure_jars
from embedstream.devkafka.layout import DEFAULT_HOST, DEFAULT_PORT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m embedstream.devkafka",
        description="Local Apache Kafka (KRaft) for development and tests: one node, or a cluster of N.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=help_)
        if name != "jars":
            cmd.add_argument(
                "--port", type=int, default=DEFAULT_PORT,
                help="client port; port+1 is the controller (a cluster: node i uses port+2(i-1) and the next)"
            )
            cmd.add_argument(
                "--data-dir", type=Path, default=None,
                help="default: $EMBEDSTREAM_KAFKA_DATA_DIR or ~/.cache/embedstream/kafka-data/<port>",
            )
        return cmd

    for name, help_ in (
        ("start", "start the broker (no-op if running); prints the bootstrap address on stdout"),
        ("restart", "stop and start, keeping data"),
    ):
        cmd = add(name, help_)
        cmd.add_argument("--host", default=DEFAULT_HOST)
        cmd.add_argument(
            "--secure", action="store_true",
            help="SASL_SSL (SCRAM-SHA-512) with TLS and ACLs; the admin's settings go to <data-dir>/security/admin.env",
        )
        cmd.add_argument(
            "--wait", type=float, default=DEFAULT_WAIT_S, help="seconds to wait for the broker to answer"
        )
        cmd.add_argument(
            "--brokers", type=int, default=None,
            help="nodes of a KRaft cluster (3: replication factor 3, min.insync.replicas 2); default: what the "
                 "data dir holds, else 1",
        )
    add("stop", "stop the broker").add_argument(
        "--timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, help="seconds before SIGKILL"
    )
    add("status", "print status as JSON (with the project's topics below the replication settings); exit 0 if "
                  "answering, 3 otherwise")
    add("jars", "resolve the broker jars into the cache and print their directory")
    return parser


def with_replication(state: dict) -> dict:
    """``state`` (a broker's or cluster's status) with the project's topics whose replication factor or
    ``min.insync.replicas`` is below the settings (``under_replicated``; ``replication_check``: why it could not
    be told), asked of any node that answers. The settings are the environment's (``EMBEDSTREAM_KAFKA__*``, the
    bootstrap list aside): ``REPLICATION_FACTOR`` and ``MIN_INSYNC_REPLICAS``, or the cluster's own configs."""
    if not (state.get("answering") or any(node.get("answering") for node in state.get("nodes", []))):
        return state
    from embedstream.config import Settings
    from embedstream.producers.topics import replication_status

    kafka = Settings().kafka.model_copy(update={"bootstrap_servers": state["bootstrap"]})
    if state.get("security", "plaintext") != "plaintext" and kafka.security_protocol == "PLAINTEXT":
        return {**state, "replication_check": f"a {state['security']} broker: export its admin settings "
                                              "(EMBEDSTREAM_KAFKA__*, see start's output) to check the topics"}
    return {**state, **replication_status(kafka)}


def _say(msg: str, stream: IO[str] = sys.stderr) -> None:
    print(msg, file=stream, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry; returns the exit code (stdout carries only machine-readable output)."""
    args = _parser().parse_args(argv)
    try:
        if args.command in ("start", "restart"):
            fn = start if args.command == "start" else restart
            t0 = time.monotonic()
            security = "sasl_ssl" if args.secure else "plaintext"
            brokers = {"brokers": args.brokers} if args.brokers else {}
            info = fn(args.host, args.port, args.data_dir, args.wait, security=security, **brokers)
            _say(
                f"kafka {info.version} answering on {info.bootstrap} after {time.monotonic() - t0:.1f} s "
                f"(pid {info.pid}, data {info.data_dir})"
            )
            if info.admin_env is not None:
                _say(f"SASL_SSL: CA {info.ca_file}; admin settings (EMBEDSTREAM_KAFKA__*) in {info.admin_env}")
            _say(info.bootstrap, sys.stdout)
        elif args.command == "stop":
            stopped = stop(args.port, args.data_dir, args.timeout)
            _say("broker stopped" if stopped else "no broker was running")
        elif args.command == "status":
            state = with_replication(status(args.port, args.data_dir))
            _say(json.dumps(state, indent=2), sys.stdout)
            return 0 if state["answering"] else 3
        elif args.command == "jars":
            t0 = time.monotonic()
            libs = ensure_jars()
            _say(f"kafka jars ready after {time.monotonic() - t0:.1f} s")
            _say(str(libs), sys.stdout)
    except DevKafkaError as exc:
        _say(f"devkafka: error: {exc}")
        return 1
    return 0
