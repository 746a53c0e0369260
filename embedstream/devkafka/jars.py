"""The broker's jars: the official Apache Kafka artifacts on Maven Central, listed in
``compose/kafka-dev/pom.xml`` and fetched once by ``mvn`` into a per-version cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import CACHE_ROOT, file_lock, tail_text


DEFAULT_POM = Path(__file__).resolve().parents[2] / "compose" / "kafka-dev" / "pom.xml"

MVN_TIMEOUT_S = 900


def pom_path() -> Path:
    """The pom listing the broker jars; overridable for installs outside the repo checkout."""
    pom = Path(os.environ.get("EMBEDSTREAM_KAFKA_POM", DEFAULT_POM))
    if not pom.is_file():
        raise DevKafkaError(
            f"Kafka pom not found at {pom}; run from a repo checkout or set EMBEDSTREAM_KAFKA_POM"
        )
    return pom


def kafka_version(pom: Path | None = None) -> str:
    """The Kafka version pinned in the pom, so the pom stays the single source of truth."""
    pom = pom or pom_path()
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(pom).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise DevKafkaError(f"{pom} has no <properties><kafka.version>")
    return node.text.strip()


def _default_home(version: str) -> Path:
    """Per-version jar cache, so bumping the pom never mixes jars of two versions."""
    return CACHE_ROOT / "kafka" / version


def _run_mvn(pom: Path, version: str, out_dir: Path) -> None:
    """Copy the broker's runtime jars from Maven Central into out_dir."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevKafkaError("mvn not found on PATH; install Maven 3.8+ (e.g. apt-get install maven)")
    cmd = [
        mvn, "-q", "-B", "-Dstyle.color=never",
        "-f", str(pom),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out_dir}",
    ]
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MVN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise DevKafkaError(f"mvn timed out after {MVN_TIMEOUT_S} s resolving Kafka {version}") from exc
    if proc.returncode != 0:
        raise DevKafkaError(
            f"mvn failed (exit {proc.returncode}) resolving Kafka {version}:\n"
            + tail_text(proc.stdout + proc.stderr)
        )


def ensure_jars(home: Path | str | None = None, *, version: str | None = None) -> Path:
    """Return ``<home>/libs`` holding the broker jars, resolving them with mvn only the first time.

    ``home`` defaults to ``~/.cache/embedstream/kafka/<version>``. Jars are copied into a
    scratch dir and renamed into place only when complete, so an interrupted download
    is never mistaken for a usable cache.
    """
    pom = pom_path()
    version = version or kafka_version(pom)
    home = Path(home) if home is not None else _default_home(version)
    libs = home / "libs"
    marker = libs / ".complete"
    if marker.is_file():
        return libs
    with file_lock(home / ".lock"):
        if marker.is_file():  # another process finished while we waited
            return libs
        scratch = home / f"libs.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        _run_mvn(pom, version, scratch)
        if not (scratch / f"kafka_2.13-{version}.jar").is_file():
            raise DevKafkaError(f"mvn succeeded but kafka_2.13-{version}.jar is missing from {scratch}")
        (scratch / ".complete").write_text(version + "\n")
        shutil.rmtree(libs, ignore_errors=True)  # leftover of an older, incomplete layout
        scratch.rename(libs)
    return libs
