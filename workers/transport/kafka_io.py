"""Kafka client helpers shared by every worker: client construction, subscribing, committing, probing.

No loop and no policy here: the lane (``workers/transport/lane.py``) and the loop (``workers/loop.py``) use
these. The lanes' consumer is librdkafka's (``rd_consumer.py``, which speaks the part of kafka-python's API a
lane uses); ``new_consumer`` builds the kafka-python one, a lane's client by choice (``KafkaSettings.*_client``).
"""

from __future__ import annotations

import socket

from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.workers.transport.offsets import OffsetTracker

log = logs.get("embedstream.worker")


MAX_REQUEST_BYTES = 1024 * 1024  # the reply and dead-letter producer's largest record (the broker's default)


def new_producer(kafka: KafkaSettings) -> Producer:
    """The producer of replies and dead letters (librdkafka; ``KafkaSettings.producer_config``: acks=all, idempotent).

    librdkafka, not kafka-python: the reply is the last hop of an online request, and kafka-python's
    sender is a Python thread that waits for the GIL behind the model stage; a loopback echo answered
    in 2.1 ms p50 served by librdkafka against 4.2 ms by kafka-python (``embedstream bench transport``).
    Idempotent: a record the broker refuses (a reply over its topic's size limit) fails alone, later sends
    go on (librdkafka bumps the producer epoch; kafka-python's idempotent producer would fail them all).
    A record not acknowledged within ``message.timeout.ms`` (120 s, kafka-python's delivery timeout)
    fails: a reply becomes a ``reply_failed`` dead letter, and its offset is not committed until then.
    Delivery reports run on the thread that polls or flushes it (the outbox's ``settle``)."""
    return Producer(kafka.producer_config(**{
        "client.id": "embedstream-worker-outbox", "linger.ms": 0,
        "message.timeout.ms": 120_000, "message.max.bytes": MAX_REQUEST_BYTES}))


def new_consumer(kafka: KafkaSettings, group: str, client_id: str, max_poll_records: int, **extra) -> KafkaConsumer:
    """A consumer that never commits on its own: offsets are committed only after the work is written."""
    return KafkaConsumer(
        **kafka.client_kwargs(),
        group_id=group,
        # Aborted transactions never reach a worker (kafka-python reads them by default; librdkafka does not)
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=kafka.fetch_max_wait_ms,
        max_poll_records=max_poll_records,
        # Records up to twice the worker's own limit come in one partition fetch (brokers since KIP-74
        # return an oversized first batch anyway; this keeps big records from being fetched one at a time).
        max_partition_fetch_bytes=max(1 << 20, 2 * kafka.max_record_bytes),
        client_id=client_id,
        # A group joined before its topics' metadata arrived gets an empty assignment until
        # the next refresh: keep refreshes frequent so new or grown topics are noticed.
        metadata_max_age_ms=10_000,
        **({"session_timeout_ms": kafka.session_timeout_ms} if kafka.session_timeout_ms else {}),
        # Static membership (KIP-345, kafka-python >= 2.1): a restarted member takes its partitions back
        # without a rebalance. One id per process serves all its lanes: each lane is another group.
        **({"group_instance_id": kafka.instance_id()} if kafka.instance_id() else {}),
        **kafka_python_rebalancing(kafka),
        **extra,
    )


def kafka_python_rebalancing(kafka: KafkaSettings) -> dict:
    """kafka-python's assignors for ``kafka.group_protocol``: eager (its default range and round-robin), else
    cooperative-sticky (kafka-python 3.0.12 has no KIP-848 client: ``consumer`` falls back to it)."""
    if kafka.group_protocol == "eager":
        return {}
    return {"partition_assignment_strategy": (CooperativeStickyAssignor,)}


def librdkafka_rebalancing(kafka: KafkaSettings) -> dict:
    """librdkafka's group settings for ``kafka.group_protocol``. The consumer protocol (KIP-848) takes its
    session timeout from the broker (the group's ``consumer.session.timeout.ms``: ``set_group_session_timeout``)."""
    if kafka.group_protocol == "consumer":
        return {"group.protocol": "consumer"}
    config: dict = {"partition.assignment.strategy": "cooperative-sticky" if kafka.group_protocol == "cooperative-sticky"
                    else "range,roundrobin"}
    if kafka.session_timeout_ms:
        config["session.timeout.ms"] = kafka.session_timeout_ms
    return config


def with_served_group_protocol(kafka: KafkaSettings, served: frozenset[str] | None) -> KafkaSettings:
    """The settings with a group protocol the broker serves (``served``: its coordinator's protocols, None when
    not readable): ``consumer`` (KIP-848) needs a broker that lists it (Kafka 4 has it on); on another one
    (Kafka 3, or the protocol turned off) the lanes use ``cooperative-sticky``, said once, instead of failing to join."""
    if kafka.group_protocol != "consumer" or served is None or "consumer" in served:
        return kafka
    log.warning("the broker does not serve the consumer group protocol (KIP-848): lanes use cooperative-sticky",
                bootstrap=kafka.bootstrap_servers, served=sorted(served))
    return kafka.model_copy(update={"group_protocol": "cooperative-sticky"})


def incremental(kafka: KafkaSettings) -> bool:
    """Whether a rebalance hands over only what moves (a member keeps the rest and goes on consuming it)."""
    return kafka.group_protocol != "eager"


def set_group_session_timeout(kafka: KafkaSettings, group: str) -> None:
    """Consumer protocol: ``session_timeout_ms`` as the group's ``consumer.session.timeout.ms`` (the broker
    holds it). A broker that refuses (outside its min/max, no ALTER_CONFIGS right) keeps its default: said once."""
    if kafka.group_protocol != "consumer" or not kafka.session_timeout_ms:
        return
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient(kafka.librdkafka_config(**{"client.id": "embedstream-group-config"}))
    entry = ConfigEntry("consumer.session.timeout.ms", str(kafka.session_timeout_ms),
                        incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    try:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=15)
    except Exception as exc:  # noqa: BLE001 - the broker's default session timeout applies
        log.warning("group session timeout not set; the broker's default applies", group=group,
                    session_timeout_ms=kafka.session_timeout_ms, error=str(exc)[:300])


def release_static_member(kafka: KafkaSettings, group: str, instance_id: str) -> None:
    """Consumer protocol: remove the member that holds ``instance_id`` in ``group``, so that a replacement can join.

    A KIP-848 coordinator keeps a static member that died without leaving (kill -9, a lost node) until its
    session expires, and refuses its replacement meanwhile: librdkafka calls the UNRELEASED_INSTANCE_ID it
    answers fatal (measured: Kafka 4.2, session 45 s; the replacement failed at its first heartbeat). The
    classic protocol's replacement fences the old member instead; removing it by its instance id (a
    LeaveGroup, as ``kafka-consumer-groups --delete-members`` does) gives KIP-848 the same. Only after that
    refusal (``RdConsumer``): a member that left cleanly keeps its partitions for its return, no rebalance.
    kafka-python's admin client: librdkafka has no such call. A live member with the same id is fenced, as
    under the classic protocol: one id per process."""
    if kafka.group_protocol != "consumer":
        return
    from kafka.admin import KafkaAdminClient
    from kafka.admin._groups import MemberToRemove

    try:
        admin = KafkaAdminClient(**kafka.client_kwargs(), client_id="embedstream-static-member")
    except Exception as exc:  # noqa: BLE001 - the join is tried anyway
        log.warning("static member not released", group=group, instance_id=instance_id, error=str(exc)[:300])
        return
    try:
        removed = admin.remove_group_members(group, [MemberToRemove(group_instance_id=instance_id)])
        log.info("the member holding this static id removed", group=group, instance_id=instance_id,
                 result={k: getattr(v, "__name__", str(v)) for k, v in removed.items()})
    except Exception as exc:  # noqa: BLE001 - no such member (a first start), a new group: nothing to release
        log.debug("no member holding this static id removed", group=group, instance_id=instance_id, error=str(exc)[:300])
    finally:
        admin.close()


def group_members(admin, group: str, timeout_s: float = 10.0) -> int:
    """How many members ``group`` has now, whichever protocol it runs (``admin``: librdkafka's AdminClient).

    librdkafka asks ConsumerGroupDescribe of a KIP-848 group and DescribeGroups of a classic one; the
    classic call alone answers "not a classic group" for the first (kafka-python's ``describe_groups``)."""
    description = admin.describe_consumer_groups([group], request_timeout=timeout_s)[group].result(timeout=timeout_s)
    return len(description.members)


def broker_reachable(consumer) -> bool:
    """True while the client holds a connection to some broker.

    kafka-python 3's ``bootstrap_connected()`` is only true while bootstrapping is in progress, so
    after start-up it reads False even on a healthy client; look at the broker connections instead.
    """
    try:
        client = consumer._client  # the public API has no "connected to the cluster" question
        brokers = client.cluster.brokers()
        return any(client.connected(getattr(b, "node_id", None) if hasattr(b, "node_id") else b.nodeId) for b in brokers)
    except Exception:  # noqa: BLE001 - another client version: fall back to the public call
        return bool(consumer.bootstrap_connected())


def broker_listening(bootstrap_servers: str, timeout_s: float = 1.0) -> bool:
    """True when some bootstrap address accepts a TCP connection (independent of any client's state)."""
    for address in bootstrap_servers.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port or 9092)), timeout=timeout_s):
                return True
        except (OSError, ValueError):
            continue
    return False


def commit_finished(consumer, tracker: OffsetTracker, *, wait: bool = True, revoked: frozenset = frozenset(),
                    **context) -> None:
    """Commit the offsets of finished work on the partitions the consumer still owns.

    The caller has let dead letters and replies be acknowledged first (their records count as
    finished only then). ``wait=False`` is for rebalance listeners: kafka-python 3 runs them on its
    IO thread, which refuses blocking calls, and an async commit still reaches the coordinator
    before the re-join. A failed synchronous commit keeps its offsets for the next call. ``revoked``: partitions
    being handed over, whose finished work is committed too (a cooperative rebalance in kafka-python 3.0.12 has
    already taken them out of the assignment when it calls the listener).
    """
    offsets = tracker.drain()
    assigned = consumer.assignment()
    for tp in assigned if wait else ():  # not inside a rebalance listener (kafka-python's IO thread)
        key = (tp.topic, tp.partition)
        past = None if tracker.in_flight(key) else tracker.past_skipped(key, consumer.position(tp, timeout_ms=0))
        if past is not None:
            offsets[key] = past
    owned = {(tp.topic, tp.partition) for tp in assigned} | set(revoked)
    commit = {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items() if (t, p) in owned}
    if not commit:
        return
    if not wait:
        def reported(_offsets, result) -> None:
            if isinstance(result, Exception):
                log.warning("offset commit at revocation failed", error=str(result)[:300], **context)

        consumer.commit_async(commit, callback=reported)
        return
    try:
        consumer.commit(commit)
    except KafkaError as exc:  # broker away past the request timeout, or a rebalance: retry later
        log.warning("offset commit failed; will retry", error=str(exc)[:300], **context)
        tracker.retry({(tp.topic, tp.partition): meta.offset for tp, meta in commit.items()})


def missing_topics(kafka: KafkaSettings, topics: list[str]) -> list[str]:
    """The topics the broker does not list (yet), asked by a throwaway librdkafka admin client (not the lane's
    consumer: its metadata is its own business)."""
    from confluent_kafka.admin import AdminClient

    listed = AdminClient(kafka.librdkafka_config(**{"client.id": "embedstream-topic-probe"})).list_topics(timeout=10)
    return [topic for topic in topics if not listed.topics.get(topic) or listed.topics[topic].error is not None]


def group_joined(consumer) -> bool:
    """True while the consumer is a stable member of its group (joined, not rebalancing)."""
    if isinstance(getattr(consumer, "joined", None), bool):  # RdConsumer: it tracks its own assignments
        return consumer.joined
    try:
        return consumer._coordinator.stable()  # the public API has no "member of the group" question
    except AttributeError:  # another client version: holding partitions implies a join
        return bool(consumer.assignment())


def subscribe(consumer, topics: list[str], listener) -> None:
    """Subscribe (to topics that exist: ``Lane.follow_topics``); a kafka-python consumer then loads the topics'
    metadata before the first join.

    Joined without it, the group starts with no partitions and kafka-python 3.0.12 can then stall
    in its next fetch for good. Loaded before subscribing, the group's metadata snapshot misses it
    and the first refresh forces a second rebalance; so: after subscribe, before the first poll.
    """
    consumer.subscribe(topics, listener=listener)
    for topic in topics if isinstance(consumer, KafkaConsumer) else ():
        consumer.partitions_for_topic(topic)
