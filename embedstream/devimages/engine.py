"""The container engine that ``docker compose`` talks to.

Where a Docker engine answers (``DOCKER_HOST``, else the default socket), it is used unchanged. On a Debian
machine without one, ``up`` sets up and starts rootful podman as the engine:

* Debian's podman, runc, netavark, aardvark-dns, iptables (netavark's firewall: without it a container with
  a network fails to start, "netavark: No such file or directory"), fuse-overlayfs, uidmap and mmdebstrap
  (apt-get, once);
* a containers.conf of our own (``CONTAINERS_CONF``): runc, since crun 1.8 refuses a cgroup v1/v2 hybrid
  host ("cgroups in hybrid mode not supported"); ulimits within the host's hard limits, since podman's
  rootful nofile default of 1048576 fails without CAP_SYS_RESOURCE ("setrlimit RLIMIT_NOFILE");
* the Docker Compose CLI plugin built from its Go module (``gobuild``), linked where the docker CLI looks;
* ``podman system service`` serving Docker's API on the default socket (/run/docker.sock), so ``docker``
  and ``docker compose`` need no settings;
* the healthcheck driver (``healthd``): without systemd podman never runs a HEALTHCHECK by itself, and
  ``depends_on: condition: service_healthy`` and ``up --wait`` would wait forever.

``down`` stops the service and the driver (containers keep running; ``docker compose down`` stops them).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from embedstream.devimages.errors import DevImagesError
from embedstream.devimages.gobuild import go_binary
from embedstream.devimages.run import LOGS, ROOT, run

STATE = ROOT / "engine"
CONTAINERS_CONF = STATE / "containers.conf"
DEFAULT_SOCKET = Path("/run/docker.sock")  # /var/run/docker.sock: where the docker CLI looks by default

APT_PACKAGES = ["podman", "runc", "netavark", "aardvark-dns", "iptables", "fuse-overlayfs", "uidmap", "mmdebstrap"]

# Newest Compose on the Go module proxy that builds with Go 1.26.8 (v5.7.x asks for a newer Go).
COMPOSE_MODULE = "github.com/docker/compose/v5"
COMPOSE_VERSION = "v5.6.0"

# Where the docker CLI finds plugins (the system-wide one; ~/.docker/cli-plugins when not root).
SYSTEM_PLUGINS = Path("/usr/local/lib/docker/cli-plugins")

CONF_TEXT = """# Written by embedstream (embedstream/devimages/engine.py); podman reads it through CONTAINERS_CONF.
[containers]
# The host's hard nofile limit is below podman's rootful default and there is no CAP_SYS_RESOURCE.
default_ulimits = ["nofile={nofile}:{nofile}", "nproc=32768:32768"]
[engine]
# crun 1.8 refuses cgroup v1/v2 hybrid hosts; runc runs on them.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def docker_host() -> str:
    """The engine address the docker CLI uses: DOCKER_HOST, else the default socket."""
    return os.environ.get("DOCKER_HOST") or f"unix://{DEFAULT_SOCKET}"


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


def engine_version(host: str | None = None, timeout: float = 5.0) -> dict | None:
    """The engine's ``GET /version`` (Docker's API), or None when nothing answers there."""
    host = host or docker_host()
    if not host.startswith("unix://"):
        conn: http.client.HTTPConnection = http.client.HTTPConnection(
            host.split("://", 1)[-1].split("/")[0], timeout=timeout)
    else:
        conn = _UnixHTTP(host[len("unix://"):], timeout)
    try:
        conn.request("GET", "/version")
        resp = conn.getresponse()
        return json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def is_podman(version: dict | None) -> bool:
    return any("podman" in str(c.get("Name", "")).lower() for c in (version or {}).get("Components") or [])


_DAEMON_MARK = {"service": b"system\x00service", "healthd": b"embedstream.devimages.healthd"}


def _pid(name: str) -> int | None:
    """The daemon's pid while it runs (its command line checked: a reused pid is not ours)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((STATE / f"{name}.pid").read_text().strip())
        if _DAEMON_MARK[name] in Path(f"/proc/{pid}/cmdline").read_bytes():
            return pid
    return None


def podman_env() -> dict[str, str]:
    """What every podman command of ours (and a user's, through ``dev compose env``) needs."""
    return {"CONTAINERS_CONF": str(CONTAINERS_CONF)}


def ours() -> bool:
    """True when the engine on the default socket is the podman service this module started."""
    return _pid("service") is not None


def _nofile() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1048576 if hard == resource.RLIM_INFINITY else min(hard, 1048576)


def install_packages() -> None:
    """Debian's podman and its helpers, when podman is missing (apt-get, as root)."""
    missing = [p for p in APT_PACKAGES if subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True).stdout.split()[-1:] != ["installed"]]
    if not missing:
        return
    if os.geteuid() != 0:
        raise DevImagesError("podman is not set up and this is not root: apt-get install " + " ".join(missing))
    log = LOGS / "engine-apt.log"
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    run(["apt-get", "update", "-q"], log=log, env=env, timeout=900, what="apt-get update")
    run(["apt-get", "install", "-y", "-q", *missing], log=log, env=env, timeout=1800,
        what="apt-get install podman")


def compose_plugin() -> Path:
    """The Docker Compose CLI plugin, built once from the Go module proxy."""
    return go_binary(COMPOSE_MODULE, COMPOSE_VERSION, "./cmd", "docker-compose",
                     ldflags=f"-X {COMPOSE_MODULE}/internal.Version={COMPOSE_VERSION}")


def plugin_dir() -> Path:
    return SYSTEM_PLUGINS if os.geteuid() == 0 else Path.home() / ".docker" / "cli-plugins"


def link_compose_plugin() -> Path:
    """Link the plugin where the docker CLI finds it, unless a Compose plugin is installed there already."""
    target = plugin_dir() / "docker-compose"
    built = compose_plugin()
    if target.is_symlink() and Path(os.readlink(target)) != built:
        target.unlink()  # ours, of another version
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(built)
    return target


def setup() -> None:
    """Everything ``start`` needs, each step only when missing."""
    install_packages()
    STATE.mkdir(parents=True, exist_ok=True)
    text = CONF_TEXT.format(nofile=_nofile())
    if not CONTAINERS_CONF.is_file() or CONTAINERS_CONF.read_text() != text:
        CONTAINERS_CONF.write_text(text)
    link_compose_plugin()


def _spawn(name: str, cmd: list[str]) -> int:
    """A daemon of ours: its own session, not a child of the caller (a shell starts it in the background and
    exits, so it belongs to init and outlives the command), output to a log, pid in STATE."""
    LOGS.mkdir(parents=True, exist_ok=True)
    log = LOGS / f"engine-{name}.log"
    line = " ".join(shlex.quote(c) for c in cmd) + f" >>{shlex.quote(str(log))} 2>&1 </dev/null & echo $!"
    out = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=30, start_new_session=True,
                         env={**os.environ, **podman_env()})
    pid = int(out.stdout.strip())
    (STATE / f"{name}.pid").write_text(f"{pid}\n")
    return pid


def start(socket_path: Path = DEFAULT_SOCKET, timeout: float = 60.0) -> str:
    """Make ``docker compose`` work: an engine that answers is used as it is; else podman is set up and its
    Docker API served on ``socket_path``. Returns what serves the engine."""
    version = None if ours() else engine_version()
    if version is not None:
        kind = "podman" if is_podman(version) else "docker"
        return f"{kind} {version.get('Version')} at {docker_host()} (not ours: used as it is)"
    setup()
    if _pid("service") is None:
        if socket_path.exists() or socket_path.is_symlink():
            if engine_version(f"unix://{socket_path}") is not None:
                raise DevImagesError(f"an engine that is not ours answers on {socket_path}")
            socket_path.unlink()  # a stale socket: its service is gone
        podman = shutil.which("podman") or "podman"
        _spawn("service", ["nice", "-n", "5", podman, "system", "service", "--time=0", f"unix://{socket_path}"])
    if _pid("healthd") is None:
        _spawn("healthd", [sys.executable, "-m", "embedstream.devimages.healthd"])
    deadline = time.monotonic() + timeout
    while engine_version(f"unix://{socket_path}") is None:
        if time.monotonic() > deadline or _pid("service") is None:
            raise DevImagesError(f"podman's API did not answer on {socket_path} within {timeout:.0f} s "
                                 f"(log: {LOGS / 'engine-service.log'})")
        time.sleep(0.3)
    (STATE / "socket").write_text(f"{socket_path}\n")
    version = engine_version(f"unix://{socket_path}") or {}
    return f"podman {version.get('Version')} at unix://{socket_path} (ours; healthchecks driven by healthd)"


def stop() -> bool:
    """Stop the podman service and the healthcheck driver (containers are left as they are)."""
    stopped = False
    for name in ("healthd", "service"):
        pid = _pid(name)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            stopped = True
        (STATE / f"{name}.pid").unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        sock = Path((STATE / "socket").read_text().strip())
        if sock.is_socket() and engine_version(f"unix://{sock}", timeout=1) is None:
            sock.unlink()
    return stopped


def env_lines() -> list[str]:
    """Shell lines for ``eval "$(embedstream dev compose env)"``: the engine address and podman's
    configuration, when the engine is ours."""
    lines = []
    if ours():
        sock = (STATE / "socket").read_text().strip()
        lines += [f"export DOCKER_HOST=unix://{sock}", f"export CONTAINERS_CONF={CONTAINERS_CONF}"]
    return lines


def status() -> dict:
    version = engine_version()
    return {
        "docker_host": docker_host(),
        "answering": version is not None,
        "engine": ("podman " if is_podman(version) else "docker ") + str((version or {}).get("Version"))
        if version else None,
        "ours": ours(),
        "healthd": _pid("healthd"),
        "compose_plugin": str(plugin_dir() / "docker-compose"),
    }
