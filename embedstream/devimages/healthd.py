"""The healthcheck driver: runs each running container's HEALTHCHECK at its own interval.

Podman runs healthchecks from systemd timers; on a machine without systemd none ever runs, a container
stays "starting" for ever, and ``depends_on: condition: service_healthy`` or ``docker compose up --wait``
never return. This loop stands in for the timers: ``podman healthcheck run`` (which keeps podman's own
health log, retries and start period) for each container, every ``Interval`` of its healthcheck, and every
``START_INTERVAL_S`` within its start period while not yet healthy (as Docker's start interval: failures
there do not count), at most one at a time per container. Started and stopped by ``embedstream dev compose up|down`` (engine.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

START_INTERVAL_S = 3.0
LIST_EVERY_S = 2.0
DEFAULT_INTERVAL_S = 30.0


def _seconds(ns) -> float:
    try:
        return float(ns) / 1e9
    except (TypeError, ValueError):
        return 0.0


def _running(podman: str) -> list[str]:
    out = subprocess.run([podman, "ps", "-q", "--no-trunc"], capture_output=True, text=True, timeout=60)
    return out.stdout.split() if out.returncode == 0 else []


def _inspect(podman: str, ids: list[str]) -> dict[str, dict]:
    """Per container: its healthcheck (None without one) and its health status."""
    if not ids:
        return {}
    out = subprocess.run([podman, "inspect", "--type", "container", *ids], capture_output=True, text=True,
                         timeout=60)
    found = {}
    for item in json.loads(out.stdout or "[]") if out.returncode == 0 else []:
        check = (item.get("Config") or {}).get("Healthcheck") or None
        test = (check or {}).get("Test") or []
        if not test or test[0] == "NONE":
            check = None
        health = ((item.get("State") or {}).get("Health") or {}).get("Status", "")
        found[item["Id"]] = {"check": check, "health": health, "seen": time.monotonic()}
    return found


def main() -> int:
    podman = shutil.which("podman") or "podman"
    stopping = False

    def _stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    due: dict[str, float] = {}
    running: dict[str, subprocess.Popen] = {}
    deadline: dict[str, float] = {}
    checks: dict[str, dict] = {}
    listed = 0.0
    while not stopping:
        now = time.monotonic()
        if now - listed >= LIST_EVERY_S:
            listed = now
            try:
                ids = _running(podman)
                new = [i for i in ids if i not in checks]
                checks.update(_inspect(podman, new))
                for gone in set(checks) - set(ids):
                    checks.pop(gone, None)
                    due.pop(gone, None)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                print(f"healthd: listing containers failed: {exc}", file=sys.stderr, flush=True)
        for cid, info in list(checks.items()):
            check = info["check"]
            if check is None:
                continue
            proc = running.get(cid)
            if proc is not None:
                if proc.poll() is None:
                    if now > deadline[cid]:
                        proc.kill()
                    continue
                running.pop(cid)
                if proc.returncode == 0:
                    info["healthy_once"] = True
                interval = _seconds(check.get("Interval")) or DEFAULT_INTERVAL_S
                # not yet healthy, within the start period: look again soon (Docker's start interval);
                # after it, every interval, so `retries` failures take as long as under Docker
                starting = not info.get("healthy_once") and now - info["seen"] < _seconds(check.get("StartPeriod"))
                due[cid] = now + (min(interval, START_INTERVAL_S) if starting else interval)
                continue
            if now < due.setdefault(cid, now + START_INTERVAL_S):
                continue
            timeout = _seconds(check.get("Timeout")) or 30.0
            deadline[cid] = now + timeout + 30.0
            running[cid] = subprocess.Popen([podman, "healthcheck", "run", cid], stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    for proc in running.values():
        proc.kill()
    return 0


if __name__ == "__main__":
    os.nice(5)
    sys.exit(main())
