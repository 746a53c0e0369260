"""One line per test run, read from the progress logs ``tests/run_rig.py`` writes: how long, at what load.

    python tests/run_summary.py /tmp/embedstream-test-run-19092/progress-*.log

Prints a table: tests started, wall-clock minutes (first start to last end), the load average's median
and range over the run's lines, the tests that failed (any phase), and the minutes spent per folder
(``unit``, ``kafka``, ``cdc``, ``fleet``, ``slow``: the sum of the tests' own times). A run that died
shows the test it was in.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

FOLDERS = ("unit", "kafka", "cdc", "fleet", "slow")


@dataclass
class Run:
    name: str
    started: int = 0
    seconds: list[int] = field(default_factory=list)  # clock of every line, seconds since midnight
    loads: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    per_folder: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    running: str | None = None

    @property
    def wall_min(self) -> float:
        if len(self.seconds) < 2:
            return 0.0
        span = self.seconds[-1] - self.seconds[0]
        return (span + 86_400 if span < 0 else span) / 60  # a run past midnight


def _clock(text: str) -> int:
    h, m, s = (int(part) for part in text.split(":"))
    return h * 3600 + m * 60 + s


def read(path: Path) -> Run:
    run = Run(path.name)
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) < 5 or parts[1] != "load":
            continue
        run.seconds.append(_clock(parts[0]))
        run.loads.append(float(parts[2]))
        kind, nodeid = parts[3], parts[4]
        if kind == "start":
            run.started += 1
            run.running = nodeid
        elif kind == "end":
            run.running = None
            outcomes, took = parts[5:-1], parts[-1]
            if any(o.endswith(":failed") for o in outcomes):
                run.failed.append(nodeid)
            folder = nodeid.removeprefix("tests/").split("/")[0]
            run.per_folder[folder if folder in FOLDERS else "other"] += float(took.rstrip("s"))
    return run


def table(runs: list[Run]) -> str:
    head = ["run", "tests", "wall min", "load median", "load range", "failed"] + [f"{f} min" for f in FOLDERS]
    rows = [head, ["---"] * len(head)]
    for run in runs:
        loads = run.loads or [0.0]
        failed = str(len(run.failed)) + (f" (unfinished: {run.running})" if run.running else "")
        rows.append([run.name, str(run.started), f"{run.wall_min:.1f}", f"{statistics.median(loads):.1f}",
                     f"{min(loads):.1f}-{max(loads):.1f}", failed]
                    + [f"{run.per_folder.get(f, 0.0) / 60:.1f}" for f in FOLDERS])
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    for run in runs:
        lines += [f"{run.name} failed: {nodeid}" for nodeid in run.failed]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print(table([read(Path(p)) for p in argv]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
