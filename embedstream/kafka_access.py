"""Fail fast on wrong Kafka connection settings: one bounded metadata request that reports the client's own reason.

librdkafka (every client of the default path) treats a refused login, an untrusted certificate or a
plaintext client at a TLS listener like a broker that is down: it reconnects forever and says why only
to its error callback. :func:`check_kafka_access` asks a librdkafka AdminClient for the cluster's
metadata within ``timeout_s``, keeps what the error callback heard, and raises :class:`KafkaAccessError`
naming what failed: ``kafka_unreachable``, ``kafka_protocol_mismatch`` (e.g. PLAINTEXT against a TLS
listener), ``kafka_tls_failed`` (certificate not trusted, wrong host name), ``kafka_auth_failed`` (the
broker's message, e.g. invalid credentials) or ``kafka_topic_denied`` (ACLs hide a topic the caller needs).
Workers and producers call it before building their clients. The password never appears in a message.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from embedstream.errors import CodedError

if TYPE_CHECKING:
    from embedstream.config import KafkaSettings

#: the broker config that lists the group protocols its coordinator serves (KIP-848's is ``consumer``)
GROUP_PROTOCOLS_CONFIG = "group.coordinator.rebalance.protocols"


class KafkaAccessError(CodedError):
    """The broker cannot be used with these settings; ``code`` says which step failed."""


@dataclass(frozen=True)
class ClusterAccess:
    """What the check learned: the brokers alive, and the group protocols they serve (None: not readable,
    e.g. a principal without DescribeConfigs on the cluster)."""

    brokers: tuple[int, ...]
    group_protocols: frozenset[str] | None


class _Heard(logging.Handler):
    """librdkafka's log lines of one check, kept (not shown): a listener that hangs up before answering ApiVersion
    is said only there, never to the error callback."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.logger = logging.Logger("embedstream.kafka_access")  # not the manager's: nothing propagates
        self.logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _hung_up(kafka: KafkaSettings, lines: list[str]) -> KafkaAccessError | None:
    said = next((line for line in lines if "Disconnected" in line and "APIVERSION_QUERY" in line), None)
    if said is None:
        return None
    return KafkaAccessError("kafka_protocol_mismatch", (
        f"{kafka.bootstrap_servers} closed the connection before answering ApiVersion ({said[-300:]}) "
        f"with security_protocol={kafka.security_protocol}; does the listener expect TLS or SASL?"))


def _refusal(kafka: KafkaSettings, error) -> KafkaAccessError | None:
    """The final refusal one of librdkafka's errors means, or None (a broker away: keep trying)."""
    from confluent_kafka import KafkaError

    text = error.str()
    if error.code() == KafkaError._AUTHENTICATION:
        return KafkaAccessError("kafka_auth_failed", (
            f"{kafka.bootstrap_servers} refused the SASL {kafka.sasl_mechanism or 'PLAIN'} login of user "
            f"{kafka.sasl_username!r}: {text}"))
    if error.code() == KafkaError._SSL:
        if "verif" in text or "certificate" in text:
            return KafkaAccessError("kafka_tls_failed", (
                f"{kafka.bootstrap_servers}: the broker's certificate is not trusted ({text}); "
                f"ssl_cafile is {kafka.ssl_cafile or 'unset (system CAs)'}"))
        return KafkaAccessError("kafka_protocol_mismatch",
                                f"{kafka.bootstrap_servers}: TLS handshake failed ({text}); is the listener TLS?")
    return None


def check_kafka_access(kafka: KafkaSettings, timeout_s: float = 10.0, topics: Sequence[str] = ()) -> ClusterAccess:
    """The cluster's metadata as these settings get it, within ``timeout_s``; else :class:`KafkaAccessError`.

    A refused login or certificate is final and raised as soon as librdkafka reports it; a broker that
    refuses connections is ``kafka_unreachable`` once every bootstrap server did. ``topics``: raise
    ``kafka_topic_denied`` for those the user may not see (a missing topic is no refusal: lanes wait for
    it). librdkafka's consumer does not: a subscription to a topic the principal may not read polls nothing.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    heard: list = []
    lines = _Heard()
    admin = AdminClient(kafka.librdkafka_config(**{
        "client.id": "embedstream-access-check", "error_cb": heard.append, "logger": lines.logger,
        "reconnect.backoff.ms": 100, "reconnect.backoff.max.ms": 500}))
    deadline = time.monotonic() + timeout_s
    metadata = None
    while metadata is None:
        left = deadline - time.monotonic()
        try:
            metadata = admin.list_topics(timeout=max(0.1, min(0.5, left)))
        except KafkaException:
            admin.poll(0.05)  # serves error_cb
        for refusal in [_refusal(kafka, error) for error in heard] + [_hung_up(kafka, lines.lines)]:
            if refusal is not None:
                raise refusal
        if metadata is None and (time.monotonic() >= deadline
                                 or any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in heard)):
            said = "; ".join(dict.fromkeys(e.str() for e in heard)) or "no answer"
            raise KafkaAccessError("kafka_unreachable", (
                f"cannot reach a broker of {kafka.bootstrap_servers} within {timeout_s:g} s: {said[:500]}"))
    wanted = [topic for topic in dict.fromkeys(topics) if topic not in metadata.topics]
    if wanted:
        _raise_denied(kafka, admin, wanted, max(1.0, deadline - time.monotonic()))
    return ClusterAccess(tuple(sorted(metadata.brokers)), _group_protocols(admin, metadata, timeout_s))


def _raise_denied(kafka: KafkaSettings, admin, topics: list[str], timeout_s: float) -> None:
    """Topics the metadata did not list: missing (fine) or hidden by ACLs (``kafka_topic_denied``)."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    denied = []
    for topic, future in admin.describe_topics(TopicCollection(topics), request_timeout=timeout_s).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                denied.append(topic)
    if denied:
        raise KafkaAccessError("kafka_topic_denied", (
            f"{kafka.bootstrap_servers} does not let user {kafka.sasl_username!r} use topic(s) "
            f"{', '.join(sorted(denied))} (TOPIC_AUTHORIZATION_FAILED); grant it Describe and Read or Write on them"))


def _group_protocols(admin, metadata, timeout_s: float) -> frozenset[str] | None:
    """The group protocols a live broker's coordinator serves (its ``group.coordinator.rebalance.protocols``)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import ConfigResource, ResourceType

    if not metadata.brokers:
        return None
    resource = ConfigResource(ResourceType.BROKER, str(min(metadata.brokers)))
    try:
        entries = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
    except KafkaException:  # no DescribeConfigs right: not known
        return None
    entry = entries.get(GROUP_PROTOCOLS_CONFIG)
    if entry is None or entry.value is None:  # a broker before KIP-848 (Kafka < 3.7): the classic protocol only
        return frozenset({"classic"})
    return frozenset(p.strip() for p in entry.value.split(",") if p.strip())
