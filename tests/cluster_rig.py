"""The fleet tests' fixtures (tests/fleet/): one 3-broker KRaft cluster per session, on the ports
``ports.FLEET_CLUSTER`` gives (tests/ports.py) and a data dir of this run; ``healed``: every node up when a test
starts and ends."""

from __future__ import annotations

import shutil

import ports
import pytest

from embedstream import devkafka
from embedstream.bench.fleet_rig import ClusterControl
from embedstream.config import KafkaSettings


class Cluster:
    def __init__(self, port: int, data_dir: str, bootstrap: str):
        self.port, self.data_dir, self.bootstrap = port, data_dir, bootstrap
        self.control = ClusterControl(port, data_dir, KafkaSettings(bootstrap_servers=bootstrap))


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    if shutil.which("java") is None:
        pytest.skip("java not installed")
    port = ports.port(ports.FLEET_CLUSTER)
    data_dir = str(tmp_path_factory.mktemp("kafka-cluster"))
    info = devkafka.start(port=port, data_dir=data_dir, brokers=3)
    found = Cluster(port, data_dir, info.bootstrap)
    try:
        yield found
    finally:
        found.control.close()
        devkafka.stop(port=port, data_dir=data_dir)


@pytest.fixture
def healed(cluster):
    """Every node running when a test starts and when it ends (a test that killed one brings it back here)."""
    cluster.control.heal()
    yield
    cluster.control.heal()
