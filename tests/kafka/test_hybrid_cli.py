"""The README's hybrid commands as processes on a fresh broker: an embed worker writing BM25 beside the
dense vectors, `embedstream search --mode hybrid` answered by the worker's search lane (the query's
sparse vector from the same pass as its dense one), and a hybrid search of a dense-only collection
refused with the reason while dense searches of it go on."""

from __future__ import annotations

import json

import pytest
import ports
from process_rig import Service, command_env, http_status, leftovers, run, wait_until

pytestmark = pytest.mark.kafka

BASE = ports.port(ports.HYBRID_CLI)
BROKER, METRICS = BASE, BASE + 10

DOCS = {
    "sorting.txt": "list.sort() sorts a list in place; sorted() returns a new sorted list. Both take a key "
                   "function, such as operator.itemgetter(1) to sort tuples by their second item.",
    "threads.txt": "A daemon thread does not keep the interpreter alive: when only daemon threads are left, "
                   "Python exits without waiting for them.",
    "paths.txt": "os.path.join joins one or more path components; pathlib.PurePath.joinpath does the same for "
                 "path objects.",
}


def _search(env, text: str, *flags: str) -> dict:
    done = run(["search", text, "--json", "--no-rerank", "--top-n", "3", "--timeout", "20", *flags], env, check=False)
    return json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}


@pytest.mark.timeout(600)
def test_hybrid_search_from_the_command_line(tmp_path):
    env = command_env(tmp_path, f"127.0.0.1:{BROKER}", EMBEDSTREAM_SPARSE__KIND="bm25")
    run(["dev", "kafka", "start", "--port", str(BROKER), "--data-dir", str(tmp_path / "kafka")], env)
    try:
        folder = tmp_path / "docs"
        folder.mkdir()
        for name, text in DOCS.items():
            (folder / name).write_text(text)
        worker = Service(["worker", "embed", "--lanes", "online", "--metrics-port", str(METRICS)], env,
                         tmp_path / "worker.log")
        with worker:
            wait_until(lambda: http_status(f"http://127.0.0.1:{METRICS}/readyz")[0] == 200, 240, "the worker", (worker,))
            run(["produce", str(folder), "--lane", "online"], env)
            wait_until(lambda: bool(_search(env, "operator.itemgetter", "--mode", "hybrid").get("hits")), 120,
                       "hybrid hits", (worker,))
            reply = _search(env, "operator.itemgetter", "--mode", "hybrid")  # the README's command: the default fusion
            assert reply["hits"][0]["doc_id"] == "sorting.txt", reply
            assert {"embed", "sparse", "search"} <= set(reply["timings_ms"])
        # a collection written without sparse vectors: hybrid refused with the reason, dense served
        dense_env = dict(env, EMBEDSTREAM_SPARSE__KIND="none", EMBEDSTREAM_QDRANT__COLLECTION="plain",
                         EMBEDSTREAM_KAFKA__GROUP_ONLINE="plain-online")
        worker = Service(["worker", "embed", "--lanes", "online", "--metrics-port", str(METRICS)], dense_env,
                         tmp_path / "worker-plain.log")
        with worker:
            wait_until(lambda: http_status(f"http://127.0.0.1:{METRICS}/readyz")[0] == 200, 240, "the worker", (worker,))
            run(["produce", str(folder), "--lane", "online"], dense_env)
            wait_until(lambda: bool(_search(dense_env, "daemon threads").get("hits")), 120, "dense hits", (worker,))
            refused = _search(dense_env, "operator.itemgetter", "--mode", "hybrid")
            assert refused["error"]["code"] == "no_sparse_vector", refused
            assert _search(dense_env, "daemon threads")["hits"][0]["doc_id"] == "threads.txt"
    finally:
        run(["dev", "kafka", "stop", "--port", str(BROKER), "--data-dir", str(tmp_path / "kafka")], env, check=False)
    assert leftovers(env["EMBEDSTREAM_TEST_MARK"]) == [], "a command left processes running"
