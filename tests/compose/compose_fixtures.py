"""The compose stack for tests/compose/ (its test modules import the fixture; a conftest.py here would take the name
``conftest`` from tests/conftest.py, whose rigs every other folder imports): set up where it can be (the engine: `embedstream dev compose up`;
the images: `embedstream dev images build`, warm from the caches: a code change rebuilds one small layer of
the project image), started once per session with `docker compose up -d --wait`, and removed with its
volumes at the end.

Not `up --build` here: through podman 4.3's Docker API every compose build of the project image starts
from scratch (compose adds a LABEL step, and podman then commits each stage anew, so no later layer is
found in the cache: 11-13 min and 6.5 GB a build on 2 vCPUs), where `embedstream dev images build`
(podman's own build) reuses its layers. With a Docker engine both are cached.

No engine, no compose plugin or no Qdrant server binary for the qdrant image: every test here fails with the
reason, unless the run leaves the part out by name (EMBEDSTREAM_TEST_LEAVE_OUT=compose, tests/parts.py).
"""

from __future__ import annotations

import shutil

import pytest

import stack as st
from parts import require


_STARTED_HERE: list[bool] = []


def _engine_problem() -> str | None:
    """Set up and start the engine where none answers (`embedstream dev compose up`); None when it answers."""
    from embedstream.devimages import engine
    from embedstream.devimages.errors import DevImagesError

    if shutil.which("docker") is None:
        return "no docker CLI on PATH (the compose tests drive `docker compose`)"
    _STARTED_HERE.append(engine.engine_version() is None)
    try:
        engine.start()
    except DevImagesError as exc:
        return f"no container engine: {exc.message}"
    return None


def _images_problem() -> str | None:
    from embedstream.devimages import images

    results = images.build_images(None, images.Options(), echo=lambda line: None)
    st.TIMINGS.update({f"image {r.name} (warm)": r.seconds or 0.0 for r in results})
    failed = [f"{r.name}: {r.error}" for r in results if r.error]
    return "images not built: " + "; ".join(failed) if failed else None


@pytest.fixture(scope="session")
def compose_stack():
    """The default stack, healthy (`up -d --wait`); yields nothing, the tests talk to its ports."""
    from embedstream.devimages import images

    binary = images.default_qdrant_binary()  # before anything slow: no binary, no Qdrant image, no stack
    require("compose", binary.is_file(), f"no Qdrant server binary at {binary} for the qdrant image (give one with "
                                         f"${images.QDRANT_BINARY_ENV}; compose/README.md says where to get one)")
    problem = st.timed("engine set-up", _engine_problem)
    require("compose", problem is None, problem or "")
    problem = st.timed("images build (warm)", _images_problem)
    require("compose", problem is None, problem or "")
    st.compose("down", "-v", "--remove-orphans", "-t", "5", profiles=("cdc", "rerank"), check=False)
    busy = [p for p in st.HOST_PORTS if st.port_busy(p)]
    require("compose", not busy, f"host ports {busy} are taken: the compose stack publishes them")
    try:
        st.timed("up -d --wait", st.compose, "up", "-d", "--wait", "--wait-timeout", "900", timeout=1800)
        yield
    finally:
        st.compose("down", "-v", "--remove-orphans", "-t", "10", profiles=("cdc", "rerank"), check=False,
                   timeout=600)
        if any(_STARTED_HERE):  # nothing the run started outlives it: the engine it started stops too
            from embedstream.devimages import engine

            engine.stop()
