"""The HTTP gateway against real workers on the local broker, spoken to by real clients.

openai SDK (default base64 and explicit float), cohere SDK (v2 embed with every embedding type, v2
rerank), httpx for the TEI shapes and /search; refusals next to good requests; overload by lag.
"""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import numpy as np
import pytest
from conftest import isolated_settings, make_engine, memory_store, wait_for
from gateway_rig import MODEL, background_gateway, gateway_stack
from gateway_rig import cos as _cos
from gateway_rig import engine_vectors as _engine_vectors
from worker_rig import RunningWorker

from embedstream.corpus import stdlib_paragraphs
from embedstream.config import ModelConfig
from embedstream.engine.engine import EmbedRequest, ScoreRequest
from embedstream.engine.postprocess import quantize
from embedstream.gateway import GatewayOptions
from embedstream.producers.topics import ensure_topics

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def ce_engine(tiny_ce_dir):
    return make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank")


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, minilm_engine, ce_engine, tiny_ce_dir, tiny_bert_dir):
    """Gateway + online embed worker (MiniLM) + rerank worker (tiny cross-encoder, search over a tiny-bert index)."""
    with gateway_stack(kafka_bootstrap, minilm_engine, ce_engine, tiny_ce_dir, tiny_bert_dir, "gw") as gateway:
        yield gateway


TEXTS = ["how do I read a file line by line?", "sorting a list of tuples by the second item",
         "the quick brown fox jumps over the lazy dog", "regular expressions: non-greedy matching"]


def test_openai_sdk_default_base64_and_float_match_the_engine(stack, minilm_engine):
    from openai import OpenAI

    client = OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=30)
    expected, tokens = _engine_vectors(minilm_engine, TEXTS)
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=TEXTS)  # the SDK asks for base64
    assert json.loads(raw.http_request.content)["encoding_format"] == "base64"
    for name in ("x-queue-time", "x-tokenization-time", "x-inference-time", "x-total-time", "x-compute-tokens"):
        assert float(raw.headers[name]) >= 0, name
    default = raw.parse()
    explicit = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    for response in (default, explicit):
        got = np.array([d.embedding for d in sorted(response.data, key=lambda d: d.index)])
        assert got.shape == (len(TEXTS), 384)
        assert _cos(got, expected).min() >= 0.9999
        assert response.usage.prompt_tokens == sum(tokens) and response.model == MODEL
    single = client.embeddings.create(model=MODEL, input=TEXTS[0])
    assert _cos(single.data[0].embedding, expected[0]) >= 0.9999
    ids = minilm_engine.tokenizer.tokenizer.encode(TEXTS[1], add_special_tokens=False).ids
    by_ids = client.embeddings.create(model=MODEL, input=[ids], encoding_format="float")  # the model's token ids, as vLLM
    assert _cos(by_ids.data[0].embedding, expected[1]) >= 0.9999


def test_openai_dimensions_on_a_matryoshka_model(kafka_bootstrap, minilm_engine):
    """A model registered with matryoshka_dims: the listed size is served (cut and renormalised), others refused."""
    from openai import BadRequestError, OpenAI

    settings = isolated_settings(kafka_bootstrap, "gwmrl")
    folder = str(minilm_engine.spec.path)
    settings.models["minilm-mrl"] = ModelConfig(path=folder, matryoshka_dims=[128])
    ensure_topics(settings.kafka, partitions=1)
    engine = make_engine(minilm_engine.spec.path, name="minilm-mrl", matryoshka_dims=[128])
    results, _ = engine.embed([EmbedRequest(i, t, dimensions=128) for i, t in enumerate(TEXTS)])
    expected = np.stack([r.vector.values for r in results])
    with RunningWorker(settings, engine, memory_store(), lanes=("online",)), \
            background_gateway(settings, GatewayOptions(model="minilm-mrl")) as gateway:
        client = OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=30)
        response = client.embeddings.create(model="minilm-mrl", input=TEXTS, dimensions=128)
        got = np.array([d.embedding for d in response.data])
        assert got.shape == (len(TEXTS), 128) and _cos(got, expected).min() >= 0.9999
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        with pytest.raises(BadRequestError, match="not a trained Matryoshka size"):  # OpenAI's 400, never 422
            client.embeddings.create(model="minilm-mrl", input=TEXTS[0], dimensions=100)


def test_tei_embed_and_rerank_shapes_over_httpx(stack, minilm_engine, ce_engine):
    expected, _ = _engine_vectors(minilm_engine, TEXTS, prompt="query")
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.post("/embed", json={"inputs": TEXTS, "prompt_name": "query"})
        assert r.status_code == 200, r.text
        assert _cos(r.json(), expected).min() >= 0.9999 and float(r.headers["x-queue-time"]) >= 0
        r = http.post("/embed", json={"inputs": TEXTS[2]})
        assert len(r.json()) == 1 and _cos(r.json()[0], expected[2]) >= 0.9999

        docs = [" ".join(p.split()[:30]) for p in stdlib_paragraphs()[900:906]]
        scores, _ = ce_engine.score([ScoreRequest(i, "read a file", d) for i, d in enumerate(docs)])
        ref = np.array([s.score for s in scores])
        r = http.post("/rerank", json={"query": "read a file", "texts": docs, "return_text": True})
        assert r.status_code == 200, r.text
        ranked = r.json()
        assert [x["index"] for x in ranked] == list(np.argsort(-ref, kind="stable"))
        np.testing.assert_allclose([x["score"] for x in ranked], np.sort(ref)[::-1], atol=1e-4)
        assert ranked[0]["text"] == docs[ranked[0]["index"]] and float(r.headers["x-inference-time"]) >= 0
        r = http.post("/v1/rerank", json={"query": "read a file", "documents": [{"text": d} for d in docs], "top_n": 2,
                                          "return_documents": True, "model": "tiny-ce"})
        body = r.json()
        assert r.status_code == 200 and [x["index"] for x in body["results"]] == [x["index"] for x in ranked[:2]]
        assert body["results"][0]["document"]["text"] == docs[ranked[0]["index"]]


def test_cohere_sdk_embed_every_type_and_rerank(stack, minilm_engine, ce_engine):
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key="unused", base_url=stack.url, timeout=30)
    expected, _ = _engine_vectors(minilm_engine, TEXTS, prompt="document")
    response = client.embed(model=MODEL, texts=TEXTS, input_type="search_document",
                            embedding_types=["float", "int8", "uint8", "binary", "ubinary"])
    e = response.embeddings
    floats = np.array(e.float_, dtype=np.float32)
    assert _cos(floats, expected).min() >= 0.9999 and response.texts == TEXTS
    for i, v in enumerate(floats):  # each form is the engine's quantizer applied to the float vector, bit for bit
        q8, qb = quantize(v, "int8").values, quantize(v, "binary").values
        assert e.int8[i] == q8.tolist() and e.uint8[i] == (q8.astype(int) + 128).tolist()
        assert e.ubinary[i] == qb.tolist() and e.binary[i] == (qb.astype(int) - 128).tolist()
        assert len(e.binary[i]) == 384 // 8
    docs = [" ".join(p.split()[:30]) for p in stdlib_paragraphs()[910:915]]
    scores, _ = ce_engine.score([ScoreRequest(i, "sort a list", d) for i, d in enumerate(docs)])
    ref = np.array([s.score for s in scores])
    ranked = client.rerank(model="tiny-ce", query="sort a list", documents=docs, top_n=3)
    assert [r.index for r in ranked.results] == list(np.argsort(-ref, kind="stable")[:3])
    np.testing.assert_allclose([r.relevance_score for r in ranked.results], np.sort(ref)[::-1][:3], atol=1e-4)


def test_search_returns_hits_payloads_and_stage_times(stack):
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.post("/search", json={"query": "files and streams", "top_k": 10, "top_n": 3, "filters": {"half": 1}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["hits"]) == 3 and [h["rank"] for h in body["hits"]] == [1, 2, 3]
        assert all(h["payload"]["half"] == 1 and h["text"] and h["rerank_score"] is not None for h in body["hits"])
        for name in ("x-embed-time", "x-search-time", "x-rerank-time", "x-worker-time", "x-total-time"):
            assert float(r.headers[name]) >= 0, name
        r = http.post("/search", json={"query": "files", "collection": "docs_v9"})  # allowed, does not exist
        assert r.status_code == 404 and r.json()["code"] == "unknown_collection"
        r = http.post("/search", json={"query": "files", "collection": "nope"})  # not on the gateway's allow-list
        assert r.status_code == 403 and r.json()["code"] == "collection_not_allowed"


BAD = [
    ("/v1/embeddings", {"input": []}, 400),
    ("/v1/embeddings", {"input": ["x"] * 10_000}, 413),
    ("/v1/embeddings", {"input": ["fine", {"text": "no"}]}, 400),
    ("/embed", {"inputs": " ".join(["word"] * 600), "truncate": False}, 422),  # over 256 tokens: the worker says too_long
    ("/v1/embeddings", {"input": "x", "dimensions": 64}, 400),
    ("/embed", {"inputs": "x", "prompt_name": "poem"}, 422),
    ("/v2/embed", {"texts": ["x"], "embedding_types": ["float"], "truncate": "NONE", "max_tokens": 2}, 422),
]


def test_bad_requests_get_their_status_while_good_ones_around_them_succeed(stack, minilm_engine):
    expected, _ = _engine_vectors(minilm_engine, TEXTS[:1])

    def good(http: httpx.Client) -> float:
        r = http.post("/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "float"})
        assert r.status_code == 200, r.text
        return float(_cos(r.json()["data"][0]["embedding"], expected[0]))

    def bad(http: httpx.Client, path: str, body: dict, status: int) -> None:
        r = http.post(path, json=body)
        assert r.status_code == status, (path, r.text)
        error = r.json().get("error")
        assert error if path != "/v2/embed" else r.json()["message"]

    with httpx.Client(base_url=stack.url, timeout=30) as http, concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(good, http) for _ in range(12)]
        futures += [pool.submit(bad, http, *case) for case in BAD]
        malformed = http.post("/v1/embeddings", content=b'{"input": "x"', headers={"content-type": "application/json"})
        huge = http.post("/v1/embeddings", content=json.dumps({"input": ["word " * 1000] * 4000}).encode(),
                         headers={"content-type": "application/json"})  # 20 MB over a 4 MB limit
        late = http.post("/embed", json={"inputs": TEXTS[0]}, headers={"x-request-timeout": "0.001"})
        futures += [pool.submit(good, http) for _ in range(12)]
        cosines = [f.result(timeout=60) for f in futures if f.result(timeout=60) is not None]
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "malformed_json"
    assert huge.status_code == 413 and huge.json()["error"]["code"] == "body_too_large"
    assert late.status_code == 504 and late.json()["error_type"] == "Backend"
    assert len(cosines) == 24 and min(cosines) >= 0.9999
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        assert http.get("/health").json() == {"status": "ok"}
        metrics = http.get("/metrics").text
    assert 'embedstream_gateway_requests_total{route="openai_embeddings",status="200"}' in metrics
    assert 'route="openai_embeddings",status="413"' in metrics and 'embedstream_gateway_inflight{lane="embed"} 0.0' in metrics


def test_bench_gateway_round_trips_account_for_every_request(stack):
    """The bench's two paths and its soak on the test stack: every request timed or counted, none lost."""
    from embedstream.bench import gateway_bench
    from embedstream.producers.query_client import QueryClient

    with QueryClient(stack.settings.kafka) as client:
        paths = gateway_bench.RoundTrips(stack.url, client)
        try:
            times = gateway_bench.alternating(paths, TEXTS, count=6, concurrency=4, max_s=120)
            soaked = gateway_bench.soak(paths, TEXTS, concurrency=4, seconds=2)
        finally:
            paths.close()
    assert len(times["http"]) == len(times["kafka"]) == 6 and min(times["http"] + times["kafka"]) > 0
    assert soaked["sent"] == soaked["ok"] > 0 and soaked["lost"] == 0


def test_overload_by_lane_lag_is_429_with_retry_after(kafka_bootstrap):
    """No worker consumes this lane: once its backlog passes max_lag, new requests are refused at once."""
    from kafka import KafkaProducer

    settings = isolated_settings(kafka_bootstrap, "gwlag")
    ensure_topics(settings.kafka, partitions=1)
    producer = KafkaProducer(**settings.kafka.client_kwargs())
    for i in range(5):
        producer.send(settings.kafka.topic_queries, key=b"k", value=b"{}")
    producer.flush()
    producer.close()
    options = GatewayOptions(model=MODEL, max_lag=2, lag_interval_s=0.1, retry_after_s=3)
    with background_gateway(settings, options) as gateway, httpx.Client(base_url=gateway.url, timeout=30) as http:
        wait_for(lambda: gateway.server.servers and _lag(http) >= 5, 30, "the gateway to measure the lane's lag")
        start = time.monotonic()
        r = http.post("/v1/embeddings", json={"input": "x"})
        assert r.status_code == 429 and r.headers["retry-after"] == "3"
        assert r.json()["error"]["type"] == "rate_limit_error" and time.monotonic() - start < 5


def _lag(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('embedstream_gateway_lane_lag{lane="embed"}'):
            return float(line.split()[-1])
    return 0.0


def test_tei_truncate_and_normalize_travel_to_the_worker(stack, minilm_engine):
    """TEI's ``truncate`` and ``normalize`` ride on the QueryRequest: the worker cuts an over-long text and
    returns the unnormalised vector, as the engine does for the same flags."""
    long_text = " ".join(["streaming"] * 600)  # over MiniLM's 256 tokens
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        refused = http.post("/embed", json={"inputs": long_text, "truncate": False})
        assert refused.status_code == 422 and refused.json()["error_type"] == "Validation", refused.text
        cut = http.post("/embed", json={"inputs": long_text, "truncate": True})
        assert cut.status_code == 200, cut.text
        raw = http.post("/embed", json={"inputs": TEXTS[0], "normalize": False})
        assert raw.status_code == 200, raw.text
    results, _ = minilm_engine.embed([EmbedRequest(0, long_text, truncate=True, prompt="query"),
                                      EmbedRequest(1, TEXTS[0], normalize=False, prompt="query")])
    assert results[0].truncated and _cos(cut.json()[0], results[0].vector.values) >= 0.9999
    unnormalised = np.asarray(raw.json()[0])
    assert abs(float(np.linalg.norm(unnormalised)) - 1.0) > 1e-3
    np.testing.assert_allclose(unnormalised, np.asarray(results[1].vector.values), rtol=1e-4, atol=1e-5)


def test_tei_clients_on_the_root_route_get_the_engines_vectors(stack, minilm_engine, ce_engine, monkeypatch):
    """Issue #29: huggingface_hub's InferenceClient and LangChain's HuggingFaceEndpointEmbeddings post to TEI's
    root route (404 before); /invocations, /tokenize, /decode and /predict as a TEI server answers them."""
    from huggingface_hub import InferenceClient, constants
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # the tests' offline switch also blocks loopback URLs
    expected, _ = _engine_vectors(minilm_engine, TEXTS)
    client = InferenceClient(model=stack.url, timeout=30)
    got = client.feature_extraction(TEXTS[0])
    assert _cos(np.asarray(got).reshape(-1), expected[0]) >= 0.9999
    many = np.asarray(client.feature_extraction(TEXTS))
    assert many.shape == (len(TEXTS), 384) and _cos(many, expected).min() >= 0.9999
    # langchain-huggingface 1.x refuses a URL as `model` (0.x took it): its client is pointed at the server instead
    langchain = HuggingFaceEndpointEmbeddings(model=MODEL)
    langchain.client = InferenceClient(model=stack.url, timeout=30)
    assert _cos(langchain.embed_documents(TEXTS), expected).min() >= 0.9999
    assert _cos(langchain.embed_query(TEXTS[1]), expected[1]) >= 0.9999

    docs = [" ".join(p.split()[:30]) for p in stdlib_paragraphs()[900:904]]
    scores, _ = ce_engine.score([ScoreRequest(i, "read a file", d) for i, d in enumerate(docs)])
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        r = http.post("/invocations", json={"inputs": TEXTS[2]})
        assert r.status_code == 200 and _cos(r.json()[0], expected[2]) >= 0.9999
        r = http.post("/", json={"query": "read a file", "texts": docs})
        assert r.status_code == 200, r.text
        assert [x["index"] for x in r.json()] == list(np.argsort(-np.array([s.score for s in scores]), kind="stable"))
        r = http.post("/", json={"neither": 1})
        assert r.status_code == 422 and r.json()["error_type"] == "Validation"
        r = http.post("/tokenize", json={"inputs": "read a file"})
        tokens = r.json()[0]
        ids = minilm_engine.tokenizer.tokenizer.encode("read a file").ids
        assert [t["id"] for t in tokens] == ids and tokens[0]["special"] and tokens[1]["text"] == "read"
        assert (tokens[1]["start"], tokens[1]["stop"]) == (0, 4)
        r = http.post("/decode", json={"ids": ids})
        assert r.json() == ["read a file"]
        r = http.post("/predict", json={"inputs": "x"})
        assert r.status_code == 424 and r.json()["error_type"] == "Backend"


def test_langchain_openai_with_its_default_model_and_llamaindex_tei_get_the_engines_vectors(stack, minilm_engine):
    """Issue #35: LangChain's OpenAIEmbeddings as it comes (its own default model name, which this gateway does not
    serve: the served model answers, as TEI does) and LlamaIndex's TEI embedding (TEI's /embed with truncate)."""
    from langchain_openai import OpenAIEmbeddings
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    expected, _ = _engine_vectors(minilm_engine, TEXTS)
    # check_embedding_ctx_length=False: its length check downloads tiktoken's vocabulary (no network here)
    openai_style = OpenAIEmbeddings(base_url=f"{stack.url}/v1", api_key="unused", check_embedding_ctx_length=False,
                                    max_retries=0, timeout=30)
    assert openai_style.model == "text-embedding-ada-002"
    assert _cos(openai_style.embed_documents(TEXTS), expected).min() >= 0.9999
    assert _cos(openai_style.embed_query(TEXTS[1]), expected[1]) >= 0.9999
    tei = TextEmbeddingsInference(model_name=MODEL, base_url=stack.url, timeout=30)
    assert _cos(tei.get_text_embedding_batch(TEXTS), expected).min() >= 0.9999
    assert _cos(tei.get_query_embedding(TEXTS[2]), expected[2]) >= 0.9999
