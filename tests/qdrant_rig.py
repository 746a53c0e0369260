"""A real Qdrant server for the store contract tests: the binary the set-up builds (v1.19.0), on loopback ports
of the run's block (``tests/ports.py``), storage in a temporary folder, bound to the test run (leash)."""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

from ports import QDRANT_SERVER, port
import run_rig
from process_rig import popen

from embedstream.devimages.images import default_qdrant_binary

BINARY = default_qdrant_binary()  # the one the qdrant image is built from ($EMBEDSTREAM_QDRANT_BINARY)


class QdrantServer:
    """One server process; ``url`` answers once it is ready."""

    def __init__(self, folder: Path, number: int = 0):
        """``number``: which of the block's servers (0, 1: two may run at once)."""
        self.http, self.grpc = port(QDRANT_SERVER + 2 * number), port(QDRANT_SERVER + 2 * number + 1)
        self.url = f"http://127.0.0.1:{self.http}"
        env = dict(os.environ, QDRANT__SERVICE__HOST="127.0.0.1", QDRANT__SERVICE__HTTP_PORT=str(self.http),
                   QDRANT__SERVICE__GRPC_PORT=str(self.grpc), QDRANT__STORAGE__STORAGE_PATH=str(folder / "storage"),
                   QDRANT__STORAGE__SNAPSHOTS_PATH=str(folder / "snapshots"), QDRANT__TELEMETRY_DISABLED="true",
                   QDRANT__LOG_LEVEL="WARN")
        self.log = open(folder / "qdrant.log", "wb")
        self.proc = popen([str(BINARY)], cwd=folder, env=env, stdout=self.log, stderr=self.log)
        run_rig.shared(self.proc.pid)  # a module's server, stopped by its fixture
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"qdrant exited with {self.proc.returncode}: {(folder / 'qdrant.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"qdrant did not answer on {self.url} within 60 s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except Exception:  # noqa: BLE001 - a server that does not stop is killed
            self.proc.kill()
            self.proc.wait()
        self.log.close()
