"""What a rerank worker can serve: a request's checks before it queues (pure; no Kafka, no model call)."""

from __future__ import annotations

from embedstream.engine.model_spec import ModelSpec
from embedstream.errors import CodedError
from embedstream.schemas.rerank import Candidate, RerankRequest, SearchRequest
from embedstream.workers.search import Searcher, SearchError


def servable(request: RerankRequest | SearchRequest, spec: ModelSpec, searcher: Searcher | None,
             max_candidates: int) -> list[Candidate]:
    """The candidates to score (cut when asked), or CodedError saying why the request cannot be served."""
    if isinstance(request, SearchRequest):
        if searcher is None:
            raise CodedError("search_unavailable", "this rerank worker has no searcher (vector store) configured")
        try:
            searcher.check(request, can_rerank=True)
        except SearchError as err:
            raise CodedError(err.code, err.message) from None
        return []
    if request.model and request.model not in (spec.name, str(spec.path)):
        raise CodedError("unknown_model",
                         f"model {request.model!r} is not served by this worker (it serves {spec.name!r})")
    if not request.query.strip():
        raise CodedError("empty_query", "query is empty")
    candidates = request.candidates
    if not candidates:
        raise CodedError("no_candidates", "the request has no candidates to rerank")
    limit = max_candidates
    if len(candidates) > limit:
        if not request.cut:
            raise CodedError("too_many_candidates",
                             f"{len(candidates)} candidates, over the limit of {limit} "
                             f"(send at most {limit}, or cut=true to keep the first {limit})")
        candidates = candidates[:limit]
    empty = [c.id for c in candidates if not c.text.strip()]
    if empty:
        raise CodedError("empty_text", f"candidate(s) with empty text: {', '.join(empty[:10])}")
    return candidates
