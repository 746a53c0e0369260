"""`embedstream bench fleet`'s failover rows: ``kill -9`` of the broker leading most query and reply partitions
while queries arrive at a steady rate, once through a ``QueryClient`` and once through a gateway process (HTTP
``/embed``), each answered by an ``embedstream worker embed --lanes online`` process.

Per path: **answered %** (a reply without error), **in time %** (answered within the 5 s deadline), **gap s**
(the longest stretch after the kill in which no answer arrived: how long the fault froze replies), **p99
before** (answered, the 10 s before the kill) and **recovery s** (from the kill until every 2 s window of
queries for 10 s has ≥ 90 % answered with p99 under twice p99 before; ``fleet_rig.recovery_s``). The node is started
again and its leaderships handed back between the two.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from embedstream.bench.fleet_rig import (ClusterControl, HttpLoad, QueryLoad, answered_in_time, recovery_s,
                                         reply_gap, window_p)

TIMEOUT_S = 5.0
BEFORE_S, AFTER_S = 10.0, 40.0  # load before and after the kill
HOLD_S = 10.0  # recovered: p99 back under the target and staying there this long


@dataclass
class FailoverRow:
    path: str
    node: int
    queries: int
    answered_pct: float
    in_time_pct: float
    gap_s: float
    p99_before_ms: float | None
    recovery_s: float | None
    note: str = ""


def run(port: int, data_dir: str | None, qps: float = 20.0, say=print, out: Path | None = None) -> list[FailoverRow]:
    """Both paths on the 3-broker dev cluster at ``port`` (one answering there is used, else one is started)."""
    import dataclasses
    import tempfile

    from embedstream import devkafka

    with devkafka.borrowed(port=port, data_dir=data_dir, brokers=3) as info, \
            tempfile.TemporaryDirectory(prefix="failover-bench-") as tmp:
        rows = run_failover(info.bootstrap, port, str(info.data_dir), Path(tmp), port + 90, port + 95, qps, say)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([dataclasses.asdict(row) for row in rows], indent=2) + "\n")
    return rows


def run_failover(bootstrap: str, port: int, data_dir: str | None, root: Path, metrics_port: int, http_port: int,
                 qps: float, say=print) -> list[FailoverRow]:
    from embedstream.bench.fleet_bench import _env, _settings, _wait, _Worker
    from embedstream.producers.query_client import QueryClient
    from embedstream.producers.topics import ensure_topics

    k = _settings(bootstrap, f"failover-{uuid.uuid4().hex[:6]}", "consumer", "librdkafka")
    ensure_topics(k, 4)
    control = ClusterControl(port, data_dir, k)
    online = _Worker("failover-online", "online", _env(k), root, metrics_port).start()
    rows: list[FailoverRow] = []
    gateway = client = None
    try:
        _wait(online.assigned, 600, "the online worker", [online])
        client = QueryClient(k)
        _wait(lambda: _client_answers(client), 120, "the online worker answering", [online])
        say("failover: QueryClient")
        rows.append(_measure("QueryClient", QueryLoad(client, qps, TIMEOUT_S), control,
                             [k.topic_queries, k.topic_replies], note=lambda: f"{client.retries} sent again"))
        with open(root / "gateway.log", "wb") as log:
            gateway = subprocess.Popen([sys.executable, "-m", "embedstream.gateway", "--host", "127.0.0.1", "--port",
                                        str(http_port), "--log-level", "warning"], env=_env(k), stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{http_port}"
        _wait(lambda: gateway.poll() is None and _http_answers(url), 180, "the gateway answering", [online])
        say("failover: gateway")
        replies = json.loads(urllib.request.urlopen(f"{url}/info", timeout=10).read())["topics"]["replies"]
        rows.append(_measure("gateway", HttpLoad(url, qps, TIMEOUT_S), control, [k.topic_queries, replies]))
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(30)
        if client is not None:
            client.close()
        online.stop()
        control.heal()
        control.close()
    return rows


def _measure(path: str, load, control: ClusterControl, topics: list[str], note=lambda: "") -> FailoverRow:
    load.start()
    time.sleep(BEFORE_S)
    node = control.node_leading_most(topics)
    killed_at = time.monotonic()
    control.kill(node)
    time.sleep(AFTER_S)
    outcomes = load.stop()
    control.start(node)  # back, in sync, leading its partitions again: the next path meets the same cluster
    control.wait_in_sync(topics)
    control.elect_preferred(topics)
    before = window_p(outcomes, killed_at - BEFORE_S, killed_at, 99)
    recovered = None if before is None else recovery_s(outcomes, killed_at, max(2 * before, 0.25), hold_s=HOLD_S)
    answered = sum(1 for o in outcomes if o.kind == "answered")
    total = max(1, len(outcomes))
    return FailoverRow(path, node, len(outcomes), 100 * answered / total,
                       100 * answered_in_time(outcomes, TIMEOUT_S) / total,
                       reply_gap(outcomes, killed_at, killed_at + AFTER_S / 2),
                       None if before is None else before * 1000,
                       recovered, note())


def _client_answers(client) -> bool:
    try:
        return client.embed("warm up", timeout_s=5).error is None
    except TimeoutError:
        return False


def _http_answers(url: str) -> bool:
    request = urllib.request.Request(f"{url}/embed", data=b'{"inputs": "warm up"}', method="POST",
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status == 200
    except Exception:  # noqa: BLE001 - not answering yet
        return False


def print_rows(rows: list[FailoverRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kill -9 of the leader of most query and reply partitions ({TIMEOUT_S:g} s deadline)")
    for column in ("path", "node", "queries", "answered %", "in time %", "gap s", "p99 before ms", "recovery s",
                   "note"):
        table.add_column(column, justify="left" if column in ("path", "note") else "right")
    for row in rows:
        table.add_row(row.path, str(row.node), str(row.queries), f"{row.answered_pct:.1f}", f"{row.in_time_pct:.1f}",
                      f"{row.gap_s:.1f}", "-" if row.p99_before_ms is None else f"{row.p99_before_ms:.0f}",
                      "never" if row.recovery_s is None else f"{row.recovery_s:.1f}", row.note)
    Console(width=max(Console().width, 120)).print(table)
