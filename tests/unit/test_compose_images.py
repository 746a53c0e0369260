"""The images `embedstream dev images build` makes are the ones docker-compose.yml names (issue #40): one
version per image, decided once (the poms, devimages/images.py), and the compose defaults agree with it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from embedstream.devimages import images

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _default(image: str) -> str:
    """docker-compose.yml's image with every ${VAR:-default} replaced by its default."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", image)


def _qualified(name: str) -> str:
    """Docker's normalisation of an image name (docker.io/library/ for bare names)."""
    first = name.split("/")[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    return name if "." in first or ":" in first or first == "localhost" else f"docker.io/{name}"


def test_every_registry_image_of_the_compose_file_is_built_here_under_its_name():
    built = {i.tag() for i in images.images(images.Options()).values()}
    named = {_qualified(_default(s["image"])) for name, s in COMPOSE["services"].items()
             if "build" not in s and not name.startswith("x-")}
    assert named == {
        "docker.io/apache/kafka:4.2.2", "docker.io/qdrant/qdrant:v1.19.0", "docker.io/prom/prometheus:v3.5.0",
        "docker.io/library/postgres:15", "quay.io/debezium/connect:3.6.1.Final",
    }
    assert named <= built


def test_the_kafka_and_connect_images_run_the_dev_rigs_versions():
    from embedstream.devcdc.connect import versions
    from embedstream.devkafka.jars import kafka_version

    assert images.kafka_version() == kafka_version() == versions()[0]
    assert f"connect:{versions()[1]}" in _default(COMPOSE["services"]["connect"]["image"])


def test_prometheus_module_version_follows_the_proxys_numbering():
    assert images.prometheus_module_version("v3.5.0") == "v0.305.0"
    assert images.prometheus_module_version("v2.53.4") == "v0.253.4"


def test_the_wheelhouse_holds_every_pin_the_dockerfile_installs():
    reqs = images.project_requirements()
    assert "torch==2.15.0" in reqs and any(r.startswith("setuptools==") for r in reqs)
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-]+==[^=\s]+", r) for r in reqs), reqs
    assert images.wheelhouse_tag().startswith(images.WHEELHOUSE_REPO + ":")


def test_the_rerank_worker_is_not_started_by_default():
    """It cannot work without a cross-encoder the user supplies: profile rerank."""
    assert COMPOSE["services"]["rerank"]["profiles"] == ["rerank"]
    defaults = {n for n, s in COMPOSE["services"].items() if not s.get("profiles")}
    assert defaults == {"kafka", "kafka-topics", "qdrant", "embed-online", "embed-bulk", "prometheus", "gateway"}


def test_the_kafka_entrypoint_maps_the_environment_as_the_upstream_image(tmp_path):
    """KAFKA_<NAME> -> <name> with "_" -> ".", "__" -> "_", "___" -> "-" (the entrypoint's own loop, run by bash)."""
    script = (ROOT / "compose/images/kafka/bin/entrypoint.sh").read_text()
    loop = script[script.index("  while IFS= read -r line; do"):script.index('} > "$config"')]
    env = {"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "A:B", "KAFKA_LOG_DIRS": "/d", "KAFKA_FOO__BAR": "1",
           "KAFKA_A___B": "2"}
    props = "\n".join(f"{k}={v}" for k, v in env.items())
    out = subprocess.run(["bash", "-c", f'props="$1"\n{loop}', "_", props], capture_output=True, text=True, check=True)
    assert sorted(out.stdout.split()) == sorted(["listener.security.protocol.map=A:B", "log.dirs=/d", "foo_bar=1",
                                                 "a-b=2"])
