"""The CDC rig for the tests in tests/cdc/: one PostgreSQL cluster and one Kafka Connect worker (Debezium's
PostgreSQL connector) per session, on the session's broker; each test gets its own table and connector."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import ports
import pytest

from embedstream.devcdc import connect, postgres


def _port(env: str, offset: int) -> int:
    """EMBEDSTREAM_TEST_PG_PORT / _CONNECT_PORT, else the run's port table (tests/ports.py)."""
    return int(os.environ.get(env) or ports.port(offset))


@dataclass
class CdcTable:
    """One table of the rig's database with its own Debezium connector (slot, publication, topic)."""

    rig: "CdcRig"
    name: str
    connector: str
    topic: str
    config: dict = field(default_factory=dict)

    def sql(self, statement: str, params=None) -> None:
        import psycopg

        with psycopg.connect(self.rig.pg.dsn, autocommit=True) as conn:
            conn.execute(statement.replace("{t}", self.name), params)

    def rows(self, columns: str = "*") -> list[dict]:
        import psycopg
        import psycopg.rows

        with psycopg.connect(self.rig.pg.dsn, autocommit=True) as conn:
            cur = conn.cursor(row_factory=psycopg.rows.dict_row)
            return cur.execute(f"SELECT {columns} FROM {self.name}").fetchall()


@dataclass
class CdcRig:
    bootstrap: str
    pg: postgres.PostgresInfo
    connect: connect.ConnectInfo
    tables: list = field(default_factory=list)

    def table(self, ddl: str, *, flatten: bool = False, schemas: bool = False, extra: dict | None = None,
              before_connector: list[str] = (), include: list[str] = ()) -> CdcTable:
        """Create a table (``ddl`` with ``{t}`` for its name), run ``before_connector`` statements (the
        snapshot sees them), then register a connector for it (``extra`` settings: ``{topic}`` stands for
        its change topic; ``include``: more tables it captures); returns once the connector runs."""
        suffix = uuid.uuid4().hex[:8]
        handle = CdcTable(self, f"t_{suffix}", f"cdc_{suffix}", "")
        handle.sql(ddl)
        for statement in before_connector:
            handle.sql(statement)
        handle.config = connect.debezium_config(self.pg, f"public.{handle.name}", f"cdc{suffix}", flatten=flatten,
                                                schemas=schemas)
        handle.topic = connect.topic_for(handle.config)
        handle.config |= {k: v.replace("{topic}", handle.topic) for k, v in (extra or {}).items()}
        if include:  # more tables for the same connector (e.g. its signal table)
            handle.config["table.include.list"] = ",".join([handle.config["table.include.list"], *include])
        connect.register(self.connect, handle.connector, handle.config)
        self.tables.append(handle)
        return handle

    def drop(self, table: CdcTable) -> None:
        """Unregister the table's connector and drop its slot, so slots do not pile up within the session."""
        import psycopg

        connect.unregister(self.connect, table.connector)
        slot = table.config["slot.name"]
        for _ in range(50):
            try:
                table.sql(f"SELECT pg_drop_replication_slot('{slot}') FROM pg_replication_slots "
                          f"WHERE slot_name = '{slot}'")
                return
            except psycopg.errors.ObjectInUse:  # the task is still stopping
                time.sleep(0.2)


@pytest.fixture(scope="session")
def cdc_rig(kafka_bootstrap, tmp_path_factory):
    # PostgreSQL runs as the 'postgres' user when the tests run as root: its folder must be reachable.
    pg_dir = Path(tempfile.mkdtemp(prefix="embedstream-test-pg-"))
    pg_dir.chmod(0o755)
    pg_port, rest_port = _port("EMBEDSTREAM_TEST_PG_PORT", ports.POSTGRES), _port("EMBEDSTREAM_TEST_CONNECT_PORT", ports.CONNECT)
    connect_dir = tmp_path_factory.mktemp("connect-data")
    pg = postgres.start(pg_port, pg_dir / "pg")
    try:
        info = connect.start(kafka_bootstrap, rest_port, connect_dir)
        try:
            yield CdcRig(kafka_bootstrap, pg, info)
        finally:
            connect.stop(rest_port, connect_dir)
    finally:
        postgres.stop(pg_port, pg_dir / "pg", mode="immediate")
        shutil.rmtree(pg_dir, ignore_errors=True)


@pytest.fixture
def cdc_table(cdc_rig):
    """A factory of tables with connectors; each one's connector and slot go at the end of the test."""
    made: list[CdcTable] = []

    def make(ddl: str, **kwargs) -> CdcTable:
        made.append(cdc_rig.table(ddl, **kwargs))
        return made[-1]

    yield make
    for table in made:
        cdc_rig.drop(table)
