"""The gateway's own contract: an OpenAPI 3.1 document of every route, built from the route table.

``openapi_document()`` reads ``operations.OPERATIONS`` and the pydantic models named there (request
bodies in validation mode: what the routes accept; answers in serialisation mode), so nothing here is
a hand-kept copy of a schema. The gateway serves it at ``/openapi.json`` and at TEI's
``/api-doc/openapi.json``; the docs site renders its API page from this function.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from pydantic import BaseModel, TypeAdapter

from embedstream.gateway.operations import COHERE, EMBEDSTREAM, OPENAI, OPERATIONS, TEI, Operation, error_model

_REF = "#/components/schemas/{model}"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("embedstream")
    except PackageNotFoundError:
        return "unknown"


VERSION = _version()

STATUS_TEXT = {
    200: "OK",
    400: "Malformed JSON, or an empty input (TEI's error_type Empty)",
    403: "The collection is not on the gateway's allow-list",
    404: "No such collection",
    413: "Too many inputs, or a text or the body over its byte limit",
    422: "A body that does not validate, an over-long input with truncation off, a token id outside the "
         "vocabulary, an option the model cannot serve",
    424: "The model or its worker failed, or the feature is not served (no reranker, no classifier, no sparse "
         "encoder)",
    429: "Overloaded (requests in flight or the lane's backlog): retry after Retry-After seconds",
    503: "The gateway has no working Kafka client",
    504: "No reply before the deadline (x-request-timeout, or the gateway's default)",
}

_TAGS = {
    TEI: "Hugging Face Text Embeddings Inference 1.9's routes: bodies, answers, errors (error_type as TEI writes it)",
    OPENAI: "OpenAI's embeddings route (errors in OpenAI's envelope; an invalid request is 400)",
    COHERE: "Cohere's v2 embed and rerank (and Jina's rerank body)",
    EMBEDSTREAM: "embedstream's own routes",
}


class _Schemas:
    """components.schemas, filled as the operations name their models (one name, one schema)."""

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}

    def _add(self, name: str, schema: dict) -> None:
        if self.defs.get(name, schema) != schema:
            raise ValueError(f"two different schemas are both named {name!r}: rename one of the models")
        self.defs[name] = schema

    def of(self, kind: Any, mode: str) -> dict:
        """A schema for ``kind``: a $ref for a model, inline for lists, unions and plain types."""
        schema = TypeAdapter(kind).json_schema(ref_template=_REF, mode=mode)  # type: ignore[arg-type]
        for name, definition in schema.pop("$defs", {}).items():
            self._add(name, definition)
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            self._add(kind.__name__, schema)
            return {"$ref": _REF.format(model=kind.__name__)}
        return schema


def _operation(op: Operation, schemas: _Schemas) -> dict:
    out: dict[str, Any] = {"operationId": op.operation_id, "summary": op.summary, "tags": [op.tag]}
    if op.body is not None:
        out["requestBody"] = {"required": True,
                              "content": {"application/json": {"schema": schemas.of(op.body, "validation")}}}
    responses: dict[str, Any] = {}
    if op.reply is not None:
        responses["200"] = {"description": STATUS_TEXT[200],
                            "content": {op.media_type: {"schema": schemas.of(op.reply, "serialization")}}}
    error = schemas.of(error_model(op), "serialization")
    for status in op.errors:
        response: dict[str, Any] = {"description": STATUS_TEXT[status], "content": {"application/json": {"schema": error}}}
        if status == 429:
            response["headers"] = {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "string"}}}
        responses[str(status)] = response
    out["responses"] = responses
    return out


@functools.lru_cache(maxsize=1)
def _document() -> dict:
    schemas = _Schemas()
    paths: dict[str, dict] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _operation(op, schemas)
    return {
        "openapi": "3.1.0",
        "info": {"title": "embedstream gateway", "version": VERSION,
                 "description": "The HTTP front door of embedstream: TEI 1.9's, OpenAI's and Cohere's routes over "
                                "the online Kafka lanes. Errors carry a stable `code` besides each dialect's fields.",
                 "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"}},
        "tags": [{"name": name, "description": text} for name, text in _TAGS.items()],
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.defs.items()))},
    }


def openapi_document() -> dict:
    """The gateway's OpenAPI 3.1 document (a fresh copy: callers may change it)."""
    return copy.deepcopy(_document())
