"""The compose stack of docker-compose.yml as the e2e tests drive it: real containers on the machine's
container engine (a Docker engine, or podman set up by `embedstream dev compose up`), the images built by
`embedstream dev images build`, the host ports the compose file publishes (29092, 6333, 8080, 9090, and
5432 / 8083 for the cdc profile).

The stack runs under its own project name (``embedstream-e2e``), so a user's ``embedstream`` project and
its volumes are never touched; the session ends with ``down -v``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROJECT = "embedstream-e2e"
BOOTSTRAP = "localhost:29092"
QDRANT = "http://localhost:6333"
GATEWAY = "http://localhost:8080"
PROMETHEUS = "http://localhost:9090"
COLLECTION = "docs"
HOST_PORTS = (29092, 6333, 6334, 8080, 9090)
CDC_PORTS = (5432, 8083)
# Every step's seconds, for the report at the end of the session (tests/compose/conftest.py).
TIMINGS: dict[str, float] = {}


def compose_env() -> dict[str, str]:
    from embedstream.devimages import engine, images

    env = {**os.environ, "COMPOSE_PROJECT_NAME": PROJECT, "COMPOSE_PROGRESS": "plain"}
    for line in engine.env_lines():
        key, value = line.removeprefix("export ").split("=", 1)
        env[key] = value
    env.update(images.compose_build_env())
    return env


def compose(*args: str, timeout: float = 900, check: bool = True, profiles: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """``docker compose -f docker-compose.yml [--profile P] ARGS`` in the repository, output captured."""
    cmd = ["docker", "compose", "-f", str(REPO / "docker-compose.yml")]
    for profile in profiles:
        cmd += ["--profile", profile]
    done = subprocess.run([*cmd, *args], cwd=REPO, env=compose_env(), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
    if check and done.returncode != 0:
        raise AssertionError(f"docker compose {' '.join(args)} failed (exit {done.returncode}):\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return done


def timed(name: str, fn, *args, **kwargs):
    started = time.monotonic()
    try:
        return fn(*args, **kwargs)
    finally:
        TIMINGS[name] = time.monotonic() - started


def port_busy(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def http(method: str, url: str, body=None, timeout: float = 30.0):
    """(status, decoded JSON or text) of one request; status 0 when nothing answered."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        raw, status = err.read(), err.code
    except (urllib.error.URLError, OSError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_until(predicate, timeout_s: float, what: str, every_s: float = 1.0):
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        last = predicate()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last: {last!r})")


# -- Qdrant through its REST API --------------------------------------------------------------------

def qdrant_count(doc_ids: list[str] | None = None) -> int:
    body: dict = {"exact": True}
    if doc_ids is not None:
        body["filter"] = {"must": [{"key": "doc_id", "match": {"any": doc_ids}}]}
    status, reply = http("POST", f"{QDRANT}/collections/{COLLECTION}/points/count", body)
    if status == 404:
        return 0
    assert status == 200, (status, reply)
    return reply["result"]["count"]


def qdrant_ids(doc_ids: list[str]) -> list[str]:
    """Every point id stored for these documents (scrolled through the REST API)."""
    found: list[str] = []
    offset = None
    while True:
        body = {"filter": {"must": [{"key": "doc_id", "match": {"any": doc_ids}}]}, "limit": 1000,
                "with_payload": False, "with_vector": False}
        if offset is not None:
            body["offset"] = offset
        status, reply = http("POST", f"{QDRANT}/collections/{COLLECTION}/points/scroll", body)
        assert status == 200, (status, reply)
        found += [str(p["id"]) for p in reply["result"]["points"]]
        offset = reply["result"].get("next_page_offset")
        if offset is None:
            return found


# -- Kafka from the host ----------------------------------------------------------------------------

def settings():
    from embedstream.config import KafkaSettings, Settings

    return Settings(kafka=KafkaSettings(bootstrap_servers=BOOTSTRAP))


def publish(docs: list[dict], lane: str = "bulk") -> dict[str, int]:
    """Publish documents from the host as `embedstream produce` does (its chunker and publisher); returns
    each document's chunk count."""
    from embedstream.engine.model_spec import resolve_model
    from embedstream.producers.chunker import Chunker
    from embedstream.producers.publisher import ChunkPublisher

    s = settings()
    chunker = Chunker.for_model(resolve_model(s.default_model, s.models), 200, 32)
    counts = {}
    with ChunkPublisher(s.kafka, lane=lane, create_topics=False) as pub:
        for doc in docs:
            counts[doc["doc_id"]] = pub.publish_document(doc, chunker)
        pub.flush(60)
    return counts


def expected_ids(counts: dict[str, int]) -> set[str]:
    from embedstream.vectors import point_id

    return {str(point_id(doc_id, i)) for doc_id, n in counts.items() for i in range(n)}


def committed_offsets(group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    partitions = admin.list_topics(topic, timeout=30).topics[topic].partitions
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])
    result = admin.list_consumer_group_offsets([request])[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def group_assignment(group: str) -> list[list[tuple[str, int]]]:
    """Each member's assigned partitions (topic, partition) of a consumer group."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return [[(tp.topic, tp.partition) for tp in (m.assignment.topic_partitions if m.assignment else [])]
            for m in desc.members]


def stdlib_docs(prefix: str, start: int, n: int) -> list[dict]:
    """Real prose (Python's stdlib documentation paragraphs, the demo's corpus) as documents."""
    from embedstream.corpus import stdlib_paragraphs

    paragraphs = stdlib_paragraphs()
    return [{"doc_id": f"{prefix}-{i}", "text": paragraphs[(start + i) % len(paragraphs)]} for i in range(n)]


def container_ids(service: str) -> list[str]:
    out = compose("ps", "-q", service, check=False)
    return out.stdout.split()


def inspect(container: str) -> dict:
    done = subprocess.run(["docker", "inspect", container], capture_output=True, text=True, env=compose_env(),
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)[0]
