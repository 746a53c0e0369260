"""Every port a test run uses, in one table: offsets above ``EMBEDSTREAM_TEST_KAFKA_PORT`` (default 19092), so
parallel runs on one host (each with its own base) keep apart and no two parts of one run collide."""

from __future__ import annotations

import os

BASE = int(os.environ.get("EMBEDSTREAM_TEST_KAFKA_PORT", "19092"))

# offset: what listens there
SHARED_BROKER = 0  # the session's broker (tests/conftest.py)
DEVKAFKA = 2  # test_devkafka's own brokers (+2, +3)
SECURED_BROKER = 4  # test_security's SASL_SSL broker and its controller
POSTGRES = 100  # the CDC rig (tests/cdc_rig.py)
CONNECT = 200  # the CDC rig's Kafka Connect REST port
HYBRID_CLI = 300  # test_hybrid_cli's broker and services (+300..+399)
QUICK_STARTS = 400  # test_quick_starts' broker and services (+400..+499)
COMMAND_CLEANUP = 500  # test_command_cleanup's broker (+500..+599)
GATEWAYS = 600  # gateways of the test stacks (+600..+699, tests/gateway_rig.py)
FAILING_ENDPOINTS = 700  # failing Qdrant endpoints (+700..+799, tests/failing_endpoints.py)
FLEET_CLUSTER = 800  # the fleet tests' 3-broker cluster: brokers +800, +802, +804, controllers one above each
FLEET_LATE_CLUSTER = 810  # test_replication's own cluster, one node started late: +810, +812, +814 (controllers +1)
FLEET_WORKERS = 850  # metrics ports of the fleet tests' worker processes (+850..+899)
BOUND_TO_OWNER = 900  # test_bound_to_owner's runner: its broker +900 (+901) and PostgreSQL +902
RESTART_BROKER = 910  # slow/test_faults' broker that gets restarted (+910..+949, a free pair)
QDRANT_SERVER = 960  # Qdrant servers of tests/qdrant_rig.py: HTTP +960/+962, gRPC +961/+963 (the store contract tests run two)
TWO_DEPLOYMENTS = 964  # test_two_deployments_qdrant's two workers' metrics (+964, +965)


def port(offset: int) -> int:
    return BASE + offset
