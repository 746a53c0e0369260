"""The broker's configuration files and its KRaft storage, formatted once so topics survive restarts."""

from __future__ import annotations

import base64
import contextlib
import re
import subprocess
import uuid
from pathlib import Path
from typing import Mapping, Sequence

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import Layout, tail_text


STORAGE_TOOL = "kafka.tools.StorageTool"

STORAGE_FORMAT_TIMEOUT_S = 120


def server_properties(host: str, port: int, layout: Layout, overrides: Mapping[str, str] | None = None) -> str:
    """Single-node KRaft config: everything replicated once, fast group joins.

    ``overrides`` replace or add properties (the secured broker's listeners, SASL, TLS and authorizer).
    """
    controller_port = port + 1
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(layout.log_dirs),
        "num.partitions": "4",
        "auto.create.topics.enable": "true",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        # Internal topics: one replica, and few partitions so the first consumer group
        # or transaction does not wait for 50 partitions to be created on 2 cores.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "4",
        # Tests join groups constantly; the default 3 s delay would dominate them.
        "group.initial.rebalance.delay.ms": "0",
    }
    props.update(overrides or {})
    header = "# Written by embedstream.devkafka on every start; edits are overwritten.\n"
    return header + "".join(f"{k}={v}\n" for k, v in props.items())


def log4j_properties(layout: Layout) -> str:
    """Broker log to a size-capped file; chatty request/state-change loggers only on WARN."""
    return log4j_file_config(layout.server_log, ("kafka.request.logger", "state.change.logger"))


def log4j_file_config(log: Path, quiet: Sequence[str] = ()) -> str:
    """A JVM's log4j2 config: INFO to a size-capped rolling file, the ``quiet`` loggers on WARN only."""
    quiet_lines = "".join(f"logger.q{i}.name = {name}\nlogger.q{i}.level = WARN\n" for i, name in enumerate(quiet))
    return f"""# Written by embedstream on every start.
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.filePattern = {log}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 10MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
{quiet_lines}"""


def random_cluster_id() -> str:
    """Same format as ``kafka-storage random-uuid`` without paying a JVM start for it."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # Kafka rejects ids that look like CLI flags
            return cid


def format_storage(
    java: str, libs: Path, layout: Layout, extra_args: Sequence[str] = (), secrets: Sequence[str] = (),
    cluster_id: str | None = None,
) -> None:
    """Format the KRaft log dir once; skipped later so topics and offsets survive restarts.

    ``extra_args``: e.g. ``--add-scram`` for the secured broker's first user; ``secrets`` are blanked
    out of the tool's output before it goes into an error message. ``cluster_id``: the id every node of a
    cluster shares (default: a new one, a single node).
    """
    cmd = [
        java, "-Xmx256m", f"-Dlog4j2.configurationFile={layout.log4j}",
        "-cp", f"{libs}/*", STORAGE_TOOL,
        "format", "-t", cluster_id or random_cluster_id(), "-c", str(layout.config), *extra_args,
    ]
    proc = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=STORAGE_FORMAT_TIMEOUT_S
    )
    if proc.returncode != 0 or not layout.meta.is_file():
        output = proc.stdout + proc.stderr
        for secret in secrets:
            output = output.replace(secret, "***")
        raise DevKafkaError(
            f"formatting Kafka storage in {layout.log_dirs} failed (exit {proc.returncode}):\n"
            + tail_text(output)
        )


def read_cluster_id(layout: Layout) -> str | None:
    with contextlib.suppress(OSError):
        for line in layout.meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    return None


def configured_listener(layout: Layout) -> tuple[str, str, int] | None:
    """(security protocol, host, port) the data dir's broker was last configured for, if any."""
    with contextlib.suppress(OSError):
        text = layout.config.read_text()
        match = re.search(r"^advertised\.listeners=([A-Z_]+)://(.+):(\d+)$", text, re.M)
        if match:
            return match.group(1), match.group(2), int(match.group(3))
    return None
