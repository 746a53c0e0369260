"""One collection, one owner (issue #41): a deployment's claim on the collection it writes, held by Kafka itself.

A deployment is named (``KafkaSettings.deployment_name``: ``EMBEDSTREAM_KAFKA__DEPLOYMENT``, else its online
group; the Helm chart: ``<namespace>.<release>``), and its search lanes' members carry the name in their
``client.id`` (``...@<deployment>``). Two things are checked, with nothing stored besides what Kafka keeps:

* **The collection's search group** (``producers/search_routing.search_group``): members of another deployment
  in it mean two deployments would split its searches. Deployments sharing the group prefix (the settings'
  defaults, the same Helm values) meet here.
* **The claims topic** (``KafkaSettings.topic_claims``, compacted, shared by every deployment, never scoped by
  release): for a collection of a Qdrant *server*, the record keyed ``<server URL>|<collection>`` names the
  deployment that serves it and its search group. Deployments whose names differ in everything else (two Helm
  releases, each with its own prefix) meet here: the claim holds while its deployment has a member in the
  group it names (a static member through its restarts, until its session times out); a claim whose
  deployment has none left is taken over. Embedded and ``:memory:`` stores belong to one process: no record.

When: **before joining**, a worker that writes a collection (``worker embed``, with or without its search
lane) looks, and refuses to start (:class:`CollectionClaimed`, exit 2) naming both deployments; the search lane
then records its claim. **After joining**, the search lane looks again every ``recheck_s``, for deployments
that started within the same seconds: in the search group, the name that sorts first keeps the collection;
in the claims topic, the last record does (Kafka's log order). The other stops with the same error.
Members of the same deployment are never a conflict: replicas, a restart, a rolling upgrade share the name.
Members without a name (a release before this check) are not counted: an upgrade from it is not refused.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from urllib.parse import urlsplit

from embedstream import logs
from embedstream.config import KafkaSettings, QdrantSettings
from embedstream.errors import CodedError
from embedstream.producers.search_routing import search_group
from embedstream.workers.trust import base_collection

log = logs.get("embedstream.claim")

_NAME = re.compile(r"@([A-Za-z0-9._-]+)")
RECHECK_S = 30.0
_TIMEOUT_S = 10.0


class CollectionClaimed(CodedError):
    """The collection is served by another deployment."""

    code = "collection_claimed"

    def __init__(self, message: str):
        super().__init__(self.code, message)


def deployment_of(client_id: str) -> str | None:
    """The deployment a member's ``client.id`` names (``...@<deployment>``), or None."""
    found = _NAME.search(client_id or "")
    return found.group(1) if found else None


def claim_store(qdrant: QdrantSettings) -> str | None:
    """The Qdrant server a deployment writes, as the claims key it (scheme and host lower-cased, no trailing '/');
    None for a store of one process (embedded, ``:memory:``)."""
    if not qdrant.url or qdrant.url == ":memory:":
        return None
    parts = urlsplit(qdrant.url.strip())
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rstrip('/')}"


class _NoMembers:
    members: list = []


class CollectionClaim:
    """The claim of this deployment (``kafka.deployment_name()``) on ``collection`` (of the server ``store``)."""

    def __init__(self, kafka: KafkaSettings, collection: str, store: str | None = None, recheck_s: float = RECHECK_S):
        self.kafka = kafka
        self.collection = base_collection(collection)
        self.store = store
        self.deployment = kafka.deployment_name()
        self.group = search_group(kafka, collection)
        self.key = f"{store}|{self.collection}" if store else None
        self.recheck_s = recheck_s
        self._admin = None
        self._claims_topic_made = False
        self._next_check = time.monotonic() + recheck_s

    def member_id(self, worker_id: str) -> str:
        """A worker id that names this deployment; the search lane's ``client.id`` carries it."""
        return f"{worker_id}@{self.deployment}"

    # -- what Kafka says ---------------------------------------------------------------------------
    def _admin_client(self):
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self.kafka.librdkafka_config(**{"client.id": "embedstream-claim"}))
        return self._admin

    def _describe(self, group: str, timeout_s: float = _TIMEOUT_S):
        """A group's description; a coordinator still loading or moving is asked again (within ``timeout_s``)."""
        from confluent_kafka import KafkaError, KafkaException

        retry = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError.COORDINATOR_NOT_AVAILABLE)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._admin_client().describe_consumer_groups([group], request_timeout=timeout_s)[group] \
                    .result(timeout=timeout_s)
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if code == KafkaError.GROUP_ID_NOT_FOUND:  # no such group: no members
                    return _NoMembers()
                if code not in retry or time.monotonic() >= deadline:
                    raise
            time.sleep(0.5)

    def members(self, group: str) -> dict[str, list[str]]:
        """The deployments with members in ``group`` now: name -> their members (client id on host)."""
        found: dict[str, list[str]] = {}
        for member in self._describe(group).members:
            name = deployment_of(member.client_id)
            if name is not None:
                found.setdefault(name, []).append(f"{member.client_id} on {member.host}")
        return found

    def holders(self) -> dict[str, list[str]]:
        """Other deployments with members in the collection's search group now."""
        return {name: who for name, who in self.members(self.group).items() if name != self.deployment}

    def claims(self) -> dict[str, dict]:
        """The claims topic's latest record per key (the topic is compacted and small: read from its start)."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        from embedstream.producers.topics import ensure_topics

        topic = self.kafka.topic_claims
        if not self._claims_topic_made:
            ensure_topics(self.kafka, partitions=1, topics=[topic])
            self._claims_topic_made = True
        consumer = Consumer(self.kafka.librdkafka_config(**{
            "group.id": f"embedstream-claim-{uuid.uuid4().hex}", "enable.auto.commit": False,
            "client.id": "embedstream-claim"}))
        try:
            partitions = sorted(consumer.list_topics(topic, timeout=_TIMEOUT_S).topics[topic].partitions)
            ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=_TIMEOUT_S)[1] for p in partitions}
            left = {p for p, end in ends.items() if end > 0}
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in left])
            latest: dict[str, dict] = {}
            deadline = time.monotonic() + _TIMEOUT_S
            while left and time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                if message.key() is not None and message.value() is not None:
                    try:
                        latest[message.key().decode()] = json.loads(message.value())
                    except ValueError:
                        pass  # not a claim: nobody's
                if message.offset() + 1 >= ends[message.partition()]:
                    left.discard(message.partition())
            return latest
        finally:
            consumer.close()

    def _record(self) -> None:
        """This deployment's claim on the collection of its server (the last record per key is the claim)."""
        from confluent_kafka import Producer

        producer = Producer(self.kafka.producer_config(**{"client.id": "embedstream-claim"}))
        value = {"deployment": self.deployment, "group": self.group, "collection": self.collection,
                 "store": self.store, "at_ms": int(time.time() * 1000)}
        producer.produce(self.kafka.topic_claims, key=self.key.encode(), value=json.dumps(value).encode())
        if producer.flush(_TIMEOUT_S):
            raise TimeoutError(f"the claim on {self.key!r} was not acknowledged within {_TIMEOUT_S:g} s")
        log.info("collection claimed", collection=self.collection, store=self.store, deployment=self.deployment,
                 topic=self.kafka.topic_claims)

    # -- the checks --------------------------------------------------------------------------------
    def check(self, joined: bool = False, record: bool = False) -> None:
        """Raise :class:`CollectionClaimed` if another deployment serves the collection. ``joined``: this deployment
        is a member of the search group too (a simultaneous start decides as the module says). ``record``: claim the
        collection of a server when no live deployment holds it (the search lane)."""
        try:
            others = self.holders()
            claim = self.claims().get(self.key) if self.key else None
        except Exception as exc:  # noqa: BLE001 - the broker away or busy: nothing known, look again later
            log.warning("cannot see who serves the collection", collection=self.collection, group=self.group,
                        error=str(exc)[:300])
            return
        if others and not (joined and all(self.deployment < other for other in others)):
            other = min(others)
            raise self._refusal(other, f"{len(others[other])} member(s) of the collection's search group "
                                       f"{self.group!r}: {'; '.join(others[other][:3])}")
        if claim is not None and claim.get("deployment") != self.deployment:
            owner, group = str(claim.get("deployment")), str(claim.get("group"))
            alive = self.members(group).get(owner, []) if group else []
            if alive:
                raise self._refusal(owner, f"its claim on {self.key!r} in {self.kafka.topic_claims!r}, "
                                           f"{len(alive)} member(s) of its search group {group!r}: {'; '.join(alive[:3])}")
            log.warning("taking over the claim of a deployment with no member left", collection=self.collection,
                        store=self.store, previous=owner, group=group)
        if record and self.key and (claim is None or claim.get("deployment") != self.deployment):
            self._record()

    def _refusal(self, other: str, evidence: str) -> CollectionClaimed:
        where = f"collection {self.collection!r}" + (f" of {self.store}" if self.store else "")
        return CollectionClaimed(
            f"{where} is served by deployment {other!r} ({evidence}); this deployment {self.deployment!r} claims it "
            f"too. Two deployments of one collection would split its searches and write it with two models. Give "
            f"this one its own collection (EMBEDSTREAM_QDRANT__COLLECTION), or stop {other!r} first; the replicas "
            f"of one deployment share its name (EMBEDSTREAM_KAFKA__DEPLOYMENT)")

    def recheck(self) -> None:
        """``check(joined=True, record=True)`` at most every ``recheck_s`` (the search lane calls it at every step)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.recheck_s
            self.check(joined=True, record=True)
