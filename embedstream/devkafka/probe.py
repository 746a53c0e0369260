"""Readiness of a dev broker: its metadata as librdkafka gets it (a TLS handshake for a secured one)."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import time

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import DEFAULT_HOST, DEFAULT_PORT, Layout, logs_excerpt
from embedstream.devkafka.process import EXIT_CODES, pid_alive


def broker_answers(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    timeout_s: float = 2.0,
    tls: ssl.SSLContext | None = None,
    brokers: int = 1,
) -> bool:
    """True when a Kafka broker at host:port serves requests and lists itself in metadata
    (a node of a cluster: lists ``brokers`` brokers, every node registered).

    Stronger than an open port: the listener opens before the broker has registered with its
    controller, and clients fail until it has. With ``tls`` (a SASL_SSL listener) the probe stops at
    the TLS handshake: metadata needs a login, which the secured start does next through a Kafka client.
    """
    if tls is not None:
        try:
            with contextlib.ExitStack() as stack:
                sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout_s))
                stack.enter_context(tls.wrap_socket(sock, server_hostname=host))
                return True
        except OSError:
            return False
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": f"{host}:{port}", "client.id": "embedstream-devkafka",  # no log lines:
                         "log_level": 0, "logger": logging.getLogger("embedstream.librdkafka")})  # refusals at start
    try:
        return len(admin.list_topics(timeout=timeout_s).brokers) >= max(1, brokers)
    except KafkaException:
        return False


def wait_answering(
    pid: int, host: str, port: int, wait_s: float, layout: Layout, tls: ssl.SSLContext | None = None,
    brokers: int = 1,
) -> None:
    """Block until the broker answers; fail fast if the JVM dies, with the log tails."""
    deadline = time.monotonic() + wait_s
    while True:
        if broker_answers(host, port, timeout_s=2.0, tls=tls, brokers=brokers):
            return
        if not pid_alive(pid):
            code = f" with exit code {EXIT_CODES[pid]}" if pid in EXIT_CODES else ""
            raise DevKafkaError(
                f"broker exited during startup{code}; see {layout.server_log}\n{logs_excerpt(layout)}"
            )
        if time.monotonic() >= deadline:
            raise DevKafkaError(
                f"broker did not answer within {wait_s:.0f} s; see {layout.server_log}\n"
                + logs_excerpt(layout)
            )
        time.sleep(0.2)
