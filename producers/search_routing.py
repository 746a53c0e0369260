"""Where a search goes: to the deployment that writes its collection, and to no one else (issue #34).

An embed worker deployment writes one collection (``EMBEDSTREAM_QDRANT__COLLECTION``) and answers the
searches of that collection only. A search is published on its collection's own topic,
``<topic_search>.<collection>``, which one consumer group reads, ``<group_search>.<collection>``: the
search lanes of that deployment. One topic, one group: a request reaches exactly one worker (the member
holding its partition), so it gets exactly one reply, and the hits come from the index it names, whatever
the partition assignment.

* The versions ``reindex`` makes (``docs_v2``) and the alias (``docs``) route together: one deployment writes
  them all (:func:`embedstream.workers.trust.base_collection`).
* A search naming no collection is the sender's deployment default (its ``EMBEDSTREAM_QDRANT__COLLECTION``):
  :func:`route` fills it in before sending, so the owner, the rerank workers and the reply agree on it.
* A search asking for a rerank takes the same way: its owner hands it on to the rerank workers' topic
  (``topic_search``) while their group has members, else answers it in vector order
  (``workers/vector_search.py``): one decision, by one worker, per request.
* A collection no deployment serves: the request sits on a topic no group reads, and the caller's wait ends
  in a timeout that names the collection (:func:`unanswered`), never in another index's hits.
* The search's query embedding goes to the owner too (issue #41): to the collection's own queries topic,
  ``<topic_queries>.<collection>`` (:func:`query_topic`), which the owning deployment's online lane reads in
  its online group. Embedded once, by the model that wrote the collection; on the shared ``topic_queries``
  every deployment's online group embedded it (N passes, the first reply won, possibly ``unknown_model``).
* Who owns a collection is checked, not assumed: ``workers/claim.py``.
"""

from __future__ import annotations

import hashlib

from embedstream.config import KafkaSettings
from embedstream.schemas.bounds import MAX_TOPIC_CHARS
from embedstream.schemas.rerank import SearchRequest
from embedstream.workers.trust import base_collection

__all__ = ["collection_topics", "query_topic", "route", "search_group", "search_topic", "serves", "unanswered"]

_DIGEST_CHARS = 12


def _qualified(prefix: str, collection: str) -> str:
    """``prefix.collection``; a name too long for a topic keeps its start and a digest of the whole."""
    name = f"{prefix}.{collection}"
    if len(name) <= MAX_TOPIC_CHARS:
        return name
    digest = hashlib.sha256(collection.encode()).hexdigest()[:_DIGEST_CHARS]
    return f"{name[: MAX_TOPIC_CHARS - _DIGEST_CHARS - 1]}-{digest}"


def search_topic(kafka: KafkaSettings, collection: str) -> str:
    """The topic of the searches of ``collection`` (and of its versions)."""
    return _qualified(kafka.topic_search, base_collection(collection))


def search_group(kafka: KafkaSettings, collection: str) -> str:
    """The consumer group of the deployment that writes ``collection``: its search lanes."""
    return _qualified(kafka.group_search, base_collection(collection))


def query_topic(kafka: KafkaSettings, collection: str) -> str:
    """The topic of the query embeddings of ``collection``'s searches: read by its owner's online lane only."""
    return _qualified(kafka.topic_queries, base_collection(collection))


def collection_topics(kafka: KafkaSettings, collection: str) -> list[str]:
    """A collection's own topics: its searches and their query embeddings."""
    return [search_topic(kafka, collection), query_topic(kafka, collection)]


def online_topics(kafka: KafkaSettings, collection: str) -> list[str]:
    """What the online lane of the deployment writing ``collection`` reads: online chunks, the shared queries topic
    (``embedstream embed``, the gateway's embeddings) and the collection's own (its searches' query embeddings)."""
    return [kafka.topic_chunks_online, kafka.topic_queries, query_topic(kafka, collection)]


def is_query_topic(kafka: KafkaSettings, topic: str) -> bool:
    """Whether a record of ``topic`` is a query embedding request: the shared queries topic or a collection's."""
    return topic == kafka.topic_queries or topic.startswith(f"{kafka.topic_queries}.")


def is_search_topic(kafka: KafkaSettings, topic: str) -> bool:
    """Whether ``topic`` is a collection's search topic (the project creates it like its other topics)."""
    return topic.startswith(f"{kafka.topic_search}.")


def is_collection_topic(kafka: KafkaSettings, topic: str) -> bool:
    """Whether ``topic`` is a collection's search or query topic."""
    return is_search_topic(kafka, topic) or (is_query_topic(kafka, topic) and topic != kafka.topic_queries)


def serves(own: str, requested: str | None) -> bool:
    """Whether the deployment writing ``own`` answers a search for ``requested`` (None: the topic's own)."""
    return requested is None or base_collection(requested) == base_collection(own)


def route(kafka: KafkaSettings, default_collection: str, request: SearchRequest) -> tuple[str, SearchRequest]:
    """The topic to publish ``request`` on, and the request with its collection named (the default's if none)."""
    if request.collection is None:
        request = request.model_copy(update={"collection": default_collection})
    return search_topic(kafka, request.collection), request  # type: ignore[arg-type]


def unanswered(topic: str, collection: str, waited_s: float) -> str:
    """What a caller is told when no reply came: no deployment serves the collection, or it is too slow."""
    return (f"no reply within {waited_s:g} s from a deployment serving collection {collection!r} (search topic "
            f"{topic!r}): is an embed worker writing {collection!r} running with its search lane on?")
