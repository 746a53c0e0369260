"""TEI's surface besides ``/embed`` and ``/rerank``: the root route, ``/invocations``, ``/tokenize``, ``/decode``.

A TEI server answers ``POST /`` (and SageMaker's ``/invocations``) by the type of the model it serves;
``huggingface_hub.InferenceClient(model=URL).feature_extraction`` and LangChain's
``HuggingFaceEndpointEmbeddings`` post there. This gateway serves an embedding model and, optionally,
a reranker: a body with ``inputs`` is an embed request, one with ``query`` and ``texts`` a rerank
request (424 without a reranker, as ``/rerank``). ``/predict`` is a classifier's route in TEI: no
classifier is served here, so it answers TEI's 424 with the reason. ``/tokenize`` and ``/decode`` use
the served model's own tokenizer (no worker round trip).
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from embedstream.gateway import routes_embed, routes_rank
from embedstream.gateway.bodies import TeiDecode, TeiTokenize, read_json, validate
from embedstream.gateway.errors import ApiError
from embedstream.gateway.service import Gateway


class _Replay(Request):
    """The request with its body already read (the dispatcher looked at it), for the route it picked."""

    def __init__(self, request: Request, body: bytes):
        super().__init__(request.scope, request.receive)
        self._body_bytes = body

    async def stream(self):
        yield self._body_bytes


async def root(gateway: Gateway, request: Request, dialect_box: list[str]) -> Response:
    """``POST /`` and ``/invocations``: an embed body (``inputs``) or a rerank body (``query``, ``texts``)."""
    body = await read_json(request, gateway.options.max_body_bytes)  # within the byte limit, as every route
    replay = _Replay(request, json.dumps(body).encode())
    if isinstance(body, dict) and "query" in body and "texts" in body:
        return await routes_rank.rerank(gateway, replay, dialect_box)
    if isinstance(body, dict) and "inputs" in body:
        return await routes_embed.tei_embed(gateway, replay)
    raise ApiError(422, "invalid_request", "the body is neither an embed request ({\"inputs\": ...}) nor a rerank "
                   "request ({\"query\": ..., \"texts\": [...]})", param="inputs")


async def predict(gateway: Gateway, request: Request) -> Response:
    raise ApiError(424, "predict_unavailable", f"/predict serves classification models; this gateway serves the "
                   f"embedding model {gateway.spec.name!r}" + (f" and the reranker {gateway.rerank_spec.name!r} "
                   "(POST /rerank)" if gateway.rerank_spec is not None else ""))


def _prompt(gateway: Gateway, name: str | None) -> str:
    if name is None:
        return ""
    if name not in ("query", "document"):
        raise ApiError(422, "unknown_prompt", f"prompt_name {name!r} is not a prompt of {gateway.spec.name!r} "
                       "(query, document)", param="prompt_name")
    return (gateway.spec.query_prompt if name == "query" else gateway.spec.document_prompt) or ""


async def tokenize(gateway: Gateway, request: Request) -> JSONResponse:
    """TEI ``/tokenize``: per input, ``[{id, text, special, start, stop}]`` (character offsets into the input)."""
    body = validate(TeiTokenize, await read_json(request, gateway.options.max_body_bytes))
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts or not all(texts):
        raise ApiError(400, "empty_input", "`inputs` cannot be empty", param="inputs")
    if len(texts) > gateway.options.max_inputs:
        raise ApiError(413, "too_many_inputs", f"inputs has {len(texts)} items, over the limit of "
                       f"{gateway.options.max_inputs} per request", param="inputs")
    prompt = _prompt(gateway, body.prompt_name)
    tokenizer = gateway.tokenizer()
    out = []
    for text in texts:
        full = prompt + text
        encoding = tokenizer.encode(full, add_special_tokens=body.add_special_tokens)
        tokens = []
        for token_id, (start, stop), special in zip(encoding.ids, encoding.offsets, encoding.special_tokens_mask):
            tokens.append({"id": token_id, "text": tokenizer.id_to_token(token_id) if special else full[start:stop],
                           "special": bool(special), "start": None if special else start,
                           "stop": None if special else stop})
        out.append(tokens)
    return JSONResponse(out)


async def decode(gateway: Gateway, request: Request) -> JSONResponse:
    """TEI ``/decode``: token ids (one list or a list of lists) back to text, one string per list."""
    body = validate(TeiDecode, await read_json(request, gateway.options.max_body_bytes))
    ids = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]  # type: ignore[list-item]
    if not all(ids):
        raise ApiError(400, "empty_input", "`ids` cannot be empty", param="ids")
    if len(ids) > gateway.options.max_inputs:
        raise ApiError(413, "too_many_inputs", f"ids has {len(ids)} lists, over the limit of "
                       f"{gateway.options.max_inputs} per request", param="ids")
    tokenizer = gateway.tokenizer()
    vocab = tokenizer.get_vocab_size()
    for i, row in enumerate(ids):
        if min(row) < 0 or max(row) >= vocab:
            raise ApiError(422, "invalid_token_id", f"ids[{i}] has a token id outside 0..{vocab - 1}", param="ids")
    return JSONResponse(tokenizer.decode_batch(ids, skip_special_tokens=body.skip_special_tokens))
