"""Search without a cross-encoder: a deployment's search lane (embed -> Qdrant -> hits in vector order).

A user with an embedding model and a collection can search it (issue #29): ``worker embed`` runs this
loop next to its lanes, in the same process, on the store it writes (the embedded store belongs to
one process, so only that process can search it). Query vectors come from the embed workers' query lane
over Kafka (``kafka_embedder``: the same batching and admission as every query), the search plan and its
rescoring are ``Searcher``'s (Matryoshka prefetch, uint8 and quantized rescoring).

Searches reach the owner of their collection (issue #34, ``producers/search_routing.py``): the lane reads
its collection's own search topic in its collection's own group, so it sees only the searches of the
collection it writes, each one once per deployment. A request naming another collection (a producer that
wrote to the topic by hand) gets ``collection_not_served``, never this index's hits; one naming none is
this collection's.

Rerank only when a reranker runs and the request asks: a search asking for a rerank is handed on to the
rerank workers' topic (``topic_search``) while their group has members, and answered here in vector order
(``model`` null, no ``rerank_score``) while it has none. This lane decides, once, who answers: exactly one
reply per request.
"""

from __future__ import annotations

import time

from embedstream import logs
from embedstream.config import Settings
from embedstream.producers.query_client import QueryClient
from embedstream.producers.search_routing import search_group, search_topic, serves
from embedstream.schemas.codec import DecodeError, decode
from embedstream.schemas.rerank import SearchRequest
from embedstream.workers.claim import CollectionClaim, claim_store
from embedstream.workers.transport.kafka_io import group_members
from embedstream.workers.loop import WorkerLoop, new_worker_id
from embedstream.workers.search import Searcher, SearchError, kafka_embedder
from embedstream.workers.trust import TrustError, TrustPolicy, check_trust

log = logs.get("embedstream.worker")

LANE = "search"
RERANKERS_TTL_S = 5.0


class RerankersProbe:
    """Whether the rerank workers' group has members, asked of the broker at most every ``ttl_s``."""

    def __init__(self, kafka, ttl_s: float = RERANKERS_TTL_S):
        self.kafka, self.ttl_s = kafka, ttl_s
        self._admin = None
        self._known: tuple[float, bool] | None = None

    def running(self) -> bool:
        now = time.monotonic()
        if self._known is not None and now - self._known[0] < self.ttl_s:
            return self._known[1]
        try:
            if self._admin is None:
                from confluent_kafka.admin import AdminClient

                self._admin = AdminClient(self.kafka.librdkafka_config(**{"client.id": "embedstream-search-probe"}))
            running = group_members(self._admin, self.kafka.group_rerank) > 0
        except Exception as exc:  # noqa: BLE001 - unknown: leave rerank requests to the rerank workers
            log.debug("rerank group probe failed", error=str(exc)[:300])
            running = True
        self._known = (now, running)
        return running

    def close(self) -> None:
        self._admin = None  # librdkafka's admin client has no close: its handle goes with the object


class VectorSearchWorker(WorkerLoop):
    """Search requests -> query vector (embed workers) -> store -> replies, one request at a time."""

    name = "vector search"

    def __init__(self, settings: Settings, store, model: str | None, metrics, embed_timeout_s: float = 5.0):
        self.claim = CollectionClaim(settings.kafka, settings.qdrant.collection, claim_store(settings.qdrant))
        self.claim.check(record=True)  # one collection, one owner (workers/claim.py)
        super().__init__(settings.kafka, settings.worker, metrics, self.claim.member_id(new_worker_id("search")))
        self.collection = settings.qdrant.collection  # the collection this deployment writes: the one it searches
        self.client = QueryClient(settings.kafka)  # kafka_embedder asks on the collection's queries topic: ours
        self.searcher = Searcher(store, kafka_embedder(self.client, model, embed_timeout_s), None, self.collection,
                                 dense_scale=settings.sparse.dense_scale, exact=settings.qdrant.exact_search)
        self.trust = TrustPolicy.from_settings(settings)
        self.rerankers = RerankersProbe(settings.kafka)
        self.lane = self.add_lane(LANE, [search_topic(settings.kafka, self.collection)],
                                  search_group(settings.kafka, self.collection), 16, online=True)

    def run_once(self) -> int:
        self.claim.recheck()
        records = self.lane.poll(self.lane.joining_timeout(50))
        for record in records:
            handle = self.lane.track(record)
            try:
                request = decode(record.value, SearchRequest, self.kafka.max_record_bytes)
                check_trust(request, self.trust)
            except DecodeError as err:
                self.lane.dead_letter(record, err.to_error_info(), handle)
                continue
            except TrustError as err:  # a refused reply_to is never answered
                if err.may_reply:
                    self.lane.reply(record, request, self._refused(request, err), handle)
                else:
                    self.lane.dead_letter(record, err.to_error_info(), handle)
                continue
            if not serves(self.collection, request.collection):
                self.lane.reply(record, request, self._refused(request, SearchError("collection_not_served", (
                    f"this deployment serves collection {self.collection!r}, not {request.collection!r}: "
                    f"send the search to {search_topic(self.kafka, request.collection)!r}"))), handle)
                continue
            request = request.model_copy(update={"collection": request.collection or self.collection})
            if request.rerank and self.rerankers.running():
                self.lane.forward(record, self.kafka.topic_search, request, handle)  # the rerank workers answer it
                continue
            try:
                reply = self.searcher.search(request.model_copy(update={"rerank": False}))
            except Exception as exc:  # noqa: BLE001 - a failing store or client fails this search, not the worker
                log.warning("search failed", request_id=request.request_id, error=str(exc)[:300])
                reply = self._refused(request, SearchError("search_failed", f"{type(exc).__name__}: {str(exc)[:500]}"))
            self.lane.reply(record, request, reply, handle)
        if records:
            self.commit()
        self.record_lag()
        return len(records)

    @staticmethod
    def _refused(request: SearchRequest, err: TrustError | SearchError):
        from embedstream.schemas.rerank import SearchReply

        return SearchReply(request_id=request.request_id, error=err.to_error_info(), timings_ms={})

    def record_lag(self) -> None:
        self.lane.record_lag(self.metrics)

    def close_resources(self) -> None:
        self.rerankers.close()
        self.client.close()

    def readiness_checks(self) -> dict:
        return {**super().readiness_checks(),
                "qdrant": lambda: self.searcher.store.list_collections() is not None}
