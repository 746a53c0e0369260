"""Running the tools (apt-get, go, mvn, podman, docker) with a niceness, a timeout and a log file,
and the error that names the log when one fails."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

from embedstream.devimages.errors import DevImagesError
from embedstream.devkafka.layout import CACHE_ROOT, tail_text

# Where everything of these commands lives outside the clone (survives into CI on the same machine).
ROOT = CACHE_ROOT
LOGS = ROOT / "images-logs"

# Builds share 2 vCPUs with everything else: always below the default priority.
NICE = ["nice", "-n", "10"]


def run(cmd: Sequence[str], *, log: Path | None = None, timeout: float = 3600, env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None, nice: bool = True, what: str | None = None) -> str:
    """Run ``cmd`` (niced), its output to ``log`` (appended), its stdout returned; raise with the log's tail on failure."""
    full = [*NICE, *cmd] if nice else list(cmd)
    merged = {**os.environ, **(env or {})}
    started = time.monotonic()
    try:
        proc = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, errors="replace", timeout=timeout, env=merged, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise DevImagesError(f"{what or cmd[0]} timed out after {timeout:.0f} s") from exc
    except FileNotFoundError as exc:
        raise DevImagesError(f"{cmd[0]} not found on PATH") from exc
    out, err = proc.stdout or "", proc.stderr or ""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(map(str, cmd))}\n{out}{err}\n# exit {proc.returncode} after "
                     f"{time.monotonic() - started:.1f} s\n")
    if proc.returncode != 0:
        where = f" (full log: {log})" if log is not None else ""
        raise DevImagesError(f"{what or ' '.join(map(str, cmd[:3]))} failed (exit {proc.returncode}){where}:\n"
                             + tail_text(out + err))
    return out
