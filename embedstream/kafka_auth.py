"""Fail fast on wrong Kafka connection settings: one bounded login that reports the broker's own reason.

kafka-python (3.0.12) treats a refused SASL login like a broker that is down: its producer, consumer
and admin client retry the bootstrap until ``bootstrap_timeout_ms`` and then raise
``KafkaTimeoutError('Unable to bootstrap from [...]')``, which hides the cause. Measured against the
secured dev broker with a wrong password: 30.0 s for each of the three, and the reason only in
WARNING log lines. A plaintext client against a TLS listener looks the same.

:func:`check_kafka_access` makes one connection the way the settings say (TCP, TLS with the CA file,
SASL with the mechanism and user), within ``timeout_s``, and raises :class:`KafkaAccessError` naming
what failed: ``kafka_unreachable``, ``kafka_protocol_mismatch`` (e.g. PLAINTEXT against a TLS listener),
``kafka_tls_failed`` (certificate not trusted, wrong host name), ``kafka_auth_failed`` (the broker's
message, e.g. invalid credentials) or ``kafka_topic_denied`` (ACLs hide a topic the caller needs).
Workers and producers call it before building their clients.
The password is sent only inside the SASL exchange and never appears in a message.

The SASL exchange itself is kafka-python's (``kafka.net.sasl``: SCRAM, PLAIN, ...); this module adds
only the request framing (stdlib), which the dev broker's readiness probe shares.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import time
from typing import TYPE_CHECKING, Sequence

from embedstream.errors import CodedError

if TYPE_CHECKING:
    from embedstream.config import KafkaSettings

API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36
CONSUMER_GROUP_HEARTBEAT = 68  # KIP-848's consumer group protocol: served by brokers that have it enabled
TOPIC_AUTHORIZATION_FAILED = 29
CLIENT_ID = b"embedstream-access-check"


class KafkaAccessError(CodedError):
    """The broker cannot be used with these settings; ``code`` says which step failed."""


# --------------------------------------------------------------------------- framing (stdlib)


def send_request(sock: socket.socket, api_key: int, version: int, body: bytes, correlation_id: int,
                 client_id: bytes = CLIENT_ID) -> bytes:
    """Send one request (header v1) and return the response body after the correlation id."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    payload = header + body
    sock.sendall(struct.pack(">i", len(payload)) + payload)
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    response = recv_exact(sock, size)
    if struct.unpack(">i", response[:4])[0] != correlation_id:
        raise ValueError("correlation id mismatch")
    return response[4:]


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack(">h", len(data)) + data


def _skip_array(data: bytes, offset: int, item_size: int) -> int:
    (count,) = struct.unpack(">i", data[offset : offset + 4])
    return offset + 4 + max(count, 0) * item_size


def _denied_topics(sock: socket.socket, topics: list[str]) -> list[str]:
    """Topics a Metadata v4 request (no auto-creation) answers with TOPIC_AUTHORIZATION_FAILED."""
    body = struct.pack(">i", len(topics)) + b"".join(_string(t) for t in topics) + b"\x00"
    data = send_request(sock, METADATA, 4, body, correlation_id=10)
    offset = 4  # throttle_time_ms
    (brokers,) = struct.unpack(">i", data[offset : offset + 4])
    offset += 4
    for _ in range(brokers):  # node_id, host, port, rack
        _, offset = _read_nullable_string(data, offset + 4)
        _, offset = _read_nullable_string(data, offset + 4)
    _, offset = _read_nullable_string(data, offset)  # cluster_id
    offset += 4  # controller_id
    (count,) = struct.unpack(">i", data[offset : offset + 4])
    offset += 4
    denied = []
    for _ in range(count):
        (error,) = struct.unpack(">h", data[offset : offset + 2])
        name, offset = _read_nullable_string(data, offset + 2)
        offset += 1  # is_internal
        (partitions,) = struct.unpack(">i", data[offset : offset + 4])
        offset += 4
        for _ in range(max(partitions, 0)):  # error, index, leader, replicas[], isr[]
            offset = _skip_array(data, _skip_array(data, offset + 10, 4), 4)
        if error == TOPIC_AUTHORIZATION_FAILED:
            denied.append(name)
    return denied


def _read_nullable_string(data: bytes, offset: int) -> tuple[str | None, int]:
    (length,) = struct.unpack(">h", data[offset : offset + 2])
    if length < 0:
        return None, offset + 2
    return data[offset + 2 : offset + 2 + length].decode("utf-8", "replace"), offset + 2 + length


# --------------------------------------------------------------------------- the check


def _tls_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """As kafka-python builds it: system CAs or ``ssl_cafile``, host name checked, optional client cert."""
    context = ssl.create_default_context(cafile=kafka.ssl_cafile)
    if kafka.ssl_certfile:
        context.load_cert_chain(kafka.ssl_certfile, kafka.ssl_keyfile)
    return context


def _sasl_login(sock: socket.socket, kafka: KafkaSettings, where: str) -> None:
    from kafka.net.sasl import get_sasl_mechanism

    mechanism_name = kafka.sasl_mechanism or "PLAIN"
    body = send_request(sock, SASL_HANDSHAKE, 1, _string(mechanism_name), correlation_id=2)
    error, count = struct.unpack(">hi", body[:6])
    if error:
        offered, offset = [], 6
        for _ in range(max(count, 0)):
            name, offset = _read_nullable_string(body, offset)
            offered.append(name)
        raise KafkaAccessError(
            "kafka_auth_failed",
            f"{where} does not offer SASL mechanism {mechanism_name} (it offers {', '.join(map(str, offered))})",
        )
    try:
        mechanism = get_sasl_mechanism(mechanism_name)(
            sasl_mechanism=mechanism_name,
            sasl_plain_username=kafka.sasl_username or "",
            sasl_plain_password=kafka.sasl_password.get_secret_value() if kafka.sasl_password else "",
            security_protocol=kafka.security_protocol,
        )
    except KeyError:
        raise KafkaAccessError("kafka_auth_failed", f"unknown SASL mechanism {mechanism_name}") from None
    correlation_id = 3
    while not mechanism.is_done():
        token = mechanism.auth_bytes()
        body = send_request(sock, SASL_AUTHENTICATE, 1, struct.pack(">i", len(token)) + token, correlation_id)
        correlation_id += 1
        (error,) = struct.unpack(">h", body[:2])
        message, offset = _read_nullable_string(body, 2)
        if error:
            raise KafkaAccessError(
                "kafka_auth_failed",
                f"{where} refused the SASL {mechanism_name} login of user {kafka.sasl_username!r}: "
                f"{message or f'error code {error}'}",
            )
        (length,) = struct.unpack(">i", body[offset : offset + 4])
        mechanism.receive(body[offset + 4 : offset + 4 + max(length, 0)])
    if not mechanism.is_authenticated():
        raise KafkaAccessError("kafka_auth_failed", f"{where}: SASL {mechanism_name} login did not complete")


def _api_keys(body: bytes) -> frozenset[int]:
    """The API keys an ApiVersions v0 answer lists (after its error code: [api_key, min, max] int16 each)."""
    (count,) = struct.unpack(">i", body[2:6])
    return frozenset(struct.unpack(">h", body[6 + 6 * i: 8 + 6 * i])[0] for i in range(max(0, count)))


def _check_one(host: str, port: int, kafka: KafkaSettings, deadline: float, topics: list[str]) -> frozenset[int]:
    protocol = kafka.security_protocol
    where = f"broker {host}:{port}"
    try:
        raw = socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic()))
    except OSError as exc:
        raise KafkaAccessError("kafka_unreachable", f"cannot connect to {where}: {exc}") from exc
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(raw)
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        if protocol in ("SSL", "SASL_SSL"):
            try:
                sock = stack.enter_context(_tls_context(kafka).wrap_socket(sock, server_hostname=host))
            except ssl.SSLCertVerificationError as exc:
                raise KafkaAccessError(
                    "kafka_tls_failed",
                    f"{where}: the broker's certificate is not trusted ({exc.verify_message}); "
                    f"ssl_cafile is {kafka.ssl_cafile or 'unset (system CAs)'}",
                ) from exc
            except (ssl.SSLError, ConnectionError) as exc:
                raise KafkaAccessError(
                    "kafka_protocol_mismatch", f"{where}: TLS handshake failed ({exc}); is the listener TLS?"
                ) from exc
        try:
            body = send_request(sock, API_VERSIONS, 0, b"", correlation_id=1)
            (error,) = struct.unpack(">h", body[:2])
            if error:
                raise ValueError(f"ApiVersions error code {error}")
            apis = _api_keys(body)
            if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
                _sasl_login(sock, kafka, where)
            denied = _denied_topics(sock, topics) if topics else []
            if denied:
                raise KafkaAccessError(
                    "kafka_topic_denied",
                    f"{where} does not let user {kafka.sasl_username!r} use topic(s) {', '.join(sorted(denied))} "
                    "(TOPIC_AUTHORIZATION_FAILED); grant it Describe and Read or Write on them",
                )
            return apis
        except KafkaAccessError:
            raise
        except TimeoutError as exc:
            raise KafkaAccessError(
                "kafka_unreachable", f"{where} did not answer within the check's time limit"
            ) from exc
        except (OSError, ValueError, struct.error) as exc:
            raise KafkaAccessError(
                "kafka_protocol_mismatch",
                f"{where} closed or garbled the connection ({exc}) with security_protocol={protocol}; "
                "does the listener expect TLS or SASL?",
            ) from exc


def check_kafka_access(kafka: KafkaSettings, timeout_s: float = 10.0, topics: Sequence[str] = ()) -> frozenset[int]:
    """Log in to the first bootstrap server that accepts a connection, within ``timeout_s``.

    Returns the API keys that broker serves (its ApiVersions answer) when the settings work. A refused login or certificate is final and raised at
    once; an unreachable server moves on to the next one, and the last failure is raised.

    ``topics``: also ask for their metadata (without creating them) and raise ``kafka_topic_denied``
    for those the user may not see. kafka-python's consumer does not: a subscription to a topic the
    principal may not read polls nothing, forever, with the refusal only in DEBUG lines.
    """
    deadline = time.monotonic() + timeout_s
    last: KafkaAccessError | None = None
    for server in kafka.bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        host = host.strip("[]") or "localhost"
        try:
            return _check_one(host, int(port or 9092), kafka, deadline, list(topics))
        except KafkaAccessError as exc:
            if exc.code != "kafka_unreachable":
                raise
            last = exc
    raise last or KafkaAccessError("kafka_unreachable", "no bootstrap servers configured")
