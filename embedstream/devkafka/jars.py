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
    return pom_property(pom or pom_path(), "kafka.version")


def pom_property(pom: Path, name: str) -> str:
    """``<properties><name>`` of a pom (a pinned version)."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(pom).getroot().find(f"m:properties/m:{name}", ns)
    if node is None or not (node.text or "").strip():
        raise DevKafkaError(f"{pom} has no <properties><{name}>")
    return node.text.strip()


def _default_home(version: str) -> Path:
    """Per-version jar cache, so bumping the pom never mixes jars of two versions."""
    return CACHE_ROOT / "kafka" / version


def _run_mvn(pom: Path, version: str, out_dir: Path, mvn_args: list[str]) -> None:
    """Copy the pom's runtime jars from Maven Central into out_dir (``version``: for messages)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DevKafkaError("mvn not found on PATH; install Maven 3.8+ (e.g. apt-get install maven)")
    cmd = [
        mvn, "-q", "-B", "-Dstyle.color=never",
        "-f", str(pom),
        *mvn_args,
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={out_dir}",
    ]
    try:
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=MVN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        raise DevKafkaError(f"mvn timed out after {MVN_TIMEOUT_S} s resolving {version}") from exc
    if proc.returncode != 0:
        raise DevKafkaError(
            f"mvn failed (exit {proc.returncode}) resolving {version}:\n"
            + tail_text(proc.stdout + proc.stderr)
        )


def ensure_jars(home: Path | str | None = None, *, version: str | None = None) -> Path:
    """Return ``<home>/libs`` holding the broker jars, resolving them with mvn only the first time.

    ``home`` defaults to ``~/.cache/embedstream/kafka/<version>``.
    """
    pom = pom_path()
    version = version or kafka_version(pom)
    home = Path(home) if home is not None else _default_home(version)
    return cached_jars(pom, home, f"Kafka {version}", f"kafka_2.13-{version}.jar", [f"-Dkafka.version={version}"])


def cached_jars(pom: Path, home: Path, what: str, probe_jar: str, mvn_args: list[str] | None = None) -> Path:
    """Return ``<home>/libs`` holding the pom's runtime jars, resolving them with mvn only the first time.

    Jars are copied into a scratch dir and renamed into place only when complete (``probe_jar`` among
    them), so an interrupted download is never mistaken for a usable cache.
    """
    libs = home / "libs"
    marker = libs / ".complete"
    if marker.is_file():
        return libs
    with file_lock(home / ".lock"):
        if marker.is_file():  # another process finished while we waited
            return libs
        scratch = home / f"libs.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        _run_mvn(pom, what, scratch, mvn_args or [])
        if not (scratch / probe_jar).is_file():
            raise DevKafkaError(f"mvn succeeded but {probe_jar} is missing from {scratch}")
        (scratch / ".complete").write_text(what + "\n")
        shutil.rmtree(libs, ignore_errors=True)  # leftover of an older, incomplete layout
        scratch.rename(libs)
    return libs
