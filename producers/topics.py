"""Topic administration: which topics embedstream uses, how they are configured, and creating them.

Topics are created with an explicit partition count: auto-created topics would get whatever the
broker defaults to, or fail where auto-creation is disabled. Their replication follows the cluster: on
three or more brokers every topic has 3 replicas and ``min.insync.replicas=2`` (with the producers'
``acks=all``, an acknowledged record survives the loss of any one broker), on one broker a single copy
(``KafkaSettings.replication_factor`` overrides).
"""

from __future__ import annotations

from collections.abc import Iterable

from kafka import KafkaAdminClient
from kafka.errors import TopicAlreadyExistsError

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.schemas.events import Lane

log = logs.get("embedstream.topics")

DEFAULT_PARTITIONS = 4
CLUSTER_REPLICAS = 3  # on a cluster of at least this many brokers
CLUSTER_MIN_INSYNC = 2


def all_topics(settings: KafkaSettings) -> list[str]:
    """Every topic embedstream uses, in a stable order."""
    return [
        settings.topic_chunks_online,
        settings.topic_chunks_bulk,
        settings.topic_queries,
        settings.topic_replies,
        settings.topic_rerank,
        settings.topic_search,
        settings.topic_dead_letters,
        settings.topic_documents,
    ]


def topic_configs(settings: KafkaSettings, topic: str, replication_factor: int = 1) -> dict[str, str]:
    """Per-topic broker configs: the documents log is compacted (latest version per doc_id survives); a
    replicated topic takes a write once 2 replicas have it (``min_insync``)."""
    configs = {"min.insync.replicas": str(min_insync(replication_factor))} if replication_factor > 1 else {}
    if topic == settings.topic_documents:
        configs["cleanup.policy"] = "compact"
    return configs


def replication_factor(settings: KafkaSettings, brokers: int) -> int:
    """Replicas of a topic the project creates on a cluster listing ``brokers`` live brokers: the setting,
    else 3 where there are 3 or more, else one per broker (a single dev broker: 1)."""
    if settings.replication_factor is not None:
        return settings.replication_factor
    return min(CLUSTER_REPLICAS, max(1, brokers))


def min_insync(replicas: int) -> int:
    """``min.insync.replicas`` of a topic with ``replicas`` copies: 2 (1 below 3 copies, where 2 would stop
    every write while one broker is away)."""
    return CLUSTER_MIN_INSYNC if replicas >= CLUSTER_REPLICAS else 1


def lane_topic(settings: KafkaSettings, lane: Lane) -> str:
    """The chunk topic of a lane: 'online' for interactive writes, 'bulk' for backfills."""
    if lane == "online":
        return settings.topic_chunks_online
    if lane == "bulk":
        return settings.topic_chunks_bulk
    raise ValueError(f"lane must be 'online' or 'bulk', got {lane!r}")


def ensure_topics(
    settings: KafkaSettings,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int | None = None,
    topics: Iterable[str] | None = None,
    timeout_s: float = 30.0,
) -> list[str]:
    """Create the missing topics (default: all of ``settings``); returns the ones created. Idempotent.

    ``replication``: replicas of each (None: ``replication_factor`` for the brokers the cluster lists).
    Existing topics are left as they are (their partition count is not changed).
    """
    if partitions < 1 or (replication is not None and replication < 1):
        raise ValueError("partitions and replication must be at least 1")
    wanted = list(dict.fromkeys(topics if topics is not None else all_topics(settings)))
    admin = KafkaAdminClient(**settings.client_kwargs(), client_id="embedstream-admin")
    try:
        existing = set(admin.list_topics())
        missing = [t for t in wanted if t not in existing]
        created = []
        replicas = replication
        if missing and replicas is None:
            replicas = replication_factor(settings, len(admin.describe_cluster()["brokers"]))
        for topic in missing:  # one by one, so a concurrent creator only costs that topic's error
            try:
                admin.create_topics(
                    {topic: {"num_partitions": partitions, "replication_factor": replicas,
                             "configs": topic_configs(settings, topic, replicas)}},
                    timeout_ms=int(timeout_s * 1000),
                    wait_for_metadata=True,
                )
                created.append(topic)
            except TopicAlreadyExistsError:
                pass
        if created:
            log.info("topics created", topics=created, partitions=partitions, replicas=replicas)
        return created
    finally:
        admin.close()


def is_project_topic(settings: KafkaSettings, topic: str) -> bool:
    """One of the project's topics (``all_topics``, or a collection's search topic): workers may create it."""
    from embedstream.producers.search_routing import is_search_topic

    return topic in all_topics(settings) or is_search_topic(settings, topic)


def deployment_topics(settings) -> list[str]:
    """Every topic of a deployment (``embedstream.config.Settings``): ``all_topics`` and its collection's search topic."""
    from embedstream.producers.search_routing import search_topic

    return [*all_topics(settings.kafka), search_topic(settings.kafka, settings.qdrant.collection)]
