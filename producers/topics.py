"""Topic administration: which topics embedstream uses, how they are configured, creating them, checking them.

Topics are created with an explicit partition count: auto-created topics would get whatever the
broker defaults to, or fail where auto-creation is disabled.

**Replication is what was asked, never what happens to be alive** (issue #41). A topic gets
``KafkaSettings.replication_factor`` replicas; unset, the cluster's own configured replication: the
larger of its brokers' ``default.replication.factor`` and ``offsets.topic.replication.factor``, static
configs read from any live broker, the same whichever broker is down. Why those two: the first is
what the cluster's operator asked for new topics (Kafka's own choice for auto-created topics and for
a CreateTopics without a factor, KIP-464); the second is what the cluster keeps its committed offsets
with, and it cannot exceed the brokers a working cluster has (its default is 3, and the offsets topic,
hence every consumer group, does not work until that many brokers exist). The project's topics are as
precious as its committed offsets. So a single dev broker (both 1) gets one copy, the dev cluster and
an untuned 3-broker cluster (Kafka's defaults: 1 and 3) get 3. ``min.insync.replicas`` is
``KafkaSettings.min_insync_replicas``, unset 2 with 3 copies or more (with the producers' ``acks=all``
an acknowledged record survives the loss of any one broker), else 1.

A topic is never created with fewer replicas because a broker is down. Kafka 4's controller places a
replica on a registered broker that is down when too few are alive (it catches up on its return); where it
cannot (too few brokers registered), creation waits (within its ``timeout_s``) for brokers, then fails with
:class:`TopicsError` naming the topic, the wanted factor and the brokers alive. :func:`replication_report` says which existing topics have fewer
replicas or a lower ``min.insync.replicas`` than the settings ask (``/readyz`` and ``embedstream dev
kafka status`` show it).

The admin client is librdkafka's (confluent-kafka), like every other client of the default path.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.errors import CodedError
from embedstream.schemas.events import Lane

log = logs.get("embedstream.topics")

DEFAULT_PARTITIONS = 4
CLUSTER_REPLICAS = 3  # from this many copies on, a write needs two in sync
CLUSTER_MIN_INSYNC = 2
#: the broker configs whose larger value is a topic's replication when the setting is unset
CLUSTER_REPLICATION_CONFIGS = ("default.replication.factor", "offsets.topic.replication.factor")
_WAIT_STEP_S = 1.0
_CONFIGS_REFUSED_SAID = False
# librdkafka's and the broker's codes for "the cluster is away, busy or electing": try again later
_RETRIABLE = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN, KafkaError.REQUEST_TIMED_OUT,
              KafkaError.NOT_CONTROLLER, KafkaError.BROKER_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE,
              KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.NETWORK_EXCEPTION, KafkaError.COORDINATOR_NOT_AVAILABLE}


class TopicsError(CodedError):
    """A topic could not be created or checked. ``retriable``: the cluster may allow it later (a broker down,
    a timeout); not retriable: someone must act (no right to create, a policy refusing the topic)."""

    def __init__(self, code: str, message: str, retriable: bool = False):
        super().__init__(code, message)
        self.retriable = retriable


@dataclass(frozen=True)
class Replication:
    """What a topic of the project should have: ``replicas`` copies, ``min_insync`` of them for a write.
    None: the broker's own default (its configs were not readable: a principal without DescribeConfigs)."""

    replicas: int | None
    min_insync: int | None
    source: str  # where the number came from, for messages: the setting, or the cluster's configs


@dataclass(frozen=True)
class TopicReplication:
    """An existing topic's replication against what the settings ask (``replicas``: its smallest partition's)."""

    topic: str
    replicas: int
    min_insync: int
    wanted_replicas: int
    wanted_min_insync: int

    @property
    def below(self) -> bool:
        return self.replicas < self.wanted_replicas or self.min_insync < self.wanted_min_insync

    def to_dict(self) -> dict:
        return asdict(self)


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


def min_insync(replicas: int) -> int:
    """``min.insync.replicas`` of a topic with ``replicas`` copies when the setting is unset: 2 from 3 copies on
    (1 below, where 2 would stop every write while one broker is away)."""
    return CLUSTER_MIN_INSYNC if replicas >= CLUSTER_REPLICAS else 1


def replication_from(settings: KafkaSettings, cluster_configs: dict[str, str] | None) -> Replication:
    """The replication the settings ask for, given a live broker's configs (None: not readable).

    The settings win; unset, the larger of ``CLUSTER_REPLICATION_CONFIGS`` (the module's docstring says why).
    Neither known: the broker's ``default.replication.factor`` and ``min.insync.replicas`` (a CreateTopics
    without a factor, KIP-464), which the broker checks against its brokers alive all the same."""
    if settings.replication_factor is not None:
        replicas, source = settings.replication_factor, "EMBEDSTREAM_KAFKA__REPLICATION_FACTOR"
    else:
        values = {name: int(cluster_configs[name]) for name in CLUSTER_REPLICATION_CONFIGS
                  if cluster_configs and cluster_configs.get(name)}
        if not values:
            return Replication(None, settings.min_insync_replicas, "the broker's default.replication.factor (its "
                               "configs are not readable here: set EMBEDSTREAM_KAFKA__REPLICATION_FACTOR to check it)")
        replicas = max(1, *values.values())
        source = "the cluster's " + ", ".join(f"{name}={value}" for name, value in values.items())
    wanted_isr = settings.min_insync_replicas if settings.min_insync_replicas is not None else min_insync(replicas)
    if wanted_isr > replicas:
        raise TopicsError("replication_invalid", f"EMBEDSTREAM_KAFKA__MIN_INSYNC_REPLICAS={wanted_isr} is above the "
                          f"replication factor {replicas} ({source}): no write could ever be acknowledged")
    return Replication(replicas, wanted_isr, source)


def topic_configs(settings: KafkaSettings, topic: str, replication: Replication | None = None) -> dict[str, str]:
    """Per-topic broker configs: the documents log and the claims are compacted (the latest per key survives); a
    replicated topic takes a write once ``min_insync`` replicas have it."""
    configs = {}
    if replication is not None and replication.min_insync is not None and (replication.replicas or 0) != 1:
        configs["min.insync.replicas"] = str(replication.min_insync)
    if topic in (settings.topic_documents, settings.topic_claims):
        configs["cleanup.policy"] = "compact"
    return configs


def lane_topic(settings: KafkaSettings, lane: Lane) -> str:
    """The chunk topic of a lane: 'online' for interactive writes, 'bulk' for backfills."""
    if lane == "online":
        return settings.topic_chunks_online
    if lane == "bulk":
        return settings.topic_chunks_bulk
    raise ValueError(f"lane must be 'online' or 'bulk', got {lane!r}")


# ------------------------------------------------------------------------------------------ the admin


class _Admin:
    """librdkafka's AdminClient with the few questions this module asks, each bounded and in its words."""

    def __init__(self, settings: KafkaSettings):
        self.settings = settings
        self.client = AdminClient(settings.librdkafka_config(**{"client.id": "embedstream-admin"}))

    def metadata(self, timeout_s: float, topic: str | None = None):
        try:
            return self.client.list_topics(topic, timeout=max(0.5, timeout_s))
        except KafkaException as exc:
            raise _error(exc, f"no metadata from {self.settings.bootstrap_servers}") from None

    def brokers(self, timeout_s: float) -> list[int]:
        """The ids of the brokers alive now (those the cluster's metadata lists: fenced ones are not)."""
        return sorted(self.metadata(timeout_s).brokers)

    def cluster_configs(self, broker: int, timeout_s: float) -> dict[str, str] | None:
        """A live broker's configs (None: DescribeConfigs refused, e.g. no right on the cluster)."""
        resource = ConfigResource(ResourceType.BROKER, str(broker))
        try:
            entries = self.client.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
        except KafkaException as exc:
            global _CONFIGS_REFUSED_SAID
            if not _CONFIGS_REFUSED_SAID:  # once per process: /readyz asks every minute
                _CONFIGS_REFUSED_SAID = True
                log.warning("cannot read the broker's configs; the broker's default replication is used",
                            broker=broker, error=str(exc.args[0])[:300])
            return None
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def topic_min_insync(self, topics: list[str], timeout_s: float) -> dict[str, int]:
        """``min.insync.replicas`` in force for each topic (its own, else the broker's default)."""
        resources = {topic: ConfigResource(ResourceType.TOPIC, topic) for topic in topics}
        futures = self.client.describe_configs(list(resources.values()), request_timeout=timeout_s) if topics else {}
        out = {}
        for topic, resource in resources.items():
            try:
                entries = futures[resource].result(timeout_s)
            except KafkaException as exc:
                raise _error(exc, f"cannot read the configs of topic {topic!r}") from None
            out[topic] = int(entries["min.insync.replicas"].value)
        return out

    def replication(self, timeout_s: float) -> Replication:
        if self.settings.replication_factor is not None:
            return replication_from(self.settings, None)
        brokers = self.brokers(timeout_s)
        if not brokers:
            raise TopicsError("no_brokers", f"no broker alive at {self.settings.bootstrap_servers}", retriable=True)
        return replication_from(self.settings, self.cluster_configs(brokers[0], timeout_s))


def _error(exc: KafkaException, what: str) -> TopicsError:
    err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if err is None:
        return TopicsError("kafka_error", f"{what}: {exc}", retriable=True)
    return TopicsError(err.name().lower().lstrip("_"), f"{what}: {err.str()}",
                       retriable=err.code() in _RETRIABLE or err.retriable())


def _short_of_brokers(topic: str, replication: Replication, alive: list[int], waited_s: float,
                      said: str) -> TopicsError:
    return TopicsError("replication_unavailable", (
        f"cannot create topic {topic!r} with replication factor {replication.replicas or 'the broker default'} "
        f"({replication.source}): {len(alive)} broker(s) alive ({', '.join(map(str, alive)) or 'none'}), waited "
        f"{waited_s:.0f} s; the controller says: {said.rstrip('.')}. Start the missing broker(s), or set "
        f"EMBEDSTREAM_KAFKA__REPLICATION_FACTOR if the cluster is meant to be smaller"), retriable=True)


def ensure_topics(
    settings: KafkaSettings,
    partitions: int = DEFAULT_PARTITIONS,
    replication: int | None = None,
    topics: Iterable[str] | None = None,
    timeout_s: float = 30.0,
    wait_for_brokers_s: float | None = None,
) -> list[str]:
    """Create the missing topics (default: all of ``settings``); returns the ones created. Idempotent.

    ``replication``: replicas of each (None: the settings' or the cluster's, see the module's docstring). Existing
    topics are left as they are (their partitions and replication are not changed: :func:`replication_report`
    says which fall short). While the controller cannot place that many replicas (too few brokers registered),
    creation waits up to ``wait_for_brokers_s`` (None: ``timeout_s``; a lane that must go on serving passes 0 and
    tries again later), then raises :class:`TopicsError` (``replication_unavailable``, retriable). ``timeout_s``
    bounds the whole call."""
    if partitions < 1 or (replication is not None and replication < 1):
        raise ValueError("partitions and replication must be at least 1")
    wanted = list(dict.fromkeys(topics if topics is not None else all_topics(settings)))
    deadline = time.monotonic() + timeout_s
    admin = _Admin(settings)
    existing = set(admin.metadata(timeout_s).topics)
    missing = [t for t in wanted if t not in existing]
    if not missing:
        return []
    if replication is not None:
        rf = replication_from(settings.model_copy(update={"replication_factor": replication}), None)
    else:
        rf = admin.replication(max(1.0, deadline - time.monotonic()))
    wait_until = min(deadline, time.monotonic() + (timeout_s if wait_for_brokers_s is None else wait_for_brokers_s))
    created = [topic for topic in missing if _create(admin, topic, partitions, rf, wait_until, deadline)]
    if created:
        log.info("topics created", topics=created, partitions=partitions, replicas=rf.replicas, min_insync=rf.min_insync)
    return created


def _create(admin: _Admin, topic: str, partitions: int, rf: Replication, wait_until: float, deadline: float) -> bool:
    """One topic, with exactly ``rf.replicas`` copies; True when this call created it (False: someone else did).

    The controller places the replicas: on the brokers alive first, and on a registered broker that is down
    (fenced) when too few are alive, where the replica catches up once it is back (Kafka 4's placement). Only
    when it cannot (fewer brokers registered than the factor: one never started, or a 3.x controller that
    counts the alive ones) it answers INVALID_REPLICATION_FACTOR; then this waits for brokers until
    ``wait_until`` and fails naming the topic, the factor and the brokers alive. Never fewer copies.
    ``deadline`` bounds each request."""
    started = time.monotonic()
    while True:
        left = max(1.0, deadline - time.monotonic())
        future = admin.client.create_topics(
            [NewTopic(topic, partitions, rf.replicas or -1, config=topic_configs(admin.settings, topic, rf))],
            operation_timeout=left, request_timeout=left)[topic]
        try:
            future.result()
            _await_leaders(admin, topic, deadline)
            return True
        except KafkaException as exc:
            err = exc.args[0]
            if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return False
            if err.code() != KafkaError.INVALID_REPLICATION_FACTOR:
                raise _error(exc, f"cannot create topic {topic!r}") from None
            said = err.str()
        alive = admin.brokers(left)
        if time.monotonic() >= wait_until:
            raise _short_of_brokers(topic, rf, alive, time.monotonic() - started, said)
        log.warning("waiting for brokers before creating a topic", topic=topic, replicas=rf.replicas,
                    brokers_alive=alive, waited_s=round(time.monotonic() - started, 1), said=said)
        time.sleep(min(_WAIT_STEP_S, max(0.0, wait_until - time.monotonic())))


def _await_leaders(admin: _Admin, topic: str, deadline: float) -> None:
    """Until the new topic's every partition has a leader in the metadata (clients may use it at once)."""
    while True:
        found = admin.metadata(max(0.5, deadline - time.monotonic()), topic).topics.get(topic)
        if found is not None and found.error is None and found.partitions and \
                all(p.leader >= 0 for p in found.partitions.values()):
            return
        if time.monotonic() >= deadline:
            return  # created; its leaders will be known shortly
        time.sleep(0.05)


def delete_topics(settings: KafkaSettings, topics: Iterable[str], timeout_s: float = 10.0) -> None:
    """Delete ``topics`` (a client's own reply topic, at its close); a refusal or a timeout is logged, not raised."""
    admin = _Admin(settings).client  # held until the answers are in (a collected client cancels them)
    futures = admin.delete_topics(list(topics), operation_timeout=timeout_s, request_timeout=timeout_s)
    for topic, future in futures.items():
        try:
            future.result(timeout_s)
        except Exception as exc:  # noqa: BLE001 - closing: say it, carry on (the topic is only left behind)
            log.warning("could not delete the topic", topic=topic, error=str(exc)[:300])


def replication_report(settings: KafkaSettings, topics: Iterable[str], timeout_s: float = 10.0) -> list[TopicReplication]:
    """Every existing topic of ``topics`` with its replication against the settings' (missing topics are left
    out: creating them is ``ensure_topics``'s). ``[t for t in report if t.below]`` are the ones that fall short."""
    admin = _Admin(settings)
    wanted = admin.replication(timeout_s)
    if wanted.replicas is None or wanted.min_insync is None:
        raise TopicsError("replication_unknown", f"cannot check the topics' replication: the wanted factor is "
                          f"{wanted.source}", retriable=False)
    metadata = admin.metadata(timeout_s)
    present = [t for t in dict.fromkeys(topics) if t in metadata.topics and metadata.topics[t].partitions]
    in_sync = admin.topic_min_insync(present, timeout_s)
    return [TopicReplication(topic, min(len(p.replicas) for p in metadata.topics[topic].partitions.values()),
                             in_sync[topic], wanted.replicas, wanted.min_insync) for topic in present]


def under_replicated(settings: KafkaSettings, topics: Iterable[str], timeout_s: float = 10.0) -> list[TopicReplication]:
    """The existing topics of ``topics`` whose replicas or ``min.insync.replicas`` are below the settings'."""
    return [t for t in replication_report(settings, topics, timeout_s) if t.below]


def is_project_topic(settings: KafkaSettings, topic: str) -> bool:
    """One of the project's topics (``all_topics``, the claims, a collection's search or query topic): workers may
    create it."""
    from embedstream.producers.search_routing import is_collection_topic

    return topic in all_topics(settings) or topic == settings.topic_claims or is_collection_topic(settings, topic)


def deployment_topics(settings) -> list[str]:
    """Every topic of a deployment (``embedstream.config.Settings``): ``all_topics``, its collection's own and the
    claims (shared by all deployments: ``workers/claim.py``)."""
    from embedstream.producers.search_routing import collection_topics

    return [*all_topics(settings.kafka), *collection_topics(settings.kafka, settings.qdrant.collection),
            settings.kafka.topic_claims]


def replication_status(settings: KafkaSettings, topics: Iterable[str] | None = None, timeout_s: float = 10.0) -> dict:
    """What ``/readyz`` and ``embedstream dev kafka status`` say about replication: ``under_replicated``, the
    project topics (``topics``, default: every existing topic of the project) below the settings, or
    ``replication_check``, why it could not be told. Never raises: it reports."""
    try:
        if topics is None:
            listed = _Admin(settings).metadata(timeout_s).topics
            topics = sorted(t for t in listed if is_project_topic(settings, t))
        return {"under_replicated": [t.to_dict() for t in under_replicated(settings, topics, timeout_s)]}
    except Exception as exc:  # noqa: BLE001 - a report: the reason goes in it
        return {"replication_check": f"{type(exc).__name__}: {str(exc)[:300]}"}
