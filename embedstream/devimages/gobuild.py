"""Go programs built from the Go module proxy (Docker Compose, Prometheus): ``go mod download`` of the
module at a pinned version, ``go build`` of one package, the binary cached per version outside the clone.

``go install module/cmd@version`` is not used: it refuses modules whose go.mod has replace or exclude
directives (Docker Compose's has), so the module is copied and built in place, with its own go.mod."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

from embedstream.devimages.errors import DevImagesError
from embedstream.devimages.run import LOGS, ROOT, run
from embedstream.devkafka.layout import file_lock

GO_BUILD_TIMEOUT_S = 3600


def find_go() -> str:
    """The ``go`` command: PATH, then the official install's /usr/local/go/bin."""
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)
    if go is None:
        raise DevImagesError("go not found: install Go (https://go.dev/doc/install, or Debian's golang-go where "
                             "its version is new enough for the module's go.mod)", code="no_go")
    return go


def go_binary(module: str, version: str, package: str, name: str, *, ldflags: str = "",
              tags: Sequence[str] = ()) -> Path:
    """Path of ``name`` built from ``module@version``'s ``package`` (``./cmd``), built only the first time.

    Cached at ``~/.cache/embedstream/go-bin/<name>/<version>/<name>``; written under another name and
    renamed when complete, so an interrupted build is never taken for a finished one.
    """
    home = ROOT / "go-bin" / name / version
    out = home / name
    if out.is_file():
        return out
    go = find_go()
    log = LOGS / f"go-{name}-{version}.log"
    with file_lock(home / ".lock"):
        if out.is_file():
            return out
        env = {"GOFLAGS": "-mod=mod", "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
        meta = json.loads(run([go, "mod", "download", "-json", f"{module}@{version}"], log=log, env=env,
                              timeout=GO_BUILD_TIMEOUT_S, what=f"go mod download {module}@{version}", capture=True))
        src = home / "src"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(meta["Dir"], src)
        for path in [src, *src.rglob("*")]:  # the module cache is read-only; go build may write go.sum
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
        partial = home / f"{name}.partial"
        cmd = [go, "build", "-trimpath", "-ldflags", f"-w {ldflags}".strip(), "-o", str(partial)]
        if tags:
            cmd += ["-tags", ",".join(tags)]
        run([*cmd, package], log=log, env=env, cwd=src, timeout=GO_BUILD_TIMEOUT_S,
            what=f"go build {module}@{version} {package}")
        partial.rename(out)
        shutil.rmtree(src, ignore_errors=True)
    return out
