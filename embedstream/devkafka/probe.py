"""Readiness over the wire: raw ApiVersions + Metadata requests.

Stdlib framing only (shared with ``embedstream.kafka_auth``), so it works before a Kafka client
library is imported.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import DEFAULT_HOST, DEFAULT_PORT, Layout, logs_excerpt
from embedstream.devkafka.process import EXIT_CODES, pid_alive
from embedstream.kafka_auth import send_request

CLIENT_ID = b"embedstream-devkafka"


def _api_versions(sock: socket.socket) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 (answered by every broker): api key -> (min, max) version."""
    body = send_request(sock, 18, 0, b"", correlation_id=1, client_id=CLIENT_ID)
    error, count = struct.unpack(">hi", body[:6])
    if error != 0:
        raise ValueError(f"ApiVersions error {error}")
    entries = struct.iter_unpack(">hhh", body[6 : 6 + 6 * count])
    return {key: (lo, hi) for key, lo, hi in entries}


def _metadata_broker_count(sock: socket.socket, version: int) -> int:
    """Brokers listed by a (non-flexible, v1..v8) Metadata request for no topics."""
    body = struct.pack(">i", 0)  # empty topic list: cluster info only
    if version >= 4:
        body += b"\x00"  # allow_auto_topic_creation
    if version >= 8:
        body += b"\x00\x00"  # include cluster/topic authorized operations
    resp = send_request(sock, 3, version, body, correlation_id=2, client_id=CLIENT_ID)
    offset = 4 if version >= 3 else 0  # throttle_time_ms
    return struct.unpack(">i", resp[offset : offset + 4])[0]


def broker_answers(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    timeout_s: float = 2.0,
    tls: ssl.SSLContext | None = None,
    brokers: int = 1,
) -> bool:
    """True when a Kafka broker at host:port serves requests and lists itself in metadata
    (a node of a cluster: lists ``brokers`` brokers, every node registered).

    Stronger than an open port: the listener opens before the broker has registered
    with its controller, and clients fail until it has. With ``tls`` (a SASL_SSL listener) the
    probe completes the TLS handshake and stops at ApiVersions: Metadata needs a login, which
    the secured start does next through a Kafka client.
    """
    try:
        with contextlib.ExitStack() as stack:
            sock = stack.enter_context(socket.create_connection((host, port), timeout=timeout_s))
            if tls is not None:
                sock = stack.enter_context(tls.wrap_socket(sock, server_hostname=host))
            sock.settimeout(timeout_s)
            apis = _api_versions(sock)
            if tls is not None:
                return bool(apis)
            lo, hi = apis.get(3, (0, -1))
            versions = [v for v in range(1, 9) if lo <= v <= hi]
            if not versions:
                return False
            return _metadata_broker_count(sock, max(versions)) >= max(1, brokers)
    except (OSError, ValueError, struct.error):
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
