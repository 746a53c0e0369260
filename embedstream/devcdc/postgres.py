"""A throwaway PostgreSQL cluster for the CDC rig: Debian's packages, ``wal_level=logical``, trust on loopback.

Layout of a data dir (default ``/tmp/embedstream-postgres/<port>`` as root, else
``~/.cache/embedstream/postgres-data/<port>``)::

    pgdata/          the cluster (initdb once; its postgresql.conf gets the CDC settings appended)
    postgres.log     the server's log (its output)
    launcher.pid     the process that launched it (devkafka.process.spawn: bound to its owner, if any)

PostgreSQL refuses to run as root, so as root the cluster belongs to the ``postgres`` user that
Debian's package creates, and its data dir lives where that user can reach it (not under /root).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from embedstream.devkafka.errors import DevKafkaError
from embedstream.devkafka.layout import CACHE_ROOT, file_lock, file_tail, tail_text
from embedstream.devkafka.process import EXIT_CODES, pid_alive, spawn, terminate

DEFAULT_PORT = 5432
DEFAULT_DB = "embedstream"
SUPERUSER = "postgres"
HOST = "127.0.0.1"
LAUNCHER_PID = "launcher.pid"  # the process spawn() started: the postmaster, or runuser around it as root
OS_USER = "postgres"  # who owns the cluster when we run as root
INSTALL_HINT = "install PostgreSQL (Debian: apt-get install -y postgresql) or set EMBEDSTREAM_PG_BIN"

# What logical decoding needs, and a dev cluster's speed over durability (a dev box does not lose power).
# Passed on the server's command line at every start (so a cluster made by an older version gets them too)
# and written to postgresql.conf at initdb (a cluster started by hand).
CDC_SETTINGS = {
    "wal_level": "logical",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "fsync": "off",
    # A logical walsender sends only WAL that is flushed. With synchronous_commit off a COMMIT waits for the
    # WAL writer's next round (wal_writer_delay, 200 ms) before Debezium can read it: COMMIT -> the connector
    # read it 181 ms median (306 p95) at 200 commits/s off, 0.3-1.3 ms (10-23) on (`embedstream bench
    # cdc-settings`, devcdc/connect.py). With fsync off the flush is a write(): the UPDATE's round trip stayed
    # 0.44-0.53 ms (median).
    "synchronous_commit": "on",
    "full_page_writes": "off",
    "shared_buffers": "64MB",
    "max_connections": "50",
}


@dataclasses.dataclass(frozen=True)
class PostgresInfo:
    """Where a running dev cluster listens."""

    port: int
    pid: int
    data_dir: Path
    database: str = DEFAULT_DB
    host: str = HOST
    user: str = SUPERUSER

    @property
    def dsn(self) -> str:
        """libpq connection string (trust authentication: no password)."""
        return f"host={self.host} port={self.port} dbname={self.database} user={self.user}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "postgres.log"


def bin_dir() -> Path:
    """The newest installed PostgreSQL's bin folder (``$EMBEDSTREAM_PG_BIN`` first)."""
    env = os.environ.get("EMBEDSTREAM_PG_BIN")
    candidates = [Path(env)] if env else sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _major(p.parent.name), reverse=True)
    if not env and (pg_config := shutil.which("pg_config")):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            candidates.append(Path(subprocess.run([pg_config, "--bindir"], capture_output=True, text=True,
                                                  timeout=30).stdout.strip()))
    for path in candidates:
        if (path / "initdb").is_file() and (path / "pg_ctl").is_file():
            return path
    raise DevKafkaError(f"no PostgreSQL server binaries (initdb, pg_ctl) found; {INSTALL_HINT}")


def _major(name: str) -> int:
    return int(name) if name.isdigit() else 0


def default_data_dir(port: int) -> Path:
    env = os.environ.get("EMBEDSTREAM_PG_DATA_DIR")
    if env:
        return Path(env).expanduser()
    if os.geteuid() == 0:
        return Path("/tmp/embedstream-postgres") / str(port)
    return CACHE_ROOT / "postgres-data" / str(port)


def _as_owner(cmd: list[str]) -> list[str]:
    """Run as the cluster's owner: the postgres user when we are root, else ourselves."""
    if os.geteuid() != 0:
        return cmd
    runuser = shutil.which("runuser")
    if runuser is None:
        raise DevKafkaError("running as root needs runuser (util-linux) to start PostgreSQL as 'postgres'")
    return [runuser, "-u", OS_USER, "--", *cmd]


def _prepare_dir(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        import pwd

        try:
            owner = pwd.getpwnam(OS_USER)
        except KeyError:
            raise DevKafkaError(f"no '{OS_USER}' user to own the cluster; {INSTALL_HINT}") from None
        os.chown(root, owner.pw_uid, owner.pw_gid)
        for parent in root.parents:  # the owner must reach the folder
            if parent == Path("/") or parent.stat().st_mode & 0o001:
                break
            raise DevKafkaError(f"{root} is not reachable for the '{OS_USER}' user ({parent} is closed); "
                                "pick a data dir under /tmp or /var/tmp")


def _run(cmd: list[str], what: str, timeout_s: float = 120) -> str:
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise DevKafkaError(f"{what} failed (exit {proc.returncode}):\n{tail_text(proc.stdout + proc.stderr)}")
    return proc.stdout


def live_pid(data_dir: Path) -> int | None:
    """The postmaster's pid from postmaster.pid if it runs, else None."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
        if pid_alive(pid):
            return pid
    return None


def start(port: int = DEFAULT_PORT, data_dir: Path | str | None = None, database: str = DEFAULT_DB,
          wait_s: float = 60.0) -> PostgresInfo:
    """Create the cluster once (initdb), start it (no-op when running) and create ``database``."""
    root = Path(data_dir).expanduser().resolve() if data_dir is not None else default_data_dir(port)
    bindir = bin_dir()
    _prepare_dir(root)
    pgdata = root / "pgdata"
    with file_lock(root / ".lock"):
        if not (pgdata / "PG_VERSION").is_file():
            shutil.rmtree(pgdata, ignore_errors=True)
            _run(_as_owner([str(bindir / "initdb"), "-D", str(pgdata), "-U", SUPERUSER, "--auth=trust",
                            "--encoding=UTF8", "--locale=C", "--no-sync"]), "initdb")
            with open(pgdata / "postgresql.conf", "a") as conf:
                conf.write("\n# embedstream CDC rig\n" + "".join(f"{k} = '{v}'\n" for k, v in CDC_SETTINGS.items()))
        pid = live_pid(root)
        if pid is None:
            (pgdata / "postmaster.pid").unlink(missing_ok=True)  # stale: its postmaster is gone
            settings = [arg for k, v in CDC_SETTINGS.items() for arg in ("-c", f"{k}={v}")]
            cmd = _as_owner([str(bindir / "postgres"), "-D", str(pgdata), "-p", str(port), *settings,
                             "-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={pgdata}"])
            launcher = spawn(cmd, root, root / "postgres.log", root / LAUNCHER_PID)
            pid = _wait_ready(root, launcher, port, wait_s)
    info = PostgresInfo(port, pid, root, database)
    if database != "postgres" and not psql(info, f"SELECT 1 FROM pg_database WHERE datname = '{database}'",
                                          database="postgres").strip():
        psql(info, f'CREATE DATABASE "{database}"', database="postgres")
    return info


def _wait_ready(root: Path, launcher: int, port: int, wait_s: float) -> int:
    """The postmaster's pid once it accepts connections (its postmaster.pid says ``ready``)."""
    deadline = time.monotonic() + wait_s
    where = f"PostgreSQL on {HOST}:{port} (log {root / 'postgres.log'})"
    while True:
        with contextlib.suppress(OSError, ValueError, IndexError):
            lines = (root / "pgdata" / "postmaster.pid").read_text().splitlines()
            if len(lines) > 7 and lines[7].strip() == "ready":
                return int(lines[0])
        if not pid_alive(launcher):
            code = EXIT_CODES.get(launcher)
            raise DevKafkaError(f"{where} exited (code {code}) while starting:\n{file_tail(root / 'postgres.log', 10)}")
        if time.monotonic() >= deadline:
            terminate(launcher, 10.0)
            raise DevKafkaError(f"{where} did not accept connections within {wait_s:.0f} s:\n"
                                f"{file_tail(root / 'postgres.log', 10)}")
        time.sleep(0.1)


def psql(info: PostgresInfo, sql: str, database: str | None = None) -> str:
    """Run SQL through psql (no driver needed); returns the unaligned, tuples-only output."""
    cmd = [str(bin_dir() / "psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", info.host,
           "-p", str(info.port), "-U", info.user, "-d", database or info.database, "-c", sql]
    return _run(cmd, f"psql {sql[:60]!r}", timeout_s=60)


def stop(port: int = DEFAULT_PORT, data_dir: Path | str | None = None, mode: str = "fast") -> bool:
    """Stop the cluster (pg_ctl stop -m fast); True if one was running. Data is kept."""
    root = Path(data_dir).expanduser().resolve() if data_dir is not None else default_data_dir(port)
    if live_pid(root) is None:
        return False
    _run(_as_owner([str(bin_dir() / "pg_ctl"), "-D", str(root / "pgdata"), "-m", mode, "-w", "stop"]),
         "stopping PostgreSQL")
    _reap_launcher(root)
    return True


def _reap_launcher(root: Path) -> None:
    """Wait for the launched process (the postmaster, or runuser around it) to exit, so none lingers as a zombie."""
    with contextlib.suppress(OSError, ValueError):
        launcher = int((root / LAUNCHER_PID).read_text())
        deadline = time.monotonic() + 10
        while pid_alive(launcher) and time.monotonic() < deadline:
            time.sleep(0.05)
    (root / LAUNCHER_PID).unlink(missing_ok=True)


def kill(data_dir: Path | str) -> bool:
    """SIGKILL the postmaster (a crash, for fault tests); its children exit when it is gone."""
    root = Path(data_dir)
    pid = live_pid(root)
    if pid is None:
        return False
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _reap_launcher(root)
    return True


def status(port: int = DEFAULT_PORT, data_dir: Path | str | None = None) -> dict:
    root = Path(data_dir).expanduser().resolve() if data_dir is not None else default_data_dir(port)
    pid = live_pid(root)
    return {"running": pid is not None, "pid": pid, "port": port, "data_dir": str(root),
            "log": str(root / "postgres.log"),
            "dsn": PostgresInfo(port, pid or 0, root).dsn}
