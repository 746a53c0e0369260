"""Where one dev broker's files live (its data dir) and small file helpers shared by the other modules.

Layout of a data dir (default ``~/.cache/embedstream/kafka-data/<port>``)::

    server.properties   rewritten on every start
    log4j2.properties   rewritten on every start
    kraft-logs/         topic data + KRaft metadata; formatted only once
    server.log          broker log (log4j2, rolled at 10 MB)
    kafka.out           JVM stdout/stderr (crashes, early failures)
    broker.pid          pid of the running broker (its own process group)
    cds-dump.pending    only while a broker dumps the shared class archive (see jvm.py)
    security/           only for a secured broker: CA, broker key store, credentials (see security.py)
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
from pathlib import Path
from typing import Iterator

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9092
CACHE_ROOT = Path.home() / ".cache" / "embedstream"


@dataclasses.dataclass(frozen=True)
class Layout:
    """File names inside one broker's data dir, kept in one place."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "server.properties"

    @property
    def log4j(self) -> Path:
        return self.root / "log4j2.properties"

    @property
    def log_dirs(self) -> Path:
        return self.root / "kraft-logs"

    @property
    def meta(self) -> Path:
        return self.log_dirs / "meta.properties"

    @property
    def pid_file(self) -> Path:
        return self.root / "broker.pid"

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def console_log(self) -> Path:
        return self.root / "kafka.out"

    @property
    def lock_file(self) -> Path:
        return self.root / ".lock"

    @property
    def cds_pending(self) -> Path:
        """Records the class-data archive this broker dumps at exit, and where it goes."""
        return self.root / "cds-dump.pending"


def default_data_dir(port: int = DEFAULT_PORT) -> Path:
    """``$EMBEDSTREAM_KAFKA_DATA_DIR`` if set, else one dir per port so brokers never share state."""
    env = os.environ.get("EMBEDSTREAM_KAFKA_DATA_DIR")
    return Path(env).expanduser() if env else CACHE_ROOT / "kafka-data" / str(port)


def layout_for(port: int, data_dir: Path | str | None) -> Layout:
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir(port)
    return Layout(root.resolve())


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Serialise concurrent resolutions/starts (parallel test workers, two shells)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def tail_text(text: str, lines: int = 30) -> str:
    """Last lines of a command's output (the error is nearly always at the end), colour codes dropped."""
    return "\n".join(_ANSI_ESCAPE.sub("", text).strip().splitlines()[-lines:])


def write_text(path: Path, text: str | bytes, *, private: bool = False) -> None:
    """Write via rename so a crash never leaves a half-written config behind.

    ``private``: the file holds a secret (a key, a password), so it is created readable by its owner only.
    """
    tmp = path.with_name(path.name + ".tmp")
    data = text.encode() if isinstance(text, str) else text
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    if private:
        os.chmod(tmp, 0o600)  # an older tmp file may have had another mode
    tmp.replace(path)


def file_tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            return tail_text(fh.read().decode("utf-8", "replace"), lines)
    except OSError:
        return ""


def logs_excerpt(layout: Layout) -> str:
    """Tails of both logs: startup failures land in kafka.out, broker errors in server.log."""
    parts = []
    for path in (layout.server_log, layout.console_log):
        text = file_tail(path)
        if text:
            parts.append(f"--- last lines of {path} ---\n{text}")
    return "\n".join(parts)
