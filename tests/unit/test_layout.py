"""The distribution installs one import name: `embedstream`. The repo's top-level folders schemas/,
producers/ and workers/ are its subpackages, so no other package of those generic names is shadowed
or overwritten by installing embedstream."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _imports(module: str, tmp_path) -> subprocess.CompletedProcess:
    # Run outside the checkout: the repo root on sys.path would make its folders importable by accident.
    return subprocess.run([sys.executable, "-c", f"import {module}"], cwd=tmp_path, capture_output=True, text=True)


@pytest.mark.parametrize("name", ["workers", "schemas", "producers"])
def test_generic_top_level_names_are_not_installed(name, tmp_path):
    result = _imports(name, tmp_path)
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr


@pytest.mark.parametrize("name", ["embedstream.workers", "embedstream.schemas", "embedstream.producers"])
def test_subpackages_import_under_the_one_name(name, tmp_path):
    result = _imports(name, tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_installed_distribution_declares_one_top_level_name(tmp_path):
    script = (
        "from importlib.metadata import distribution\n"
        "dist = distribution('embedstream')\n"
        "print(' '.join(sorted(set((dist.read_text('top_level.txt') or '').split()))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["embedstream"]
