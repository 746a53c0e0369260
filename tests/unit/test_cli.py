"""The command line by group: every group lists its commands and every command's --help works.

--help must not load a model or a store: it is what people type first, and what CI runs.
"""

from __future__ import annotations

import subprocess
import sys

import click
import pytest
import typer
from typer.testing import CliRunner

from embedstream.cli import app

GROUPS = {
    (): {"embed", "score", "engine", "produce", "query", "search", "reindex", "demo", "worker", "gateway", "bench",
         "plan", "dev", "schemas"},
    ("engine",): {"tune"},
    ("worker",): {"embed", "rerank", "cdc"},
    ("bench",): {"engine", "pipeline", "stall", "rerank", "quality", "gateway", "latency", "host", "transport", "cdc",
                 "cdc-settings", "fleet", "lookup", "fusion", "exact"},
    ("dev",): {"kafka", "postgres", "connect", "compose", "images"},
    ("dev", "compose"): {"up", "down", "env", "status"},
    ("dev", "images"): {"build", "list"},
    ("dev", "kafka"): {"start", "restart", "stop", "status"},
    ("dev", "postgres"): {"start", "stop", "status"},
    ("dev", "connect"): {"start", "stop", "status"},
    ("schemas",): {"export"},
}

ROOT = typer.main.get_command(app)


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "200"})


def _visible_commands(path: tuple[str, ...]) -> set[str]:
    group = ROOT
    for name in path:
        group = group.commands[name]
    return {name for name, command in group.commands.items() if not command.hidden}


def _every_command_path(group: click.Group, prefix: tuple[str, ...] = ()):
    for name, command in group.commands.items():
        yield prefix + (name,)
        if isinstance(command, click.Group):
            yield from _every_command_path(command, prefix + (name,))


@pytest.mark.parametrize("path", sorted(GROUPS), ids=lambda p: " ".join(p) or "embedstream")
def test_each_group_lists_its_commands(path):
    assert _visible_commands(path) == GROUPS[path]
    result = _invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    for name in GROUPS[path]:
        assert name in result.output


def test_cdc_bridge_lives_in_the_worker_group_and_the_old_spelling_is_hidden():
    assert "cdc" not in _visible_commands(())
    old, new = ROOT.commands["cdc"], ROOT.commands["worker"].commands["cdc"]
    assert [p.name for p in old.params] == [p.name for p in new.params] and old.help == new.help
    assert _invoke("cdc", "--help").exit_code == 0


@pytest.mark.parametrize("path", sorted(_every_command_path(ROOT)), ids=" ".join)
def test_every_command_help_exits_0(path):
    result = _invoke(*path, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_a_group_without_a_command_shows_its_help_instead_of_running():
    result = _invoke("worker")
    assert result.exit_code != 0 and "embed" in result.output and "rerank" in result.output


def test_help_loads_no_model_or_store():
    code = ("import sys; from embedstream.cli import app; "
            "heavy = [m for m in ('torch', 'transformers', 'qdrant_client', 'qdrant_edge') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_plan_is_wired_and_reports_bad_input_with_exit_2():
    ok = _invoke("plan", "--chunks", "10000000", "--tokens", "256", "--tokens-per-s", "8000", "--devices", "8")
    assert ok.exit_code == 0 and "88.9 h on 1 device, 11.1 h on 8 devices" in ok.output
    bad = _invoke("plan", "--chunks", "10")
    assert bad.exit_code == 2 and "--tokens" in bad.output


def test_a_coded_error_ends_the_command_as_one_line_and_exit_2():
    result = subprocess.run([sys.executable, "-m", "embedstream.cli", "embed", "--model", "no-such-model-anywhere"],
                            input='{"id": 1, "text": "hi"}\n', capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: unknown model 'no-such-model-anywhere'")
    assert "(unknown_model)" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def built_workers(monkeypatch):
    """Run the worker commands up to the point where a worker would start; record what they were built from."""
    from types import SimpleNamespace

    from embedstream.workers import claim, runtime, serve, vector_search

    built: list[dict] = []
    # the claim on the collection is asked of the broker before the model loads: recorded here, no broker
    monkeypatch.setattr(claim.CollectionClaim, "check", lambda self, **kw: built.append({"claim": self.collection}))

    def embed_worker(settings, lanes, model=None):
        built.append({"settings": settings, "lanes": lanes})
        return SimpleNamespace(sink=SimpleNamespace(store=None), engine=SimpleNamespace(spec=SimpleNamespace(name="m")),
                               metrics=None)

    monkeypatch.setattr(runtime, "build_embed_worker", embed_worker)
    monkeypatch.setattr(vector_search, "VectorSearchWorker", lambda *args: built.append({"search": args}))
    monkeypatch.setattr(runtime, "build_rerank_worker",
                        lambda settings, model, embed_model=None, **kw: built.append({"settings": settings, **kw}))
    monkeypatch.setattr(serve, "run_until_signalled", lambda worker, metrics_port, **kw: None)
    return built


@pytest.mark.parametrize("flag, env, expected", [
    ([], "false", False),  # the environment's knob is kept when the flag is not given
    (["--skip-unchanged"], "false", True),
    (["--no-skip-unchanged"], "true", False),
])
def test_worker_embed_flags_override_the_worker_settings_only_when_given(built_workers, flag, env, expected):
    result = CliRunner().invoke(app, ["worker", "embed", "--lanes", "bulk", "--metrics-port", "0", *flag],
                                env={"EMBEDSTREAM_WORKER__SKIP_UNCHANGED": env})
    assert result.exit_code == 0, result.output
    assert built_workers[1]["lanes"] == ("bulk",)
    assert built_workers[1]["settings"].worker.skip_unchanged is expected
    assert "search" in built_workers[-1]  # and its search lane, on the store it writes
    assert {"claim": "docs"} in built_workers  # one owner per collection: checked before the worker is built


@pytest.mark.parametrize("flag, expected", [([], 20), (["--max-candidates", "7"], 7)])
def test_worker_rerank_max_candidates_flag_overrides_the_environment(built_workers, flag, expected):
    result = CliRunner().invoke(app, ["worker", "rerank", "--model", "m", "--metrics-port", "0", *flag],
                                env={"EMBEDSTREAM_WORKER__MAX_CANDIDATES": "20"})
    assert result.exit_code == 0, result.output
    assert built_workers[-1]["settings"].worker.max_candidates == expected
