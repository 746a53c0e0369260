"""The Java runtime the broker runs on: finding a Java 17+, the JVM flags, and the class-data
sharing archive that halves a warm start."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import Layout, write_text


MIN_JAVA = 17  # Kafka 4.x brokers are compiled for Java 17.

# Modest heap: the dev machine has 2 cores and runs models next to the broker.
# GC flags are the ones Kafka's own kafka-run-class.sh uses.
JVM_OPTS = (
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    # C1 only: about half the start-up time and far less JIT CPU on 2 cores; a dev
    # broker's load is tiny next to the models. Override via EMBEDSTREAM_KAFKA_JVM_OPTS.
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)

# A JVM fatal error (hs_err) aborts with SIGABRT; a bad class-data archive shows up so.
JVM_CRASH_CODES = {134, -signal.SIGABRT, -signal.SIGBUS, -signal.SIGSEGV}


def find_java() -> str:
    """Path of a Java 17+ ``java``: JAVA_HOME first (as Kafka's scripts do), then PATH."""
    return java_info()[0]


@functools.lru_cache(maxsize=1)
def java_info() -> tuple[str, str]:
    """(path, ``java -version`` banner) of the runtime, checked once per process."""
    java_home = os.environ.get("JAVA_HOME")
    candidate = Path(java_home, "bin", "java") if java_home else None
    java = str(candidate) if candidate and candidate.is_file() else shutil.which("java")
    if java is None:
        raise DevKafkaError(
            "java not found: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless) "
            "or set JAVA_HOME"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match:
        major = int(match.group(1))
        if major == 1 and match.group(2):  # "1.8.0_x" style
            major = int(match.group(2))
        if major < MIN_JAVA:
            raise DevKafkaError(f"Kafka 4.x needs Java {MIN_JAVA}+, but {java} is Java {major}")
    return java, (out.stderr + out.stdout).strip()

# --------------------------------------------------------------------------- class-data sharing
#
# Booting the broker is mostly class loading and JIT on a small machine. An AppCDS
# archive (dumped by the first broker when it stops) plus C1-only JIT cuts a warm start
# from ~9 s to ~4 s on 2 busy cores. The archive is keyed by JDK build; the JVM itself
# rejects a stale or mismatched one with a warning and simply starts slower.


def _cds_enabled() -> bool:
    return os.environ.get("EMBEDSTREAM_KAFKA_CDS", "1") not in ("0", "false", "no")


def _cds_archive(libs: Path) -> Path:
    """Shared archive next to the jars, one per (Kafka version, JDK build)."""
    java, banner = java_info()
    tag = hashlib.sha256(f"{os.path.realpath(java)}\n{banner}".encode()).hexdigest()[:12]
    return libs.parent / f"cds-{tag}.jsa"


def cds_jvm_opts(libs: Path, layout: Layout) -> list[str]:
    """Use the archive if present, else have this broker dump one at exit (see finish_cds_dump).

    The dump goes to a unique temp file beside the archive, so publishing it is an
    atomic same-directory rename even when the data dir is on another filesystem.
    """
    if not _cds_enabled():
        return []
    archive = _cds_archive(libs)
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"]
    _remove_stale_dumps(archive.parent)
    dump = archive.with_name(f"{archive.name}.{uuid.uuid4().hex[:8]}.tmp")
    write_text(layout.cds_pending, f"{dump}\n{archive}\n")
    return [f"-XX:ArchiveClassesAtExit={dump}"]


def _remove_stale_dumps(directory: Path, max_age_s: float = 86400.0) -> None:
    """Drop dumps of brokers that were never stopped through us (they are 50 MB each)."""
    for tmp in directory.glob("cds-*.jsa.*.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - tmp.stat().st_mtime > max_age_s:
                tmp.unlink()


def discard_cds_archive(libs: Path) -> bool:
    """Delete the shared archive (suspected of crashing the JVM); True if there was one."""
    if not _cds_enabled():
        return False
    archive = _cds_archive(libs)
    existed = archive.is_file()
    archive.unlink(missing_ok=True)
    return existed


def _cds_archive_loads(archive: Path, libs: Path) -> bool:
    """Whether a JVM starts with this archive: a damaged one crashes it (SIGBUS), not just warns."""
    cmd = [find_java(), *JVM_OPTS, f"-XX:SharedArchiveFile={archive}", "-cp", f"{libs}/*", "-version"]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60).returncode == 0


def finish_cds_dump(layout: Layout, clean_exit: bool) -> None:
    """Publish a dumped archive, only if the JVM exited normally (a killed dump is junk)."""
    try:
        dump, archive = (Path(line) for line in layout.cds_pending.read_text().splitlines())
    except (OSError, ValueError):
        return
    try:
        if clean_exit and dump.is_file() and _cds_archive_loads(dump, archive.parent / "libs"):
            os.replace(dump, archive)
    except (OSError, DevKafkaError, subprocess.SubprocessError):
        pass  # best effort: the next broker simply dumps again
    finally:
        dump.unlink(missing_ok=True)
        layout.cds_pending.unlink(missing_ok=True)
