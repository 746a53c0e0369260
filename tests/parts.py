"""A green run means every real part ran: a test that needs a real part this machine lacks (a container
engine, ``go``, ``node``, PostgreSQL, the Qdrant server image) fails, naming the part and how to get it,
unless the run was told to leave that part out by name:

    EMBEDSTREAM_TEST_LEAVE_OUT=compose,node bash scripts/test.sh

Then the test is skipped with the reason, and the summary lists every skip with it (scripts/test.sh runs
pytest with ``-rfEs``). The part names are the keys of ``PARTS``.
"""

from __future__ import annotations

import os

import pytest

LEAVE_OUT_ENV = "EMBEDSTREAM_TEST_LEAVE_OUT"

PARTS = {
    "go": "helm and the chart validator, built from the Go module proxy (tests/unit/test_helm_chart.py)",
    "node": "ajv's strict-mode schema check under Node.js (tests/unit/test_schema_examples.py)",
    "compose": "the docker compose stack on a container engine (tests/compose/)",
    "qdrant": "a Qdrant server process from the binary the qdrant image is built from (tests/qdrant_rig.py)",
}


def left_out() -> set[str]:
    names = {n.strip() for n in os.environ.get(LEAVE_OUT_ENV, "").split(",") if n.strip()}
    unknown = names - set(PARTS)
    if unknown:
        raise pytest.UsageError(f"{LEAVE_OUT_ENV} names unknown parts {sorted(unknown)}; known: {sorted(PARTS)}")
    return names


def require(part: str, available: bool, reason: str) -> None:
    """Go on when the part is there; else skip (left out by name) or fail, with the reason either way."""
    if available:
        return
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}")
    if part in left_out():
        pytest.skip(f"{part} left out ({LEAVE_OUT_ENV}): {reason}")
    pytest.fail(f"{reason}. The real part '{part}' ({PARTS[part]}) cannot run here: install it, or leave it out "
                f"by name with {LEAVE_OUT_ENV}={part}", pytrace=False)
