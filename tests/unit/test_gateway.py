"""The HTTP gateway without Kafka: shapes, checks and error envelopes answered before any worker is asked."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from starlette.testclient import TestClient

from embedstream.config import Settings
from embedstream.engine.postprocess import quantize
from embedstream.gateway import GatewayOptions, create_app, formats
from embedstream.gateway.errors import ApiError
from embedstream.gateway.overload import Admission
from embedstream.gateway.responses import VectorResponse
from embedstream.schemas.events import ErrorInfo


@pytest.fixture(scope="module")
def client() -> TestClient:
    # No lifespan (not used as a context manager): no Kafka client, so whatever reaches a lane is 503.
    return TestClient(create_app(Settings(), GatewayOptions(max_inputs=2048, max_body_bytes=1_000_000)))


def test_cohere_types_are_the_engine_quantizers_bit_for_bit():
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((4, 384)).astype(np.float32)
    forms = {kind: formats.encode_as(vectors, kind) for kind in ("float", "int8", "uint8", "binary", "ubinary", "base64")}
    for i, v in enumerate(vectors):
        q8, qb = quantize(v, "int8").values, quantize(v, "binary").values
        assert np.array_equal(forms["int8"][i], q8) and np.array_equal(forms["uint8"][i], q8.astype(int) + 128)
        assert np.array_equal(forms["ubinary"][i], qb) and np.array_equal(forms["binary"][i], qb.astype(int) - 128)
        assert forms["binary"][i].min() >= -128 and forms["uint8"][i].max() <= 255
        raw = base64.b64decode(forms["base64"][i])
        assert np.array_equal(np.frombuffer(raw, dtype="<f4"), v)
    # as JSON (orjson, numpy as is): the float32 values read back exactly, the integer forms as integers
    body = json.loads(VectorResponse(forms).body)
    assert np.array_equal(np.asarray(body["float"], dtype=np.float32), vectors)
    assert body["uint8"][0] == forms["uint8"][0].tolist() and body["binary"][1] == forms["binary"][1].tolist()


def test_scores_convert_between_logits_and_probabilities():
    assert formats.relevance(0.0, "identity", raw=False) == pytest.approx(0.5)
    assert formats.relevance(2.0, "identity", raw=True) == 2.0
    assert formats.relevance(formats.relevance(1.5, "identity", raw=False), "sigmoid", raw=True) == pytest.approx(1.5)


def test_admission_refuses_past_inflight_and_lag_bounds():
    class Lag:
        value = 0

        def lag(self, lane):
            return self.value

    lag = Lag()
    admission = Admission(max_inflight=10, max_lag=100, retry_after_s=2, monitor=lag)  # type: ignore[arg-type]
    admission.enter("embed", 8)
    with pytest.raises(ApiError) as refused:
        admission.enter("rerank", 3)  # 11 in flight would pass 10
    assert refused.value.status == 429 and refused.value.headers() == {"retry-after": "2"}
    admission.enter("rerank", 2)
    admission.leave("embed", 8)
    admission.leave("rerank", 2)
    assert admission.inflight == {"embed": 0, "rerank": 0, "search": 0}
    admission.enter("embed", 50)  # one large request alone is let through (max_inputs bounds it)
    admission.leave("embed", 50)
    lag.value = 101
    with pytest.raises(ApiError, match="101 requests behind"):
        admission.enter("embed", 1)
    assert admission.inflight["embed"] == 0


def test_worker_error_codes_choose_the_status():
    too_long = ApiError.from_worker(ErrorInfo(code="too_long", message="m"))  # truncation off: TEI's 422
    assert (too_long.status, too_long.status_for("openai"), too_long.tei_type()) == (422, 400, "Validation")
    assert ApiError.from_worker(ErrorInfo(code="deadline_exceeded", message="m")).status == 504
    assert ApiError.from_worker(ErrorInfo(code="empty_text", message="m")).tei_type() == "Empty"
    # a worker serving another model than the gateway's: a deployment fault, not the client's
    assert ApiError.from_worker(ErrorInfo(code="unknown_model", message="m")).status == 424
    assert ApiError.from_worker(ErrorInfo(code="forward_failed", message="m")).status == 424
    err = ApiError(429, "overloaded", "busy", retry_after_s=2)
    assert err.headers() == {"retry-after": "2"}
    assert err.body("openai") == {"error": {"message": "busy", "type": "rate_limit_error", "param": None, "code": "overloaded"}}
    assert err.body("tei")["error_type"] == "Overloaded" and err.body("cohere")["message"] == "busy"


@pytest.mark.parametrize(("path", "body", "status", "code"), [  # OpenAI answers an invalid request with 400
    ("/v1/embeddings", {"input": [], "model": "all-MiniLM-L6-v2"}, 400, "empty_input"),
    ("/v1/embeddings", {"input": ["x"] * 10_000}, 413, "too_many_inputs"),
    ("/v1/embeddings", {"input": ["ok", 3.5]}, 400, "invalid_request"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 128}, 400, "bad_dimensions"),
    ("/v1/embeddings", {"input": [[1, 2, 10**9]]}, 400, "invalid_token_id"),
    ("/v1/embeddings", {"input": [[101, 102]] * 3000}, 413, "too_many_inputs"),
    ("/v1/embeddings", {"input": "hi", "encoding_format": "int4"}, 400, "invalid_request"),
    ("/embeddings", {"input": "   "}, 400, "empty_text"),
])
def test_openai_refusals_use_openai_envelope(client, path, body, status, code):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert "x-total-time" in response.headers


def test_malformed_json_and_huge_bodies(client):
    response = client.post("/v1/embeddings", content=b'{"input": ["a",', headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "malformed_json"
    big = json.dumps({"input": ["word " * 1000] * 4000}).encode()  # 20 MB, limit 1 MB
    assert len(big) > 19_000_000
    response = client.post("/v1/embeddings", content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


def test_tei_and_cohere_shapes_refuse_in_their_dialects(client):
    r = client.post("/embed", json={"inputs": ["a"], "truncate": True, "truncation_direction": "Left"})
    assert r.status_code == 503 and r.json()["error_type"] == "Unhealthy"  # a short input is not cut: it may go Left
    r = client.post("/embed", json={"inputs": ["a"], "prompt_name": "poem"})
    assert r.status_code == 422 and "prompt_name" in r.json()["error"]
    r = client.post("/v2/embed", json={"texts": ["a"], "embedding_types": ["int4"]})
    assert r.status_code == 422 and "message" in r.json()
    r = client.post("/v2/embed", json={"texts": ["a"], "output_dimension": 64})
    assert r.status_code == 422 and r.json()["code"] == "bad_dimensions"
    r = client.post("/v2/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 424 and r.json()["code"] == "rerank_unavailable"
    r = client.post("/rerank", json={"query": "q", "texts": ["a"]})
    assert r.status_code == 424 and r.json()["error_type"] == "Backend"


def test_a_valid_request_without_kafka_is_503_and_health_says_so(client):
    r = client.post("/v1/embeddings", json={"input": "hello"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "kafka_unavailable"
    assert client.get("/health").status_code == 503


def test_probes_split_liveness_from_readiness(client):
    # Kubernetes restarts a pod whose liveness fails: a gateway that cannot reach Kafka is alive (restarting
    # it would not bring the broker back) but not ready (no traffic until it can answer).
    alive, ready = client.get("/healthz"), client.get("/readyz")
    assert alive.status_code == 200 and alive.json() == {"alive": True}
    assert ready.status_code == 503 and ready.json() == client.get("/health").json()


def test_client_timeouts_become_deadlines(client):
    r = client.post("/embed", json={"inputs": "a"}, headers={"x-request-timeout": "soon"})
    assert r.status_code == 422 and "x-request-timeout" in r.json()["error"]


def test_info_and_metrics(client):
    info = client.get("/info").json()
    assert info["model_id"] == "all-MiniLM-L6-v2" and info["dimensions"] == 384
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] == 2048 and info["version"]
    metrics = client.get("/metrics").text
    assert 'embedstream_gateway_requests_total{route="openai_embeddings",status="400"}' in metrics
