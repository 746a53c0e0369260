"""One collection, one owner (issue #41): a deployment's claim on the collection it writes, held by Kafka itself.

The claim is the membership of the collection's search group (``producers/search_routing.search_group``),
which the owning deployment's search lanes join anyway: each member's ``client.id`` carries its deployment's
name (``KafkaSettings.deployment_name``: ``EMBEDSTREAM_KAFKA__DEPLOYMENT``, else the deployment's online
group; the Helm chart sets the release's name), as ``...@<deployment>``. Nothing is stored besides what the
group coordinator already keeps: a claim lives exactly as long as the deployment has a member in the group
(a static member, through its restarts, until its session times out).

* **Before joining**, a worker that writes a collection (``worker embed``, with or without its search lane)
  describes the group: members of another deployment mean the collection is served, and the worker refuses
  to start (:class:`CollectionClaimed`, exit 2) with a message naming both deployments and the members.
* **After joining**, the search lane looks again every ``recheck_s``: two deployments that started within
  the same few seconds both passed the first check. Then the one whose name sorts first keeps the collection
  and the other stops with the same error; its members leave, the partitions go back to the first.
* Members of the same deployment are never a conflict: replicas, a restart, a rolling upgrade (old and new
  pods side by side) share the name. Members without a name (a release before this check) are not counted:
  an upgrade from it is not refused.
"""

from __future__ import annotations

import re
import time

from embedstream import logs
from embedstream.config import KafkaSettings
from embedstream.errors import CodedError
from embedstream.producers.search_routing import search_group
from embedstream.workers.trust import base_collection

log = logs.get("embedstream.claim")

_NAME = re.compile(r"@([A-Za-z0-9._-]+)")
RECHECK_S = 30.0


class _NoMembers:
    members: list = []


_NO_MEMBERS = _NoMembers()


class CollectionClaimed(CodedError):
    """The collection is served by another deployment."""

    code = "collection_claimed"

    def __init__(self, message: str):
        super().__init__(self.code, message)


def deployment_of(client_id: str) -> str | None:
    """The deployment a member's ``client.id`` names (``...@<deployment>``), or None."""
    found = _NAME.search(client_id or "")
    return found.group(1) if found else None


class CollectionClaim:
    """The claim of this deployment (``kafka.deployment_name()``) on ``collection``."""

    def __init__(self, kafka: KafkaSettings, collection: str, recheck_s: float = RECHECK_S):
        self.kafka = kafka
        self.collection = base_collection(collection)
        self.deployment = kafka.deployment_name()
        self.group = search_group(kafka, collection)
        self.recheck_s = recheck_s
        self._admin = None
        self._next_check = time.monotonic() + recheck_s

    def member_id(self, worker_id: str) -> str:
        """A worker id that names this deployment; the search lane's ``client.id`` carries it."""
        return f"{worker_id}@{self.deployment}"

    def holders(self, timeout_s: float = 10.0) -> dict[str, list[str]]:
        """Other deployments with members in the collection's search group now: name -> their members (client id
        and host)."""
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self.kafka.librdkafka_config(**{"client.id": "embedstream-claim"}))
        description = self._describe(timeout_s)
        others: dict[str, list[str]] = {}
        for member in description.members:
            name = deployment_of(member.client_id)
            if name is not None and name != self.deployment:
                others.setdefault(name, []).append(f"{member.client_id} on {member.host}")
        return others

    def _describe(self, timeout_s: float):
        """The group's description; a coordinator still loading or moving is asked again (within ``timeout_s``)."""
        from confluent_kafka import KafkaError, KafkaException

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._admin.describe_consumer_groups([self.group], request_timeout=timeout_s)[self.group] \
                    .result(timeout=timeout_s)
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if code == KafkaError.GROUP_ID_NOT_FOUND:  # no group: nobody serves the collection
                    return _NO_MEMBERS
                retry = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                         KafkaError.COORDINATOR_NOT_AVAILABLE)
                if code not in retry or time.monotonic() >= deadline:
                    raise
            time.sleep(0.5)

    def check(self, joined: bool = False) -> None:
        """Raise :class:`CollectionClaimed` if another deployment serves the collection. ``joined``: this
        deployment is a member too (a simultaneous start): it keeps the collection if its name sorts first."""
        try:
            others = self.holders()
        except Exception as exc:  # noqa: BLE001 - the broker away or busy: nothing known, look again later
            log.warning("cannot see who serves the collection", collection=self.collection, group=self.group,
                        error=str(exc)[:300])
            return
        if not others or (joined and all(self.deployment < other for other in others)):
            return
        other = min(others)
        raise CollectionClaimed(
            f"collection {self.collection!r} is served by deployment {other!r} ({len(others[other])} member(s) of "
            f"its search group {self.group!r}: {'; '.join(others[other][:3])}); this deployment {self.deployment!r} "
            f"claims it too. Two deployments of one collection would split its searches and write it with two "
            f"models. Give this one its own collection (EMBEDSTREAM_QDRANT__COLLECTION), or stop {other!r} first; "
            f"the replicas of one deployment share its name (EMBEDSTREAM_KAFKA__DEPLOYMENT)")

    def recheck(self) -> None:
        """``check(joined=True)`` at most every ``recheck_s`` (the search lane calls it at every step)."""
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.recheck_s
            self.check(joined=True)
