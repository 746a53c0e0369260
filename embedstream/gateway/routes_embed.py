"""Embedding routes in the three shapes clients speak: OpenAI, TEI and Cohere v2."""

from __future__ import annotations

import uuid

from starlette.requests import Request

from embedstream.gateway import formats
from embedstream.gateway.bodies import CohereEmbed, OpenAIEmbeddings, TeiEmbed, TeiEmbedSparse, read_json, validate
from embedstream.gateway.errors import ApiError
from embedstream.gateway.responses import VectorResponse, timing_headers
from embedstream.gateway.service import EmbedAsk, Embedded, Gateway

_COHERE_PROMPTS = {"search_query": "query", "search_document": "document"}


def _respond(body, done: Embedded, texts: list[str]) -> VectorResponse:
    headers = timing_headers(done.timings_ms, sum(done.tokens), sum(len(t) for t in texts))
    return VectorResponse(body, headers=headers)


async def openai_embeddings(gateway: Gateway, request: Request) -> VectorResponse:
    """OpenAI ``/v1/embeddings``: floats or base64 little-endian float32; ``usage`` in tokens."""
    deadline = gateway.deadline(request.headers)
    body = validate(OpenAIEmbeddings, await read_json(request, gateway.options.max_body_bytes))
    model = gateway.check_model(body.model)
    raw = body.input
    if isinstance(raw, str):
        texts = [raw]
    elif raw and all(isinstance(x, int) for x in raw):
        texts = gateway.decode_token_ids([raw])  # one input given as token ids
    elif raw and all(isinstance(x, list) for x in raw):
        texts = gateway.decode_token_ids(raw)
    else:
        texts = list(raw)
    done = await gateway.embed(EmbedAsk(texts, dimensions=body.dimensions), deadline)
    encode = formats.float_base64 if body.encoding_format == "base64" else (lambda v: v)
    tokens = sum(done.tokens)
    out = {"object": "list", "model": model,
           "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(done.vectors)],
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return _respond(out, done, texts)


def _tei_texts(gateway: Gateway, body: TeiEmbed | TeiEmbedSparse) -> list[str]:
    """A TEI body's inputs as a list, its prompt and truncation direction checked."""
    if body.prompt_name not in (None, "query", "document"):
        raise ApiError(422, "unknown_prompt", f"prompt_name {body.prompt_name!r} is not a prompt of "
                       f"{gateway.spec.name!r} (query, document)", param="prompt_name")
    if body.truncate and body.truncation_direction.lower() == "left":
        raise ApiError(422, "truncate_unsupported", "only right truncation is done", param="truncation_direction")
    return [body.inputs] if isinstance(body.inputs, str) else body.inputs


async def tei_embed(gateway: Gateway, request: Request) -> VectorResponse:
    """TEI ``/embed``: ``[[f32]]``; ``prompt_name`` picks the model's query or document prompt."""
    deadline = gateway.deadline(request.headers)
    body = validate(TeiEmbed, await read_json(request, gateway.options.max_body_bytes))
    texts = _tei_texts(gateway, body)
    ask = EmbedAsk(texts, body.dimensions, body.prompt_name, body.truncate, body.normalize)  # type: ignore[arg-type]
    done = await gateway.embed(ask, deadline, what="inputs")
    return _respond(done.vectors, done, texts)


async def tei_embed_sparse(gateway: Gateway, request: Request) -> VectorResponse:
    """TEI ``/embed_sparse``: ``[[{"index": i, "value": w}]]``, the embed workers' sparse vectors
    (``EMBEDSTREAM_SPARSE__KIND``; a worker without a sparse encoder refuses with ``sparse_unavailable``)."""
    deadline = gateway.deadline(request.headers)
    body = validate(TeiEmbedSparse, await read_json(request, gateway.options.max_body_bytes))
    texts = _tei_texts(gateway, body)
    ask = EmbedAsk(texts, None, body.prompt_name, body.truncate, sparse=True)  # type: ignore[arg-type]
    done = await gateway.embed(ask, deadline, what="inputs")
    out = []
    for i, terms in enumerate(done.sparse):
        if terms is None:
            raise ApiError(500, "sparse_failed", f"inputs[{i}]: the worker returned no sparse vector", param="inputs")
        out.append([{"index": index, "value": value} for index, value in zip(terms.indices, terms.values)])
    return _respond(out, done, texts)


async def cohere_embed(gateway: Gateway, request: Request) -> VectorResponse:
    """Cohere ``/v2/embed``: every asked embedding type from one float vector per text."""
    deadline = gateway.deadline(request.headers)
    body = validate(CohereEmbed, await read_json(request, gateway.options.max_body_bytes))
    gateway.check_model(body.model)
    if body.images:
        raise ApiError(422, "images_unsupported", f"{gateway.spec.name!r} embeds text only", param="images")
    if body.truncate == "START":
        raise ApiError(422, "truncate_unsupported", "only END truncation is done", param="truncate")
    truncate = None if body.truncate is None else body.truncate == "END"
    texts = body.texts or []
    prompt = _COHERE_PROMPTS.get(body.input_type or "")
    done = await gateway.embed(EmbedAsk(texts, body.output_dimension, prompt, truncate), deadline, what="texts")  # type: ignore[arg-type]
    kinds = list(dict.fromkeys(body.embedding_types or ["float"]))
    out = {"id": uuid.uuid4().hex, "response_type": "embeddings_by_type",
           "embeddings": {kind: formats.encode_as(done.vectors, kind) for kind in kinds}, "texts": texts,
           "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": sum(done.tokens)}}}
    return _respond(out, done, texts)
