"""The CDC rig's latency settings (embedstream/devcdc/connect.py) are the compose connector's too."""

from __future__ import annotations

import json
from pathlib import Path

from embedstream.devcdc import connect
from embedstream.devcdc.postgres import PostgresInfo

ROOT = Path(__file__).resolve().parents[2]


def test_the_compose_connector_waits_and_lingers_as_the_dev_rig_does(tmp_path):
    compose = json.loads((ROOT / "compose" / "cdc" / "connector.json").read_text())
    rig = connect.debezium_config(PostgresInfo(5432, 0, tmp_path), "public.articles", "cdc")
    worker = dict(line.split("=", 1) for line in connect.worker_properties("127.0.0.1:9092", 8083, tmp_path).splitlines()
                  if "=" in line and not line.startswith("#"))
    assert compose["poll.interval.ms"] == rig["poll.interval.ms"] == connect.POLL_INTERVAL_MS
    # the compose worker's own settings are the image's: the connector overrides its producer's linger
    assert compose["producer.override.linger.ms"] == worker["producer.linger.ms"] == connect.PRODUCER_LINGER_MS
