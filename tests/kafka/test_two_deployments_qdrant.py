"""Two deployments on a real Qdrant server (issue #41), as docs/search-routing.md runs them: `worker embed` processes
writing `docs_scalar` (MiniLM) and `docs_u8` (another model) into one server, searched with `embedstream search`.
Every search is answered from its collection, its query embedded once, by its owner's model; a third deployment
claiming `docs_u8` with names of its own (as another Helm release would) stops before loading its model, naming both.

Before: each search's query embedding went to both deployments' online groups and the first reply won: with two
models, the other deployment's instant `unknown_model` (4 searches of 4 in a run by hand on this server); with one,
every query embedded twice.

The server is Qdrant's own binary (tests/qdrant_rig.py: the one the qdrant image is built from) on loopback ports of
this run (tests/ports.py), its storage in the test's folder."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import ports
import pytest
from conftest import isolated_settings
from process_rig import Service, command_env, http_status, run, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(900)]

DOCS = {"sorting.txt": "list.sort() sorts in place; sorted() returns a new list; both take a key function.",
        "threads.txt": "A daemon thread does not keep the interpreter alive when the program exits.",
        "files.txt": "To read a file line by line, iterate over the file object returned by open()."}


@pytest.fixture
def qdrant_server(tmp_path):
    from parts import require
    from qdrant_rig import BINARY, QdrantServer

    require("qdrant", BINARY.is_file(), f"no Qdrant server binary at {BINARY}")
    server = QdrantServer(tmp_path)
    try:
        yield server.url
    finally:
        server.stop()


def _deployment_env(base: dict, settings, name: str, collection: str, **extra: str) -> dict[str, str]:
    k = settings.kafka
    env = dict(base, EMBEDSTREAM_QDRANT__COLLECTION=collection, EMBEDSTREAM_KAFKA__TOPIC_CHUNKS_ONLINE=f"{k.topic_chunks_online}.{name}",
               EMBEDSTREAM_KAFKA__GROUP_ONLINE=f"{k.group_online}-{name}", EMBEDSTREAM_KAFKA__GROUP_BULK=f"{k.group_bulk}-{name}",
               **extra)
    return env


def _shared_env(tmp: Path, bootstrap: str, url: str, settings) -> dict[str, str]:
    """The broker's shared names (queries, replies, search prefix, claims) of this test, one Qdrant server."""
    k = settings.kafka
    env = command_env(tmp, bootstrap, EMBEDSTREAM_QDRANT__URL=url)
    for field in ("topic_queries", "topic_replies", "topic_search", "topic_rerank", "topic_dead_letters",
                  "topic_documents", "topic_claims", "group_search", "group_rerank"):
        env[f"EMBEDSTREAM_KAFKA__{field.upper()}"] = getattr(k, field)
    return env


def _queries_embedded(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        found = re.search(r'^embedstream_texts_total\{kind="query",lane="online"\} (\S+)$', resp.read().decode(), re.M)
    return float(found.group(1)) if found else 0.0


def test_two_deployments_on_one_qdrant_server_answer_each_search_once_from_its_collection(
        kafka_bootstrap, qdrant_server, tmp_path):
    settings = isolated_settings(kafka_bootstrap, "qsrv")
    shared = _shared_env(tmp_path, kafka_bootstrap, qdrant_server, settings)
    metrics = {"scalar": ports.port(ports.TWO_DEPLOYMENTS), "u8": ports.port(ports.TWO_DEPLOYMENTS) + 1}
    from tiny_models import build_tiny_bert

    other_model = build_tiny_bert(tmp_path / "tiny-bert", pooling="mean")  # docs_u8 is written with another model
    deployments = {
        "scalar": _deployment_env(shared, settings, "scalar", "docs_scalar", EMBEDSTREAM_QDRANT__QUANTIZATION="scalar"),
        "u8": _deployment_env(shared, settings, "u8", "docs_u8", EMBEDSTREAM_QDRANT__VECTOR_DATATYPE="uint8",
                              EMBEDSTREAM_DEFAULT_MODEL=str(other_model)),
    }
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    workers = [Service(["worker", "embed", "--lanes", "online", "--metrics-port", str(metrics[name])], env,
                       tmp_path / f"worker-{name}.log") for name, env in deployments.items()]
    with workers[0], workers[1]:
        for port in metrics.values():
            wait_until(lambda port=port: http_status(f"http://127.0.0.1:{port}/readyz")[0] == 200, 400,
                       f"the worker on {port}", tuple(workers))
        for env in deployments.values():
            run(["produce", str(folder), "--lane", "online"], env)

        def search(collection: str) -> dict | None:
            out = run(["search", "how do I sort a list?", "--collection", collection, "--no-rerank", "--json",
                       "--timeout", "30"], shared, check=False)
            return json.loads(out.stdout) if out.returncode in (0, 1) and out.stdout.startswith("{") else \
                {"exit": out.returncode, "stderr": out.stderr[-1500:]}

        wait_until(lambda: all((search(c) or {}).get("hits") for c in ("docs_scalar", "docs_u8")), 300,
                   "both collections searchable", tuple(workers))
        before = {name: _queries_embedded(port) for name, port in metrics.items()}
        replies = {c: [search(c) for _ in range(3)] for c in ("docs_scalar", "docs_u8")}
        after = {name: _queries_embedded(port) for name, port in metrics.items()}
        for collection, answers in replies.items():
            for reply in answers:
                assert reply.get("error") is None and reply.get("collection") == collection, reply
                assert reply["hits"] and {hit["doc_id"] for hit in reply["hits"]} <= set(DOCS), reply
        assert all(reply["hits"][0]["doc_id"] == "sorting.txt" for reply in replies["docs_scalar"])  # MiniLM's
        # each search embedded once, by the deployment writing its collection
        assert {name: after[name] - before[name] for name in metrics} == {"scalar": 3, "u8": 3}, (before, after)

        # another release: every name its own but the claims topic, the same server and collection: refused
        other = isolated_settings(kafka_bootstrap, "qsrv2")
        other_env = command_env(tmp_path, kafka_bootstrap, EMBEDSTREAM_QDRANT__URL=qdrant_server,
                                EMBEDSTREAM_QDRANT__COLLECTION="docs_u8",
                                EMBEDSTREAM_KAFKA__TOPIC_CLAIMS=settings.kafka.topic_claims,
                                **{f"EMBEDSTREAM_KAFKA__{f.upper()}": getattr(other.kafka, f)
                                   for f in ("topic_queries", "topic_search", "group_search", "group_online")})
        refused = run(["worker", "embed", "--lanes", "online", "--metrics-port", "0"], other_env, timeout_s=300,
                      check=False)
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert "collection_claimed" in refused.stderr and f"'docs_u8' of {qdrant_server}" in refused.stderr
        assert deployments["u8"]["EMBEDSTREAM_KAFKA__GROUP_ONLINE"] in refused.stderr, refused.stderr[-3000:]
