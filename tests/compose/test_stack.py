"""docker compose up as users run it, end to end on real containers (issue #40): the Kafka, Qdrant,
Prometheus and embedstream images of `embedstream dev images build`, the stack of docker-compose.yml started
with `docker compose up -d --build --wait`, driven from the host through its published ports only.

The tests share one stack and run in file order: what each leaves (points, offsets, replicas) is what the
next one finds.
"""

from __future__ import annotations

import time

import pytest

import stack as st
from compose_fixtures import compose_stack  # noqa: F401 - the session's stack (a fixture)

pytestmark = [pytest.mark.usefixtures("compose_stack"), pytest.mark.timeout(1800)]

BULK_GROUP = "embedstream-embed-bulk"
BULK_TOPIC = "embedstream.chunks.bulk"


def test_every_service_is_healthy_and_none_restarts():
    """After `up --wait`: every service of the default profile runs healthy (the one-shot topic creator has
    exited 0), and none restarts over the next 30 s (rerank is not among them: profile rerank)."""
    ps = st.compose("ps", "-a", "--format", "json").stdout
    import json

    rows = [json.loads(line) for line in ps.splitlines() if line.strip().startswith("{")] if not ps.lstrip().startswith("[") \
        else json.loads(ps)
    services = {r["Service"]: r for r in rows}
    assert set(services) == {"kafka", "kafka-topics", "qdrant", "embed-online", "embed-bulk", "prometheus", "gateway"}
    assert services["kafka-topics"]["State"] == "exited" and services["kafka-topics"]["ExitCode"] == 0
    restarts = {name: st.inspect(r["ID"])["RestartCount"] for name, r in services.items()}
    for name, row in services.items():
        if name != "kafka-topics":
            assert row["State"] == "running", row
            assert st.inspect(row["ID"])["State"]["Health"]["Status"] == "healthy", name
    time.sleep(30)
    assert {name: st.inspect(r["ID"])["RestartCount"] for name, r in services.items()} == restarts


def test_every_chunk_produced_from_the_host_lands_in_qdrant():
    """Documents published from the host on localhost:29092 (bulk lane): every chunk is a point in the Qdrant
    container, read through its REST API on localhost:6333, and no other point of those documents."""
    docs = st.stdlib_docs("host", 0, 40)
    started = time.monotonic()
    counts = st.publish(docs, lane="bulk")
    want = st.expected_ids(counts)
    ids = [d["doc_id"] for d in docs]
    st.wait_until(lambda: st.qdrant_count(ids) >= len(want), 600, f"{len(want)} chunks in Qdrant")
    st.TIMINGS["40 documents produced -> all in Qdrant"] = time.monotonic() - started
    assert set(st.qdrant_ids(ids)) == want


def test_a_query_by_request_reply():
    """A query sent from the host comes back on its reply topic with the model's 384-d unit vector."""
    from embedstream.producers.query_client import QueryClient

    started = time.monotonic()
    with QueryClient(st.settings().kafka) as client:
        reply = client.embed("how do I read a file line by line?", timeout_s=60)
    st.TIMINGS["first query answered (request-reply)"] = time.monotonic() - started
    assert reply.error is None, reply.error
    assert reply.dims == 384 and len(reply.embedding) == 384
    assert abs(sum(v * v for v in reply.embedding) - 1.0) < 1e-3


def test_the_gateway_from_the_host():
    """/v1/embeddings, /embed and /search on localhost:8080, answered by the online worker."""
    status, reply = st.http("POST", f"{st.GATEWAY}/v1/embeddings",
                            {"model": "all-MiniLM-L6-v2", "input": ["how do I read a file?", "sorting a list"]}, 120)
    assert status == 200, reply
    assert [len(d["embedding"]) for d in reply["data"]] == [384, 384]
    status, reply = st.http("POST", f"{st.GATEWAY}/embed", {"inputs": "how do I read a file?"}, 120)
    assert status == 200, reply
    assert len(reply) == 1 and len(reply[0]) == 384
    docs = [{"doc_id": "gateway-sorting", "text": "list.sort() sorts a list in place; sorted() returns a new "
                                                   "sorted list. Both take a key function, such as "
                                                   "operator.itemgetter(1) to sort tuples by their second item."}]
    want = st.expected_ids(st.publish(docs, lane="online"))
    st.wait_until(lambda: st.qdrant_count(["gateway-sorting"]) == len(want), 300, "the online document in Qdrant")
    status, reply = st.http("POST", f"{st.GATEWAY}/search", {"query": "sort tuples by the second item", "top_n": 3},
                            120)
    assert status == 200, reply
    hits = reply.get("hits") or reply.get("results") or reply
    assert any("gateway-sorting" in str(hit) for hit in hits), reply


def test_a_crashed_bulk_worker_is_restarted_and_nothing_is_lost_or_doubled():
    """The bulk worker's process dies of SIGKILL while a backlog drains (as the kernel's OOM killer or a crash
    would end it: a signal to its process, from outside the engine): the restart policy brings the container
    back, and every chunk of the backlog ends up in Qdrant exactly once (the exact point ids, no other).

    Not `docker compose kill`: a kill through the engine's API is a manual stop, which Docker and podman
    alike exempt from the restart policy (the container stays exited)."""
    import os
    import signal

    docs = st.stdlib_docs("kill", 100, 600)
    ids = [d["doc_id"] for d in docs]
    (container,) = st.container_ids("embed-bulk")
    restarts = st.inspect(container)["RestartCount"]
    want = st.expected_ids(st.publish(docs, lane="bulk"))
    st.wait_until(lambda: st.qdrant_count(ids) > 0, 300, "the backlog starting to land")
    at_kill = st.qdrant_count(ids)
    assert at_kill < len(want), f"the backlog ({len(want)} chunks) drained before the kill: make it larger"
    pid = st.inspect(container)["State"]["Pid"]
    assert pid > 1
    os.kill(pid, signal.SIGKILL)
    st.wait_until(lambda: st.inspect(container)["RestartCount"] > restarts
                  and st.inspect(container)["State"]["Running"], 180, "embed-bulk restarted by its restart policy")
    st.wait_until(lambda: st.qdrant_count(ids) >= len(want), 1200, f"all {len(want)} backlog chunks in Qdrant",
                  every_s=3)
    stored = st.qdrant_ids(ids)
    assert len(stored) == len(set(stored)) == len(want) and set(stored) == want


def test_three_bulk_replicas_share_the_partitions_and_prometheus_scrapes_each():
    """`--scale embed-bulk=3`: the bulk group has three members, each with its own partitions and all six
    covered; Prometheus (DNS discovery) scrapes all three, every target up."""
    st.timed("scale embed-bulk=3 --wait", st.compose, "up", "-d", "--scale", "embed-bulk=3", "--wait",
             "--wait-timeout", "900", timeout=1200)
    try:
        def spread():
            members = st.group_assignment(BULK_GROUP)
            parts = [p for m in members for p in m if p[0] == BULK_TOPIC]
            ok = len(members) == 3 and all(m for m in members) and len(parts) == len(set(parts)) == 6
            return members if ok else False

        st.wait_until(spread, 300, "three bulk members sharing the six partitions", every_s=3)

        def scraped():
            status, reply = st.http("GET", f"{st.PROMETHEUS}/api/v1/targets?state=active")
            if status != 200:
                return False
            bulk = [t for t in reply["data"]["activeTargets"] if t["labels"].get("job") == "embed-bulk"]
            return bulk if len(bulk) == 3 and all(t["health"] == "up" for t in bulk) else False

        targets = st.wait_until(scraped, 240, "Prometheus scraping three embed-bulk targets, all up", every_s=5)
        assert len({t["scrapeUrl"] for t in targets}) == 3
    finally:
        st.compose("up", "-d", "--scale", "embed-bulk=1", "--wait", "--wait-timeout", "600", timeout=900)


def test_down_then_up_keeps_the_index_and_the_committed_offsets():
    """`docker compose down` (volumes kept) then `up --wait`: the same points and the same committed bulk
    offsets; a document published afterwards is indexed, and nothing before it is embedded again."""
    points = st.qdrant_count()
    offsets = st.committed_offsets(BULK_GROUP, BULK_TOPIC)
    assert points > 0 and sum(offsets.values()) > 0
    st.timed("down", st.compose, "down", "-t", "30")
    st.timed("up --wait after down", st.compose, "up", "-d", "--wait", "--wait-timeout", "900", timeout=1200)
    assert st.qdrant_count() == points
    assert st.committed_offsets(BULK_GROUP, BULK_TOPIC) == offsets
    docs = st.stdlib_docs("after-up", 900, 3)
    want = st.expected_ids(st.publish(docs, lane="bulk"))
    st.wait_until(lambda: st.qdrant_count([d["doc_id"] for d in docs]) == len(want), 600, "the new document indexed")
    assert st.qdrant_count() == points + len(want)


def test_cdc_profile_an_insert_into_postgres_becomes_searchable():
    """The cdc profile (PostgreSQL 15, Debezium Connect, the registration, the bridge): a row INSERTed into
    the compose PostgreSQL is found by a search through the gateway."""
    busy = [p for p in st.CDC_PORTS if st.port_busy(p)]
    assert not busy, f"host ports {busy} are taken: the cdc profile publishes them"
    st.timed("--profile cdc up --wait", st.compose, "up", "-d", "--wait", "--wait-timeout", "900",
             profiles=("cdc",), timeout=1200)
    text = "Zebras crossing the Okavango delta migrate with the summer floods every year."
    st.compose("exec", "-T", "postgres", "psql", "-v", "ON_ERROR_STOP=1", "-U", "postgres", "embedstream", "-c",
               f"INSERT INTO articles VALUES (4242, 'Zebra migration', '{text}', 'new')")

    def found():
        status, reply = st.http("POST", f"{st.GATEWAY}/search", {"query": "zebra migration in the Okavango delta",
                                                                  "top_n": 3}, 60)
        return reply if status == 200 and "4242" in str(reply) else False

    st.wait_until(found, 600, "the inserted row found by /search", every_s=3)
