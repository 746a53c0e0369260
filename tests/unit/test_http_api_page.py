"""The HTTP API page is rendered from an OpenAPI document: every route, body, answer and schema field is on it,
and every link it makes points at a section of the page."""

from __future__ import annotations

import re

import pytest
from pydantic.json_schema import models_json_schema

from embedstream.docsite.http_api import render_openapi
from embedstream.gateway.bodies import SearchBody, TeiEmbed

REF = "#/components/schemas/{model}"


def _document() -> dict:
    """An OpenAPI 3.1 document over two of the gateway's real request bodies, as pydantic writes their schemas."""
    _, defs = models_json_schema([(TeiEmbed, "validation"), (SearchBody, "validation")], ref_template=REF)
    error = {"description": "Overloaded", "headers": {"Retry-After": {"description": "Seconds to wait",
                                                                        "schema": {"type": "string"}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "embedstream gateway", "version": "0.1.0", "description": "The HTTP front door."},
        "tags": [{"name": "Text Embeddings Inference", "description": "TEI's routes"}],
        "paths": {
            "/embed": {"post": {"summary": "Embeddings of texts", "tags": ["Text Embeddings Inference"],
                                "requestBody": {"required": True, "content": {"application/json": {
                                    "schema": {"$ref": REF.format(model="TeiEmbed")}}}},
                                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {
                                    "type": "array", "items": {"type": "array", "items": {"type": "number"}}}}}},
                                    "429": error}}},
            "/search": {"post": {"summary": "Embed, search, rerank",
                                 "requestBody": {"content": {"application/json": {
                                     "schema": {"$ref": REF.format(model="SearchBody")}}}},
                                 "responses": {"200": {"description": "OK"}}}},
            "/health": {"get": {"summary": "Ready", "parameters": [{"name": "x-request-timeout", "in": "header",
                                                                     "schema": {"type": "number", "minimum": 0}}],
                                "responses": {"200": {"description": "OK"}}}},
        },
        "components": {"schemas": defs["$defs"]},
    }


def _links_resolve(page: str) -> None:
    anchors = set(re.findall(r"\{#([a-z0-9-]+)\}", page))
    targets = set(re.findall(r"\]\(#([^)]+)\)", page))
    assert targets and targets <= anchors, sorted(targets - anchors)


def test_every_route_body_answer_and_field_is_on_the_page():
    page = render_openapi(_document())
    for route in ("`POST /embed`", "`POST /search`", "`GET /health`"):
        assert route in page
    assert "Request body (required, `application/json`): [TeiEmbed](#schema-teiembed)" in page
    assert "array of array of number" in page and "`Retry-After` (Seconds to wait)" in page
    assert "| `x-request-timeout` | header | number (≥ 0) | no |" in page
    for model in (TeiEmbed, SearchBody):
        section = page.split(f"### {model.__name__} ")[1].split("\n### ")[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in section, (model.__name__, name)
    _links_resolve(page)


def test_the_gateways_own_document_renders():
    openapi = pytest.importorskip("embedstream.gateway.openapi", reason="the gateway's OpenAPI document is not here")
    doc = openapi.openapi_document()
    page = render_openapi(doc)
    for path, item in doc["paths"].items():
        for method in item:
            assert f"`{method.upper()} {path}`" in page
    for name in doc["components"]["schemas"]:
        assert f"### {name} " in page
    _links_resolve(page)
