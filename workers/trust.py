"""What a worker believes of a producer: the trust boundary as pure policy functions (no Kafka, no store).

Everyone who can write to a request or chunk topic is a producer, and a producer's event is a claim,
not an instruction. Found by sending events with kcat: a stale ``content_hash`` with new text made
the worker skip the chunk as unchanged (the index kept the old text); ``"collection":
"attacker-made-1"`` created a collection; ``reply_to`` made the worker produce to any topic (and,
on brokers with auto-creation, create it). So:

* the content hash the sink stores and compares is computed here from the text; the producer's
  value is at most a hint (the skip-unchanged check also compares the model, which the sink reads
  from the worker, and the metadata decides only whether the payload is rewritten);
* a collection named by a producer must be on an allow-list: the configured collection, its
  versions ``<name>_v<N>`` (what ``reindex`` creates), and configured extras;
* ``reply_to`` must be the configured replies topic, or start with it or a configured prefix, be a
  valid Kafka topic name, and never an internal ``__`` topic.

Field bounds (lengths, characters, numbers) are the decoder's job (:mod:`embedstream.schemas.bounds`);
this module decides what a well-formed event is allowed to do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from embedstream.errors import CodedError
from embedstream.schemas.bounds import MAX_COLLECTION_CHARS, MAX_TOPIC_CHARS, SAFE_NAME_PATTERN
from embedstream.schemas.events import ChunkEvent, DocumentDelete, QueryRequest
from embedstream.schemas.events import content_hash as _sha256_of_text
from embedstream.schemas.rerank import RerankRequest, SearchRequest

__all__ = [
    "TrustError",
    "TrustPolicy",
    "TrustSettings",
    "base_collection",
    "check_trust",
    "collection_refusal",
    "content_hash",
    "reply_to_refusal",
    "with_worker_hash",
]

_SAFE_NAME = re.compile(SAFE_NAME_PATTERN)
_VERSION_SUFFIX = re.compile(r"_v[1-9][0-9]{0,8}$")


class TrustSettings(BaseModel):
    """Allow-lists beyond the defaults. Nested in Settings as ``trust``: ``EMBEDSTREAM_TRUST__COLLECTIONS='["a"]'``."""

    collections: list[str] = Field(
        default_factory=list,
        description="Collections producers may name besides EMBEDSTREAM_QDRANT__COLLECTION (their _v<N> versions too)",
    )
    reply_topics: list[str] = Field(default_factory=list, description="Reply topics allowed besides the replies topic")
    reply_topic_prefixes: list[str] = Field(
        default_factory=list,
        description="Reply topics starting with one of these are allowed (the replies topic's own name always is)",
    )


@dataclass(frozen=True)
class TrustPolicy:
    """The allow-lists in effect: the configured collection and replies topic plus :class:`TrustSettings`."""

    collection: str
    replies_topic: str
    extra_collections: frozenset[str] = frozenset()
    reply_topics: frozenset[str] = frozenset()
    reply_topic_prefixes: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Any) -> TrustPolicy:
        """From :class:`embedstream.config.Settings` (``qdrant.collection``, ``kafka.topic_replies``, ``trust``)."""
        trust = getattr(settings, "trust", None) or TrustSettings()
        return cls.build(settings.qdrant.collection, settings.kafka.topic_replies, trust)

    @classmethod
    def build(cls, collection: str, replies_topic: str, trust: TrustSettings | None = None) -> TrustPolicy:
        trust = trust or TrustSettings()
        return cls(collection, replies_topic, frozenset(trust.collections), frozenset(trust.reply_topics),
                   (replies_topic, *trust.reply_topic_prefixes))


class TrustError(CodedError):
    """A well-formed event asking for something producers may not do.

    Codes: ``reply_to_not_allowed`` (never reply there: dead-letter the request) and
    ``collection_not_allowed`` (a chunk or delete: dead letter; a search: an error reply is safe,
    its ``reply_to`` having passed). ``may_reply`` says which.
    """

    @property
    def may_reply(self) -> bool:
        return self.code != "reply_to_not_allowed"


def content_hash(text: str) -> str:
    """sha256 hex of the UTF-8 text: what the sink stores and compares, computed by the worker.

    The same function producers use for their hint, so points written before this check stay
    "unchanged" for unchanged text. Model and metadata are not folded in: the sink compares them
    as separate fields of the stored payload.
    """
    return _sha256_of_text(text)


def with_worker_hash(event: ChunkEvent) -> ChunkEvent:
    """The event with its content hash computed from its text (the producer's value discarded)."""
    own = content_hash(event.text)
    return event if event.content_hash == own else event.model_copy(update={"content_hash": own})


def base_collection(name: str) -> str:
    """The collection a name belongs to: ``docs_v3`` (a version ``reindex`` made) is ``docs``'s."""
    return _VERSION_SUFFIX.sub("", name)


def collection_refusal(name: str | None, policy: TrustPolicy) -> str | None:
    """Why a producer may not address collection ``name``, or None when it may (None = the default)."""
    if name is None:
        return None
    if not name or len(name) > MAX_COLLECTION_CHARS or not _SAFE_NAME.fullmatch(name):
        return (f"collection {_shown(name)} is not a valid collection name "
                f"(1-{MAX_COLLECTION_CHARS} of [a-zA-Z0-9._-], not starting with '.')")
    base = base_collection(name)
    allowed = {policy.collection, *policy.extra_collections}
    if name in allowed or base in allowed:
        return None
    return (f"collection {_shown(name)} is not allowed: producers may name {policy.collection!r}, its versions "
            f"{policy.collection}_v<N>{' and the configured extras' if policy.extra_collections else ''} "
            "(EMBEDSTREAM_TRUST__COLLECTIONS)")


def reply_to_refusal(topic: str, policy: TrustPolicy) -> str | None:
    """Why a worker must not produce a reply to ``topic``, or None when it may."""
    if not topic or len(topic) > MAX_TOPIC_CHARS or not _SAFE_NAME.fullmatch(topic):
        return (f"reply_to {_shown(topic)} is not a valid Kafka topic name "
                f"(1-{MAX_TOPIC_CHARS} of [a-zA-Z0-9._-], not starting with '.')")
    if topic.startswith("__"):
        return f"reply_to {_shown(topic)} is an internal topic"
    if topic in policy.reply_topics or any(topic.startswith(prefix) for prefix in policy.reply_topic_prefixes):
        return None
    return (f"reply_to {_shown(topic)} is not allowed: replies go to {policy.replies_topic!r} or topics starting "
            "with it or a configured prefix (EMBEDSTREAM_TRUST__REPLY_TOPIC_PREFIXES)")


def check_trust(event: Any, policy: TrustPolicy) -> Any:
    """The event as the worker may act on it, or TrustError: one call right after decoding.

    Chunks come back with the worker's own content hash; ``reply_to`` is checked before the
    collection, so a refused collection can still be answered safely.
    """
    if isinstance(event, (QueryRequest, RerankRequest, SearchRequest)):
        reason = reply_to_refusal(event.reply_to, policy)
        if reason:
            raise TrustError("reply_to_not_allowed", reason)
    if isinstance(event, (ChunkEvent, DocumentDelete, SearchRequest)):
        reason = collection_refusal(event.collection, policy)
        if reason:
            raise TrustError("collection_not_allowed", reason)
    if isinstance(event, ChunkEvent):
        return with_worker_hash(event)
    return event


def _shown(value: str, limit: int = 80) -> str:
    """repr of a producer's value, cut short: refusal messages must stay bounded."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + f"... ({len(value)} characters)"
