"""The README's quick starts, word for word, on a fresh broker (issue #29).

Each test starts its own broker with `embedstream dev kafka start` and runs the README's commands as
processes, in the README's order and in the reverse order (services before their clients, as a user
waits for "started" before asking). Only ports and folders differ from the README: every process of a
test run needs its own. The first quick start is also the one that never answered before: an online
worker and the gateway on a broker where nobody had created the online chunk topic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kafka import KafkaProducer
import ports
from process_rig import Service, command_env, http_status, leftovers, run, wait_until

from cdc_events import envelope, key, raw, row

pytestmark = pytest.mark.kafka

BASE = ports.port(ports.QUICK_STARTS)
BROKER, GATEWAY, METRICS = BASE, BASE + 20, BASE + 10
ORDERS = ("readme", "reverse")

DOCS = {
    "files.txt": "To read a file line by line, open it with open() and iterate over the file object; "
                 "each iteration yields one line including its newline.",
    "sorting.txt": "list.sort() sorts a list in place; sorted() returns a new sorted list. Both take a key "
                   "function, such as operator.itemgetter(1) to sort tuples by their second item.",
    "threads.txt": "A daemon thread does not keep the interpreter alive: when only daemon threads are left, "
                   "Python exits without waiting for them.",
}


@pytest.fixture
def fresh(tmp_path):
    """A fresh broker from `embedstream dev kafka start`, stopped afterwards; yields the commands' environment."""
    env = command_env(tmp_path, f"127.0.0.1:{BROKER}")
    run(["dev", "kafka", "start", "--port", str(BROKER), "--data-dir", str(tmp_path / "kafka")], env)
    try:
        yield env, tmp_path
    finally:
        run(["dev", "kafka", "stop", "--port", str(BROKER), "--data-dir", str(tmp_path / "kafka")], env, check=False)
    assert leftovers(env["EMBEDSTREAM_TEST_MARK"]) == [], "a quick start left processes running"


def _docs(tmp: Path) -> Path:
    folder = tmp / "docs"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    return folder


def _ready(port: int) -> bool:
    return http_status(f"http://127.0.0.1:{port}/readyz")[0] == 200


def _worker(env, tmp, lanes: str, port: int = METRICS) -> Service:
    return Service(["worker", "embed", "--lanes", lanes, "--metrics-port", str(port)], env, tmp / f"worker-{lanes}.log")


def _search(env, text: str, *flags: str) -> dict:
    """`embedstream search TEXT --json` (the table's columns are cut to the terminal), {} when it failed."""
    done = run(["search", text, "--json", "--top-n", "3", "--timeout", "20", *flags], env, check=False)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def _search_hits(env, text: str) -> list[str]:
    """doc_ids of the hits of `embedstream search TEXT --no-rerank`, best first."""
    return [hit["doc_id"] for hit in _search(env, text, "--no-rerank").get("hits", [])]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("order", ORDERS)
def test_the_http_gateway_quick_start(fresh, order):
    env, tmp = fresh
    worker = _worker(env, tmp, "online")
    gateway = Service(["gateway", "--port", str(GATEWAY)], env, tmp / "gateway.log")
    first, second = (worker, gateway) if order == "readme" else (gateway, worker)
    with first, second:
        wait_until(lambda: _ready(METRICS) and http_status(f"http://127.0.0.1:{GATEWAY}/health")[0] == 200, 240,
                   "the worker and the gateway", (worker, gateway))
        status, body = http_status(f"http://127.0.0.1:{GATEWAY}/embed", json.dumps({"inputs": "how do I read a file?"}).encode())
        assert status == 200, body
        assert len(json.loads(body)[0]) == 384
        status, body = http_status(f"http://127.0.0.1:{GATEWAY}/v1/embeddings", json.dumps(
            {"model": "all-MiniLM-L6-v2", "input": ["how do I read a file?", "sorting a list"]}).encode())
        assert status == 200 and len(json.loads(body)["data"]) == 2, body
        run(["produce", str(_docs(tmp)), "--lane", "online"], env)  # /search: the embed worker answers, no reranker

        def searched() -> list[str]:
            status, body = http_status(f"http://127.0.0.1:{GATEWAY}/search",
                                       json.dumps({"query": "sort tuples by the second item", "top_n": 2}).encode())
            return [hit["doc_id"] for hit in json.loads(body)["hits"]] if status == 200 else []

        wait_until(lambda: bool(searched()), 120, "the gateway's /search", (worker, gateway))
        assert searched()[0] == "sorting.txt"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("order", ORDERS)
def test_the_pipeline_quick_start(fresh, order):
    env, tmp = fresh
    docs = _docs(tmp)
    worker = _worker(env, tmp, "online,bulk")

    def produce():
        assert "published 3 chunks" in run(["produce", str(docs), "--lane", "bulk"], env).stdout

    if order == "reverse":
        produce()  # the chunks wait on the topic for a worker
    with worker:
        wait_until(lambda: _ready(METRICS), 240, "the worker", (worker,))
        if order == "readme":
            produce()
        reply = json.loads(run(["query", "how do I read a file?"], env).stdout)
        assert reply["error"] is None and reply["dims"] == 384
        wait_until(lambda: "files.txt" in _search_hits(env, "how do I read a file?"), 120,
                   "the bulk chunks indexed and searchable", (worker,))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("order", ORDERS)
def test_search_without_a_reranker_needs_only_an_embed_worker(fresh, order):
    """`embedstream search --no-rerank` with an embed worker and a collection, no rerank worker (issue #29);
    and a search that asks for a rerank while no reranker runs is answered in vector order."""
    env, tmp = fresh
    docs = _docs(tmp)
    worker = _worker(env, tmp, "online")
    if order == "reverse":
        run(["produce", str(docs), "--lane", "online"], env)
    with worker:
        wait_until(lambda: _ready(METRICS), 240, "the worker", (worker,))
        if order == "readme":
            run(["produce", str(docs), "--lane", "online"], env)
        wait_until(lambda: bool(_search_hits(env, "sort tuples by the second item")), 120, "hits", (worker,))
        assert _search_hits(env, "sort tuples by the second item")[0] == "sorting.txt"
        asked = _search(env, "why does the interpreter exit with daemon threads?")  # rerank asked, none runs
        assert asked["hits"][0]["doc_id"] == "threads.txt" and asked["model"] is None, asked
        assert asked["hits"][0]["rerank_score"] is None


@pytest.mark.timeout(600)
@pytest.mark.parametrize("order", ORDERS)
def test_the_cdc_quick_start(fresh, order):
    """`worker cdc --topic shop.public.articles ...` with an embed worker: Debezium's change events become hits.
    The source topic is Debezium's: the bridge waits for it (it creates only the project's own topics)."""
    env, tmp = fresh
    bridge = Service(["worker", "cdc", "--topic", "shop.public.articles", "--id-field", "id", "--text-fields",
                      "title,body", "--metadata-fields", "lang", "--metrics-port", str(METRICS + 1)], env, tmp / "cdc.log")
    worker = _worker(env, tmp, "online,bulk")
    first, second = (bridge, worker) if order == "readme" else (worker, bridge)
    with first, second:
        wait_until(lambda: _ready(METRICS), 240, "the embed worker", (worker, bridge))
        producer = KafkaProducer(bootstrap_servers=[f"127.0.0.1:{BROKER}"], acks="all")
        producer.send("shop.public.articles", key=raw(key(7)),
                      value=raw(envelope("c", after=row(7, "Reading files", DOCS["files.txt"]))))
        producer.close()
        wait_until(lambda: "7" in _search_hits(env, "read a file"), 180, "the change event indexed", (worker, bridge))
