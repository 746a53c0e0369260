"""Running the tools (apt-get, go, mvn, podman, docker) with a niceness, a timeout and a log file that
fills as they run, and the error that names the log when one fails."""

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


def run(cmd: Sequence[str], *, log: Path, timeout: float = 3600, env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None, nice: bool = True, what: str | None = None, capture: bool = False) -> str:
    """Run ``cmd`` (niced), its output appended to ``log`` as it comes; with ``capture`` its stdout is
    returned instead (stderr still to the log). Raises with the log's tail when it fails or times out."""
    full = [*NICE, *cmd] if nice else list(cmd)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(map(str, cmd))}\n")
        fh.flush()
        try:
            proc = subprocess.run(full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if capture else fh,
                                  stderr=fh, text=True, errors="replace", timeout=timeout,
                                  env={**os.environ, **(env or {})}, cwd=cwd)
        except subprocess.TimeoutExpired as exc:
            raise DevImagesError(f"{what or cmd[0]} timed out after {timeout:.0f} s (log: {log})") from exc
        except FileNotFoundError as exc:
            raise DevImagesError(f"{cmd[0]} not found on PATH") from exc
        fh.write(f"# exit {proc.returncode} after {time.monotonic() - started:.1f} s\n")
    if proc.returncode != 0:
        raise DevImagesError(f"{what or ' '.join(map(str, cmd[:3]))} failed (exit {proc.returncode}; full log: "
                             f"{log}):\n" + tail_text(log.read_text(errors="replace")))
    return proc.stdout if capture else ""
