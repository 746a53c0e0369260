"""Issue #35 on the real gateway and workers: TEI 1.9's contract on TEI's routes, and our own OpenAPI
document fuzzed live with schemathesis (valid and invalid inputs, seeded, bounded), every documented
status reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
from conftest import isolated_settings, make_engine, wait_for
from gateway_rig import MODEL, background_gateway, cos, engine_vectors, gateway_stack
from jsonschema import Draft202012Validator
from starlette.testclient import TestClient

from embedstream.config import EngineSettings, ModelConfig, Settings, SparseSettings
from embedstream.corpus import stdlib_paragraphs
from embedstream.engine.engine import Engine, ScoreRequest
from embedstream.engine.sparse_choice import build_sparse_encoder
from embedstream.gateway import GatewayOptions, create_app
from embedstream.producers.search_routing import search_topic
from embedstream.producers.topics import ensure_topics

pytestmark = pytest.mark.kafka

TEI_ERROR_TYPES = {"Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"}  # TEI 1.9.3's ErrorType
LONG = " ".join(["streaming"] * 600)  # over MiniLM's 256 tokens
HELLO_IDS = [101, 7592, 102]  # [CLS] hello [SEP] in MiniLM's vocabulary
MAX_INPUTS = 32  # TEI's default max_client_batch_size: the fuzzer reaches 413 with ordinary lists


@pytest.fixture(scope="module")
def ce_engine(tiny_ce_dir):
    return make_engine(tiny_ce_dir, name="tiny-ce", kind="rerank")


@pytest.fixture(scope="module")
def sparse_minilm(minilm_engine):
    """MiniLM (the same loaded weights) with a BM25 sparse encoder, so /embed_sparse is served."""
    engine = Engine(minilm_engine.spec, EngineSettings(), runner=minilm_engine.runner)
    engine.sparse = build_sparse_encoder(Settings(sparse=SparseSettings(kind="bm25")), engine.tokenizer,
                                         engine.spec.max_tokens)
    return engine


@pytest.fixture(scope="module")
def stack(kafka_bootstrap, sparse_minilm, ce_engine, tiny_ce_dir, tiny_bert_dir):
    with gateway_stack(kafka_bootstrap, sparse_minilm, ce_engine, tiny_ce_dir, tiny_bert_dir, "gwc",
                       max_inputs=MAX_INPUTS, max_body_bytes=1_000_000) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        yield client


# -- the deviations, one test each ---------------------------------------------------------
def test_1_error_type_is_teis_enum_as_tei_writes_it(http):
    cases = [("/embed", {"inputs": []}, 400, "Empty"), ("/embed", {"inputs": "x", "dimensions": 7}, 422, "Validation"),
             ("/embed", {"inputs": [[10**8]]}, 422, "Tokenizer"), ("/tokenize", {"inputs": ""}, 400, "Empty"),
             ("/embed_all", {"inputs": 5}, 422, "Validation"), ("/rerank", {"query": "q", "texts": []}, 400, "Empty")]
    for path, body, status, kind in cases:
        r = http.post(path, json=body)
        assert (r.status_code, r.json()["error_type"]) == (status, kind), (path, r.text)
    late = http.post("/embed", json={"inputs": "x"}, headers={"x-request-timeout": "0.001"})
    assert late.status_code == 504 and late.json()["error_type"] == "Backend"
    assert {r["error_type"] for r in [http.post("/predict", json={"inputs": "x"}).json()]} <= TEI_ERROR_TYPES


def test_2_info_has_every_key_tei_sends(http, stack):
    info = http.get("/info").json()
    tei_required = {"model_id": str, "model_dtype": str, "served_model_name": str, "model_type": dict,
                    "max_concurrent_requests": int, "max_input_length": int, "max_batch_tokens": int,
                    "max_client_batch_size": int, "auto_truncate": bool, "tokenization_workers": int, "version": str}
    for key, kind in tei_required.items():
        assert isinstance(info.get(key), kind), (key, info.get(key))
    for key in ("model_sha", "max_batch_requests", "sha", "docker_label"):  # nullable, always sent
        assert key in info
    assert info["served_model_name"] == MODEL and info["auto_truncate"] is True
    assert info["max_client_batch_size"] == MAX_INPUTS and info["model_type"] == {"embedding": {"pooling": "mean"}}


def test_3_another_model_name_is_served_by_the_served_model(http, minilm_engine):
    expected, _ = engine_vectors(minilm_engine, ["hello there"])
    for path in ("/v1/embeddings", "/embeddings"):
        r = http.post(path, json={"input": "hello there", "model": "text-embedding-ada-002"})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == MODEL and cos(r.json()["data"][0]["embedding"], expected[0]) >= 0.9999
    r = http.post("/v2/embed", json={"texts": ["hello there"], "model": "embed-english-v3.0"})
    assert r.status_code == 200 and cos(r.json()["embeddings"]["float"][0], expected[0]) >= 0.9999


def test_4_token_ids_are_inputs_on_teis_routes(http, minilm_engine, sparse_minilm):
    expected, _ = engine_vectors(minilm_engine, ["hello", "hello world"])
    world_ids = minilm_engine.tokenizer.tokenizer.encode("hello world").ids
    for path in ("/embed", "/", "/invocations"):
        single = http.post(path, json={"inputs": HELLO_IDS})
        assert single.status_code == 200, (path, single.text)
        assert len(single.json()) == 1 and cos(single.json()[0], expected[0]) >= 0.9999
        batch = http.post(path, json={"inputs": [HELLO_IDS, "hello world", world_ids]})
        assert batch.status_code == 200 and len(batch.json()) == 3
        assert cos(batch.json(), expected[[0, 1, 1]]).min() >= 0.9999
    sparse = http.post("/embed_sparse", json={"inputs": [HELLO_IDS]})
    assert sparse.status_code == 200, sparse.text
    (reference,) = sparse_minilm.sparse.encode_texts(["hello"], query=True)
    assert [t["index"] for t in sparse.json()[0]] == reference.indices.tolist()


def test_5_an_over_long_input_is_cut_by_default_and_refused_422_with_auto_truncate_off(http, stack, minilm_engine):
    expected, _ = engine_vectors(minilm_engine, [LONG], truncate=True)
    for path, body in (("/embed", {"inputs": LONG}), ("/", {"inputs": LONG}), ("/v1/embeddings", {"input": LONG})):
        r = http.post(path, json=body)
        assert r.status_code == 200, (path, r.text)
        got = r.json()[0] if path != "/v1/embeddings" else r.json()["data"][0]["embedding"]
        assert cos(got, expected[0]) >= 0.9999
    assert http.post("/embed", json={"inputs": LONG, "truncate": False}).status_code == 422
    strict = GatewayOptions(model=MODEL, auto_truncate=False)
    with background_gateway(stack.settings, strict) as gateway, httpx.Client(base_url=gateway.url, timeout=60) as other:
        assert other.get("/info").json()["auto_truncate"] is False
        r = other.post("/embed", json={"inputs": LONG})
        assert r.status_code == 422 and r.json()["error_type"] == "Validation" and "256" in r.json()["error"]
        r = other.post("/v1/embeddings", json={"input": LONG})  # OpenAI's status for it
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_long"
        assert other.post("/embed", json={"inputs": LONG, "truncate": True}).status_code == 200


def test_left_truncation_and_cohere_start_and_max_tokens_cut_where_asked(http, minilm_engine):
    """TEI's truncation_direction Left and Cohere's START cut the start, Cohere's max_tokens cuts below the model's
    limit: each vector is the engine's for the text that is left (MiniLM: one token per word here)."""
    text = " ".join(["apple"] * 300 + ["banana"] * 300)
    kept, _ = engine_vectors(minilm_engine, [" ".join(["banana"] * 254), " ".join(["apple"] * 254),
                                             " ".join(["apple"] * 14), " ".join(["banana"] * 14)])
    r = http.post("/embed", json={"inputs": text, "truncate": True, "truncation_direction": "Left"})
    assert r.status_code == 200 and cos(r.json()[0], kept[0]) >= 0.9999, r.text
    r = http.post("/embed", json={"inputs": text, "truncation_direction": "left"})  # auto-truncate, TEI's alias
    assert r.status_code == 200 and cos(r.json()[0], kept[0]) >= 0.9999, r.text
    assert cos(http.post("/embed", json={"inputs": text}).json()[0], kept[1]) >= 0.9999
    for truncate, max_tokens, expected in (("START", None, kept[0]), ("END", None, kept[1]), (None, 16, kept[2]),
                                           ("START", 16, kept[3])):
        body = {"texts": [text], "model": "embed-v4.0", **({"truncate": truncate} if truncate else {}),
                **({"max_tokens": max_tokens} if max_tokens else {})}
        r = http.post("/v2/embed", json=body)
        assert r.status_code == 200 and cos(r.json()["embeddings"]["float"][0], expected) >= 0.9999, (body, r.text)
    r = http.post("/v2/embed", json={"texts": [text], "truncate": "NONE", "max_tokens": 16})
    assert r.status_code == 422 and "max_tokens of 16" in r.json()["message"]


def test_cohere_max_tokens_per_doc_cuts_each_document(http, stack, ce_engine):
    """Cohere's max_tokens_per_doc travels on the RerankRequest to the rerank worker, which cuts each document to
    that many tokens: its reply says every candidate was cut, and the scores are the reranker's for the cut ones."""
    from embedstream.producers.query_client import QueryClient
    from embedstream.schemas.rerank import Candidate, RerankReply, RerankRequest

    docs = [" ".join(p.split()[:60]) for p in stdlib_paragraphs()[900:904]]
    query = "read a file"
    r = http.post("/v2/rerank", json={"query": query, "documents": docs, "max_tokens_per_doc": 8, "model": "rerank-v3.5"})
    assert r.status_code == 200, r.text
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    cut, _ = ce_engine.score([ScoreRequest(i, query, d, max_passage_tokens=8) for i, d in enumerate(docs)])
    np.testing.assert_allclose([got[i] for i in range(len(docs))], [s.score for s in cut], atol=1e-4)
    kafka = stack.settings.kafka
    assert any(sent.max_tokens_per_doc == 8 and [c.text for c in sent.candidates] == docs
               for sent in _records(kafka, kafka.topic_rerank, RerankRequest)), "the gateway did not send the limit"
    with QueryClient(kafka) as client:  # beside the gateway on its reply topic: each takes its own replies
        for limit, truncated in ((8, True), (None, False)):
            ask = RerankRequest(request_id=f"cut-{limit}", query=query, reply_to=client.reply_topic,
                                candidates=[Candidate(id=str(i), text=d) for i, d in enumerate(docs)],
                                top_n=len(docs), max_tokens_per_doc=limit)
            reply = client.request(kafka.topic_rerank, ask, RerankReply, timeout_s=60)
            assert reply.error is None and [x.truncated for x in reply.results] == [truncated] * len(docs)


def _records(kafka, topic: str, model) -> list:
    """Every record of ``topic`` so far, decoded as ``model`` (read without a group, from the beginning)."""
    from kafka import KafkaConsumer, TopicPartition

    from embedstream.schemas.codec import decode

    consumer = KafkaConsumer(**kafka.client_kwargs(), enable_auto_commit=False)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
    consumer.assign(parts)
    consumer.seek_to_beginning()
    ends, out = consumer.end_offsets(parts), []
    while any(consumer.position(tp) < ends[tp] for tp in parts):
        for batch in consumer.poll(timeout_ms=500).values():
            out += [decode(record.value, model) for record in batch]
    consumer.close()
    return out


def test_6_empty_input_is_400_empty(http):
    for path, body in (("/embed", {"inputs": []}), ("/embed", {"inputs": ""}), ("/", {"inputs": []}),
                       ("/embed_all", {"inputs": [""]}), ("/rerank", {"query": "q", "texts": []}),
                       ("/decode", {"ids": []}), ("/decode", {"ids": [[]]}), ("/tokenize", {"inputs": []}),
                       ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}})):
        r = http.post(path, json=body)
        assert r.status_code == 400 and r.json()["error_type"] == "Empty", (path, body, r.text)


def test_7_routes_tei_clients_call(http, minilm_engine):
    from embedstream.gateway.openapi import openapi_document

    for path in ("/ping", "/", "/health"):
        assert http.get(path).status_code == 200, path
    assert http.get("/api-doc/openapi.json").json() == http.get("/openapi.json").json() == openapi_document()
    sentences = ["how do I read a file line by line?", "sorting a list of tuples", "the lazy dog"]
    r = http.post("/similarity", json={"inputs": {"source_sentence": "reading files", "sentences": sentences}})
    assert r.status_code == 200, r.text
    vectors, _ = engine_vectors(minilm_engine, ["reading files", *sentences], normalize=False)
    np.testing.assert_allclose(r.json(), cos(vectors[1:], vectors[0]), atol=1e-5)
    assert np.argmax(r.json()) == 0


def test_embed_all_is_every_tokens_last_hidden_state_without_padding(http, minilm_engine):
    """The packed pass's rows of each input (no padding: each input has exactly its own token count), equal
    to transformers' own forward of that text alone; pooled routes are unchanged beside it."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = [" ".join(p.split()[:n]) for p, n in zip(stdlib_paragraphs()[40:44], (3, 40, 12, 90))]
    r = http.post("/embed_all", json={"inputs": texts})
    assert r.status_code == 200, r.text
    got = r.json()
    folder = str(minilm_engine.spec.path)
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    for text, states in zip(texts, got):
        with torch.no_grad():
            reference = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0].numpy()
        assert np.asarray(states).shape == reference.shape  # [its tokens, 384]: no padding rows
        assert cos(states, reference).min() >= 0.9999
    pooled, _ = engine_vectors(minilm_engine, texts)
    assert cos(http.post("/embed", json={"inputs": texts}).json(), pooled).min() >= 0.9999


# -- our own contract, fuzzed live ---------------------------------------------------------------
FUZZ_EXAMPLES = int(os.environ.get("EMBEDSTREAM_FUZZ_EXAMPLES", "6"))
FUZZ_SEED = 35
_CONFIG = """
[checks.positive_data_acceptance]
expected-statuses = ["2xx", "400", "403", "404", "413", "422", "424"]
[checks.negative_data_rejection]
expected-statuses = ["400", "404", "405", "413", "422", "424"]
"""
_CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
           "response_schema_conformance,negative_data_rejection,positive_data_acceptance,unsupported_method")


def _response_validator(doc: dict, path: str, method: str, status: int, media_type: str) -> Draft202012Validator:
    schema = doc["paths"][path][method]["responses"][str(status)]["content"][media_type]["schema"]
    return Draft202012Validator({**schema, "components": doc["components"]})


def test_schemathesis_fuzz_and_every_documented_status(stack, http, tmp_path, kafka_bootstrap, tiny_bert_dir, capsys):
    """schemathesis against the live gateway and its document: valid and invalid bodies, seeded, bounded per
    operation; no 5xx, every answer conforming. Then what the fuzzer could not provoke (overload, no Kafka,
    a deadline, a worker fault, a huge body) is provoked on purpose, validated against the same document,
    and every documented (operation, status) must have been seen."""
    (tmp_path / "schemathesis.toml").write_text(_CONFIG)
    har = tmp_path / "fuzz.har"
    command = [str(Path(sys.executable).parent / "st"), "--config-file", str(tmp_path / "schemathesis.toml"),
               "--no-color", "run", f"{stack.url}/openapi.json", "--mode", "all", "--max-examples", str(FUZZ_EXAMPLES),
               "--seed", str(FUZZ_SEED), "--phases", "examples,coverage,fuzzing",
               # one worker: two threads of it can ast.parse at once (hypothesis describing a lambda), which on
               # CPython 3.11 fails now and then with "AST constructor recursion depth mismatch"
               "--workers", "1",
               "--checks", _CHECKS, "--request-timeout", "90", "--report", "har", "--report-har-path", str(har),
               "--header", "x-request-timeout: 60",  # a loaded CI host must not turn a valid request into a 504
               "--request-retries", "2",  # a connection the host dropped is tried again, not counted as the API's
               "--suppress-health-check", "all", "--no-shrink"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    at = done.stdout.rfind("SUMMARY")
    summary = done.stdout[done.stdout.rfind("\n", 0, at) + 1:] if at >= 0 else done.stdout[-4000:]
    with capsys.disabled():  # schemathesis' own summary, in the test output even when pytest captures it
        print(f"\n[schemathesis against {stack.url}/openapi.json]\n{summary.strip()}")
    (tmp_path / "schemathesis.out").write_text(done.stdout + done.stderr)
    first = min((done.stdout.find(h) for h in ("ERRORS", "FAILURES") if h in done.stdout), default=-4000)
    assert done.returncode == 0, done.stdout[max(0, first - 100):][:20000] + done.stderr[-3000:]

    from embedstream.gateway.openapi import openapi_document

    doc = openapi_document()
    seen: Counter = Counter()
    for entry in json.loads(har.read_text())["log"]["entries"]:
        path = "/" + entry["request"]["url"].split("/", 3)[3].split("?")[0]
        seen[(entry["request"]["method"].lower(), path, entry["response"]["status"])] += 1

    for (method, path, status), check in _provoked(stack, kafka_bootstrap, tiny_bert_dir):
        seen[(method, path, status)] += 1
        check(doc)
    documented = {(m, p, int(s)) for p, ops in doc["paths"].items() for m, op in ops.items() for s in op["responses"]}
    missing = sorted(documented - set(seen))
    with capsys.disabled():
        print(f"documented (operation, status) pairs: {len(documented)}; reached: {len(documented & set(seen))}; "
              f"requests: {sum(seen.values())}")
    assert not missing, f"documented but never answered: {missing}"


def _provoked(stack, kafka_bootstrap, tiny_bert_dir):
    """(method, path, status) with a check against the document, for every operation: the statuses a fuzzer
    does not reach on a healthy stack."""
    from embedstream.gateway.openapi import openapi_document

    doc = openapi_document()
    posts = [(p, op) for p, ops in doc["paths"].items() for m, op in ops.items() if m == "post"]
    gets = [p for p, ops in doc["paths"].items() if "get" in ops]
    out = []

    def expect(client, method, path, status, **kw):
        r = client.request(method.upper(), path, **kw)
        assert r.status_code == status, (method, path, status, r.status_code, r.text[:300])

        def check(doc, r=r):
            if r.status_code != 200 or "json" in r.headers.get("content-type", ""):
                _response_validator(doc, path, method, status, "application/json").validate(r.json())
        out.append(((method, path, status), check))

    small = {"/embed": {"inputs": "x"}, "/embed_all": {"inputs": "x"}, "/embed_sparse": {"inputs": "x"},
             "/similarity": {"inputs": {"source_sentence": "a", "sentences": ["b"]}},
             "/rerank": {"query": "q", "texts": ["a"]}, "/": {"inputs": "x"}, "/invocations": {"inputs": "x"},
             "/v1/embeddings": {"input": "x"}, "/embeddings": {"input": "x"}, "/v2/embed": {"texts": ["x"]},
             "/v1/rerank": {"query": "q", "documents": ["a"]}, "/v2/rerank": {"query": "q", "documents": ["a"]},
             "/search": {"query": "files"}, "/tokenize": {"inputs": "x"}, "/decode": {"ids": [101]},
             "/predict": {"inputs": "x"}}
    lanes = {p for p, op in posts if "504" in op["responses"]}
    with httpx.Client(base_url=stack.url, timeout=60) as http:
        for path, op in posts:
            codes = op["responses"]
            if "400" in codes:
                expect(http, "post", path, 400, content=b'{"inputs": [', headers={"content-type": "application/json"})
            if "413" in codes:
                expect(http, "post", path, 413, content=b" " * 1_100_000, headers={"content-type": "application/json"})
            if "422" in codes:
                expect(http, "post", path, 422, json=[])
            if path in lanes:
                expect(http, "post", path, 504, json=small[path], headers={"x-request-timeout": "0.001"})
        for path in gets:
            expect(http, "get", path, 200)
        expect(http, "post", "/search", 403, json={"query": "files", "collection": "nope"})
        expect(http, "post", "/search", 404, json={"query": "files", "collection": "docs_v9"})
    # 424: the embed workers serve MiniLM, this gateway says tiny-bert (a deployment fault); no reranker at all
    settings = stack.settings.model_copy(deep=True)
    settings.models["tiny-bert"] = ModelConfig(path=str(tiny_bert_dir))
    with background_gateway(settings, GatewayOptions(model="tiny-bert")) as wrong, \
            httpx.Client(base_url=wrong.url, timeout=60) as http:
        for path, op in posts:
            if "424" in op["responses"] and path != "/search":
                expect(http, "post", path, 424, json=small[path])
        expect(http, "post", "/search", 424, json={"query": "files", "mode": "hybrid"})
    # 429: a lane whose workers are 5 records behind, max_lag 2
    backlog = isolated_settings(kafka_bootstrap, "gwc429")
    searches = search_topic(backlog.kafka, backlog.qdrant.collection)  # the default collection's own lane
    ensure_topics(backlog.kafka, partitions=1)
    ensure_topics(backlog.kafka, topics=[searches], partitions=1)
    from kafka import KafkaProducer

    producer = KafkaProducer(**backlog.kafka.client_kwargs())
    for topic in (backlog.kafka.topic_queries, backlog.kafka.topic_rerank, searches):
        for _ in range(5):
            producer.send(topic, value=b"{}")
    producer.flush()
    producer.close()
    busy = GatewayOptions(model=MODEL, rerank_model="tiny-ce", max_lag=2, lag_interval_s=0.1)
    backlog.models["tiny-ce"] = stack.settings.models["tiny-ce"]
    with background_gateway(backlog, busy) as gateway, httpx.Client(base_url=gateway.url, timeout=60) as http:
        quick = {"x-request-timeout": "0.5"}
        wait_for(lambda: http.post("/embed", json={"inputs": "x"}, headers=quick).status_code == 429
                 and http.post("/rerank", json=small["/rerank"], headers=quick).status_code == 429
                 and http.post("/search", json=small["/search"], headers=quick).status_code == 429, 30, "the lag probe")
        for path in sorted(lanes):
            expect(http, "post", path, 429, json=small[path])
    # 503: no Kafka client (the app without its lifespan)
    client = TestClient(create_app(stack.settings, GatewayOptions(model=MODEL, rerank_model="tiny-ce")))
    for path in sorted(lanes):
        expect(client, "post", path, 503, json=small[path])
    for path in gets:
        if "503" in doc["paths"][path]["get"]["responses"]:
            expect(client, "get", path, 503)
    return out
