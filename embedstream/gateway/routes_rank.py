"""Rerank (TEI and Cohere/Jina shapes) and search routes."""

from __future__ import annotations

import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse

from embedstream.gateway.bodies import CohereRerank, SearchBody, TeiRerank, read_json, validate
from embedstream.gateway.formats import relevance
from embedstream.gateway.responses import timing_headers
from embedstream.gateway.service import Gateway


async def rerank(gateway: Gateway, request: Request, dialect_box: list[str]) -> JSONResponse:
    """``/rerank``: TEI's ``{query, texts}`` or Cohere/Jina's ``{query, documents}``, told apart by the keys."""
    deadline = gateway.deadline(request.headers)
    body = await read_json(request, gateway.options.max_body_bytes)
    if isinstance(body, dict) and "documents" in body and "texts" not in body:
        dialect_box[0] = "cohere"
        return await _cohere(gateway, validate(CohereRerank, body), deadline)
    tei = validate(TeiRerank, body)  # over-long texts are cut to fit by the reranker whatever ``truncate`` says
    reply = await gateway.rerank(tei.query, tei.texts, None, deadline)
    activation = gateway.rerank_spec.activation
    out = []
    for result in reply.results:
        item = {"index": int(result.id), "score": relevance(result.score, activation, tei.raw_scores)}
        if tei.return_text:
            item["text"] = tei.texts[int(result.id)]
        out.append(item)
    return JSONResponse(out, headers=timing_headers(reply.timings_ms))


async def cohere_rerank(gateway: Gateway, request: Request) -> JSONResponse:
    """``/v1/rerank`` and ``/v2/rerank`` (Cohere; Jina uses the same body)."""
    deadline = gateway.deadline(request.headers)
    body = validate(CohereRerank, await read_json(request, gateway.options.max_body_bytes))
    return await _cohere(gateway, body, deadline)


async def _cohere(gateway: Gateway, body: CohereRerank, deadline: float) -> JSONResponse:
    model = gateway.check_model(body.model, "rerank")
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    reply = await gateway.rerank(body.query, texts, body.top_n, deadline, what="documents",
                                 max_tokens_per_doc=body.max_tokens_per_doc)
    activation = gateway.rerank_spec.activation
    results = []
    for result in reply.results:
        item: dict = {"index": int(result.id), "relevance_score": relevance(result.score, activation, raw=False)}
        if body.return_documents:
            item["document"] = {"text": texts[int(result.id)]}
        results.append(item)
    out = {"id": uuid.uuid4().hex, "model": model, "results": results,
           "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}}
    return JSONResponse(out, headers=timing_headers(reply.timings_ms))


async def search(gateway: Gateway, request: Request) -> JSONResponse:
    """``/search``: embed -> vector search [-> rerank]; hits with payloads and stage times. The rerank workers
    answer it when one runs and ``rerank`` is asked, the embed workers otherwise (vector order)."""
    deadline = gateway.deadline(request.headers)
    body = validate(SearchBody, await read_json(request, gateway.options.max_body_bytes))
    reply = await gateway.search(body.model_dump(), deadline)
    out = {"hits": [hit.model_dump() for hit in reply.hits], "collection": reply.collection, "model": reply.model,
           "timings_ms": reply.timings_ms}
    return JSONResponse(out, headers=timing_headers(reply.timings_ms))
