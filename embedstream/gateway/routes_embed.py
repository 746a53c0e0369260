"""Embedding routes in the three shapes clients speak: OpenAI, TEI and Cohere v2."""

from __future__ import annotations

import uuid

import numpy as np
from starlette.requests import Request

from embedstream.gateway import formats
from embedstream.gateway.bodies import (
    CohereEmbed,
    OpenAIEmbeddings,
    SimilarityParameters,
    TeiEmbed,
    TeiEmbedAll,
    TeiEmbedSparse,
    TeiSimilarity,
    read_json,
    validate,
)
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
    texts = gateway.texts_of(body.input, "input")
    done = await gateway.embed(EmbedAsk(texts, dimensions=body.dimensions), deadline)
    encode = formats.float_base64 if body.encoding_format == "base64" else (lambda v: v)
    tokens = sum(done.tokens)
    out = {"object": "list", "model": model,
           "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(done.vectors)],
           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return _respond(out, done, texts)


def _tei_texts(gateway: Gateway, body: TeiEmbed | TeiEmbedSparse | TeiEmbedAll) -> list[str]:
    """A TEI body's inputs as texts (token ids decoded), its prompt checked."""
    _check_prompt(gateway, body.prompt_name)
    return gateway.texts_of(body.inputs, "inputs")


def _check_prompt(gateway: Gateway, name: str | None) -> None:
    if name not in (None, "query", "document"):
        raise ApiError(422, "unknown_prompt", f"prompt_name {name!r} is not a prompt of "
                       f"{gateway.spec.name!r} (query, document)", param="prompt_name")


async def _tei_embedded(gateway: Gateway, request: Request, model: type[TeiEmbed | TeiEmbedSparse | TeiEmbedAll],
                        **extra) -> tuple[list[str], Embedded]:
    """A TEI embed-family body read and embedded as it asks (plus ``extra``: what the route adds)."""
    deadline = gateway.deadline(request.headers)
    body = validate(model, await read_json(request, gateway.options.max_body_bytes))
    texts = _tei_texts(gateway, body)
    ask = EmbedAsk(texts, getattr(body, "dimensions", None), body.prompt_name, body.truncate,  # type: ignore[arg-type]
                   getattr(body, "normalize", None), truncation_direction=body.truncation_direction.lower(), **extra)
    return texts, await gateway.embed(ask, deadline, what="inputs")


async def tei_embed(gateway: Gateway, request: Request) -> VectorResponse:
    """TEI ``/embed``: ``[[f32]]``; ``prompt_name`` picks the model's query or document prompt."""
    texts, done = await _tei_embedded(gateway, request, TeiEmbed)
    return _respond(done.vectors, done, texts)


async def tei_embed_sparse(gateway: Gateway, request: Request) -> VectorResponse:
    """TEI ``/embed_sparse``: ``[[{"index": i, "value": w}]]``, the embed workers' sparse vectors
    (``EMBEDSTREAM_SPARSE__KIND``; a worker without a sparse encoder refuses with ``sparse_unavailable``)."""
    texts, done = await _tei_embedded(gateway, request, TeiEmbedSparse, sparse=True)
    out = []
    for i, terms in enumerate(done.sparse):
        if terms is None:
            raise ApiError(424, "sparse_failed", f"inputs[{i}]: the worker returned no sparse vector", param="inputs")
        out.append([{"index": index, "value": value} for index, value in zip(terms.indices, terms.values)])
    return _respond(out, done, texts)


async def tei_embed_all(gateway: Gateway, request: Request) -> VectorResponse:
    """TEI ``/embed_all``: per input, every token's last hidden state ``[[[f32]]]`` (special and prompt tokens
    included, no pooling), as the embed worker's packed forward pass computed them."""
    texts, done = await _tei_embedded(gateway, request, TeiEmbedAll, token_embeddings=True)
    return _respond(done.token_states, done, texts)


async def tei_similarity(gateway: Gateway, request: Request) -> VectorResponse:
    """TEI ``/similarity``: the cosine similarity of each sentence's (unnormalised) vector with the source's."""
    deadline = gateway.deadline(request.headers)
    body = validate(TeiSimilarity, await read_json(request, gateway.options.max_body_bytes))
    params = body.parameters or SimilarityParameters()
    if not body.inputs.sentences:
        raise ApiError(400, "empty_input", "`inputs.sentences` cannot be empty", param="inputs.sentences")
    _check_prompt(gateway, params.prompt_name)
    texts = [body.inputs.source_sentence, *body.inputs.sentences]
    ask = EmbedAsk(texts, None, params.prompt_name, params.truncate, normalize=False,  # type: ignore[arg-type]
                   truncation_direction=params.truncation_direction.lower())
    done = await gateway.embed(ask, deadline, what="inputs")
    return _respond(cosine_to_first(done.vectors), done, texts)


def cosine_to_first(vectors: np.ndarray) -> list[float]:
    """Cosine similarity of rows 1.. with row 0 (float64 sums; 0 where a vector is all zeros)."""
    v = vectors.astype(np.float64)
    norms = np.linalg.norm(v, axis=1)
    dots = v[1:] @ v[0]
    scale = norms[1:] * norms[0]
    return [float(d / s) if s > 0 else 0.0 for d, s in zip(dots, scale)]


def _cohere_texts(gateway: Gateway, body: CohereEmbed) -> list[str]:
    if body.images or (body.inputs and any(c.type != "text" for i in body.inputs for c in i.content)):
        raise ApiError(422, "images_unsupported", f"{gateway.spec.name!r} embeds text only", param="images")
    if body.texts is not None and body.inputs is not None:
        raise ApiError(422, "invalid_request", "send texts or inputs, not both", param="inputs")
    if body.inputs is not None:
        return ["\n".join(c.text for c in i.content) for i in body.inputs]  # type: ignore[union-attr]
    return body.texts or []


async def cohere_embed(gateway: Gateway, request: Request) -> VectorResponse:
    """Cohere ``/v2/embed``: every asked embedding type from one float vector per text."""
    deadline = gateway.deadline(request.headers)
    body = validate(CohereEmbed, await read_json(request, gateway.options.max_body_bytes))
    gateway.check_model(body.model)
    texts = _cohere_texts(gateway, body)
    prompt = _COHERE_PROMPTS.get(body.input_type or "")
    # Cohere's default is END; a max_tokens at or above the model's limit is the model's limit
    max_tokens = body.max_tokens if body.max_tokens is not None and body.max_tokens < gateway.spec.max_tokens else None
    ask = EmbedAsk(texts, body.output_dimension, prompt, body.truncate != "NONE",  # type: ignore[arg-type]
                   truncation_direction="left" if body.truncate == "START" else "right", max_tokens=max_tokens)
    done = await gateway.embed(ask, deadline, what="texts")
    kinds = list(dict.fromkeys(body.embedding_types or ["float"]))
    out = {"id": uuid.uuid4().hex, "response_type": "embeddings_by_type",
           "embeddings": {kind: formats.encode_as(done.vectors, kind) for kind in kinds}, "texts": texts,
           "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": sum(done.tokens)}}}
    return _respond(out, done, texts)
