"""`embedstream query --timeout 5` with no broker: the timeout bounds connecting too (it took 31 s and ended in a
traceback); the refusal is a CodedError the CLI prints as a one-line reason."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner
from worker_rig import free_port

from embedstream.cli import app
from embedstream.config import KafkaSettings
from embedstream.kafka_access import KafkaAccessError
from embedstream.producers.query_client import QueryClient


def test_no_broker_is_named_within_the_start_timeout():
    with pytest.raises(KafkaAccessError) as refused:
        QueryClient(KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"), start_timeout_s=2)
    assert refused.value.code == "kafka_unreachable"


def test_query_command_without_a_broker_exits_non_zero_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    result = CliRunner().invoke(app, ["query", "hello", "--timeout", "2"])
    assert result.exit_code != 0
    assert "kafka_unreachable" in result.output or isinstance(result.exception, KafkaAccessError)
