"""The gateway's own contract without Kafka: the OpenAPI document is valid 3.1, names every served route and
only those, is generated from the request models, and is served at both paths."""

from __future__ import annotations

import numpy as np
import pytest
from jsonschema import Draft202012Validator
from starlette.routing import Route
from starlette.testclient import TestClient

from embedstream.config import Settings
from embedstream.gateway import GatewayOptions, bodies, create_app
from embedstream.gateway.openapi import openapi_document
from embedstream.gateway.operations import OPERATIONS
from embedstream.schemas import QueryReply


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(Settings(), GatewayOptions()))


def test_document_is_openapi_3_1_with_valid_json_schemas():
    doc = openapi_document()
    assert doc["openapi"] == "3.1.0" and doc["info"]["version"]
    for name, schema in doc["components"]["schemas"].items():
        Draft202012Validator.check_schema(schema)  # JSON Schema 2020-12, OpenAPI 3.1's dialect
    refs = set()

    def collect(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.add(node["$ref"].rsplit("/", 1)[-1])
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(doc)
    assert refs <= set(doc["components"]["schemas"]), refs - set(doc["components"]["schemas"])
    ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    assert len(ids) == len(set(ids)) == len(OPERATIONS)


def test_every_served_route_is_documented_and_every_documented_route_served(client):
    served = {(method, route.path) for route in client.app.routes if isinstance(route, Route)
              for method in route.methods if method != "HEAD"}
    documented = {(method.upper(), path) for path, ops in openapi_document()["paths"].items() for method in ops}
    assert served == documented
    assert {("POST", "/embed_all"), ("POST", "/similarity"), ("GET", "/ping"), ("GET", "/"),
            ("GET", "/api-doc/openapi.json"), ("GET", "/openapi.json")} <= documented


def test_request_schemas_are_the_validating_models():
    """No hand-kept copy: the document's request body schema is the model's own JSON schema."""
    doc = openapi_document()
    embed = doc["paths"]["/embed"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert embed == {"$ref": "#/components/schemas/TeiEmbed"}
    own = bodies.TeiEmbed.model_json_schema(ref_template="#/components/schemas/{model}")
    assert doc["components"]["schemas"]["TeiEmbed"] == own
    assert set(own["properties"]) == set(bodies.TeiEmbed.model_fields)
    validator = Draft202012Validator({**own, "components": doc["components"]})
    for inputs in ("hello", [101, 7592, 102], ["a", [101, 102]]):  # TEI's Input: texts or token ids
        assert validator.is_valid({"inputs": inputs})
        bodies.TeiEmbed.model_validate({"inputs": inputs})


def test_document_is_served_at_ours_and_teis_path(client):
    for path in ("/openapi.json", "/api-doc/openapi.json"):
        r = client.get(path)
        assert r.status_code == 200 and r.json() == openapi_document()


def test_token_states_too_large_for_a_reply_record_are_refused_with_the_reason():
    """/embed_all: a reply is one record (1 MiB); states that do not fit get reply_too_large, never a lost reply."""
    from embedstream.workers.embed_worker import _with_token_states

    reply = QueryReply(request_id="r", embedding=[0.5] * 384, dims=384, tokens=512)
    refused = _with_token_states(reply, np.ones((512, 768), dtype=np.float32))  # 1.5 MB of floats
    assert refused is not None and refused.code == "reply_too_large" and "512 tokens x 768" in refused.message
    assert reply.token_embeddings is None
    states = np.random.default_rng(1).standard_normal((7, 384)).astype(np.float32)
    assert _with_token_states(reply, states) is None
    assert np.array_equal(reply.token_state_array(), states)  # exact float32 round trip
