"""Every command that starts a broker stops it, and everything else it started, however it ends (issue #29).

`bench latency --port P` and `bench pipeline --port P` left the dev broker's JVM (512 MB heap) running.
Each command runs here on a port where no broker runs, at its smallest size, as its own process; after it
returns, no process it started is left (``process_rig.leftovers``: the marker in their environment).
"""

from __future__ import annotations


import pytest
import ports
from process_rig import command_env, leftovers, run

pytestmark = pytest.mark.kafka

PORT = ports.port(ports.COMMAND_CLEANUP)

COMMANDS = {
    "bench transport": ["bench", "transport", "--count", "3"],
    "bench pipeline": ["bench", "pipeline", "--docs", "3", "--queries", "3", "--warmup", "2", "--rounds", "1"],
    "bench latency": ["bench", "latency", "--rate", "5", "--policy", "aimd", "--step-s", "1", "--max-requests", "5",
                      "--no-backlog", "--no-rerank"],
    "bench gateway": ["bench", "gateway", "--requests", "3", "--concurrency", "1", "--soak-s", "0", "--warmup", "2"],
    "demo": ["demo", "--docs", "3"],
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_leaves_no_process_it_started(name, tmp_path):
    env = command_env(tmp_path)
    args = [*COMMANDS[name], "--port", str(PORT)]
    if name == "bench latency":
        args += ["--out", str(tmp_path / "out")]
    done = run(args, env, timeout_s=800, check=False)
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert leftovers(env["EMBEDSTREAM_TEST_MARK"]) == [], f"{name} left processes running"
