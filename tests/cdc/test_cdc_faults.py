"""Faults on the real rig while rows change: the bridge killed -9 and restarted (under its static member id),
Kafka Connect killed -9 and restarted, PostgreSQL restarted. The collection must end equal to the table:
nothing lost, nothing twice, no stale row."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from cdc_pipeline import Rig, expected_state
from conftest import read_dead_letters, wait_for
from process_rig import popen

from embedstream.devcdc import connect, postgres
from embedstream.producers.chunker import Chunker
from embedstream.producers.debezium import CdcConfig

CONFIG = CdcConfig("id", ("title", "body"), ("status",))
DDL = "CREATE TABLE {t} (id int PRIMARY KEY, title text, body text, status text)"
TOPICS = ["csv", "json", "pathlib", "sqlite3", "zipfile", "shutil", "argparse", "logging", "asyncio", "socket"]


def bridge_process(rig: Rig, instance_id: str) -> subprocess.Popen:
    """`embedstream worker cdc` as a user runs it, on the rig's topics and groups."""
    kafka = rig.settings.kafka
    env = {**os.environ, "EMBEDSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "EMBEDSTREAM_KAFKA__TOPIC_CHUNKS_ONLINE": kafka.topic_chunks_online,
           "EMBEDSTREAM_KAFKA__TOPIC_DEAD_LETTERS": kafka.topic_dead_letters,
           "EMBEDSTREAM_KAFKA__TOPIC_DOCUMENTS": kafka.topic_documents,
           "EMBEDSTREAM_KAFKA__GROUP_CDC": kafka.group_cdc}
    cmd = [str(Path(sys.executable).parent / "embedstream"), "worker", "cdc", "--topic", rig.topic, "--id-field", "id",
           "--text-fields", "title,body", "--metadata-fields", "status", "--chunk-tokens", "64", "--overlap", "0",
           "--metrics-port", "0", "--instance-id", instance_id]
    return popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)


class Writer(threading.Thread):
    """Changes rows until stopped: inserts, body and status updates, deletes; retries through a database restart."""

    def __init__(self, table):
        super().__init__(daemon=True)
        self.table, self.stop, self.done, self.errors = table, threading.Event(), 0, 0

    def run(self) -> None:
        rnd = random.Random(7)
        while not self.stop.is_set():
            i = rnd.randint(1, 40)
            topic = rnd.choice(TOPICS)
            statement, params = rnd.choice([
                ("INSERT INTO {t} VALUES (%s, %s, %s, 'new') ON CONFLICT (id) DO UPDATE SET body = excluded.body",
                 (i, f"Guide {i}", f"Guide {i} explains {topic}: how it reads input and what errors it raises.")),
                ("UPDATE {t} SET status = %s WHERE id = %s", (rnd.choice(["draft", "published", "archived"]), i)),
                ("UPDATE {t} SET body = body || %s WHERE id = %s", (f" Also {topic}.", i)),
                ("DELETE FROM {t} WHERE id = %s", (i,)),
            ])
            try:
                self.table.sql(statement, params)
                self.done += 1
            except psycopg.OperationalError:  # the database is restarting
                self.errors += 1
                time.sleep(0.2)
            time.sleep(0.02)


@pytest.mark.timeout(600)
def test_faults_mid_stream_end_as_the_table(kafka_bootstrap, cdc_rig, cdc_table, minilm_engine):
    chunker = Chunker(minilm_engine.tokenizer.tokenizer, minilm_engine.spec.max_tokens, chunk_tokens=64, overlap_tokens=0)
    table = cdc_table(DDL)
    rig = Rig(kafka_bootstrap, minilm_engine, "faults", CONFIG, chunker, topic=table.topic, partitions=1,
              meta_keys=("status",), bridge=False)
    instance = f"bridge-{table.name}"
    bridge = bridge_process(rig, instance)
    writer = Writer(table)
    try:
        with rig:
            writer.start()
            wait_for(lambda: writer.done > 60, 60, "the first changes")
            # 1. the bridge killed -9 mid-stream, started again under the same static member id
            os.killpg(bridge.pid, signal.SIGKILL)
            bridge.wait(30)
            bridge = bridge_process(rig, instance)
            wait_for(lambda: writer.done > 120, 60, "more changes")
            # 2. Kafka Connect killed -9 mid-stream, started again (connectors resume from their stored offsets)
            os.killpg(cdc_rig.connect.pid, signal.SIGKILL)
            time.sleep(1)
            cdc_rig.connect = connect.start(cdc_rig.bootstrap, cdc_rig.connect.rest_port, cdc_rig.connect.data_dir)
            wait_for(lambda: writer.done > 180, 60, "more changes")
            # 3. PostgreSQL restarted mid-stream (the connector reconnects; its slot kept the changes)
            postgres.stop(cdc_rig.pg.port, cdc_rig.pg.data_dir)
            cdc_rig.pg = postgres.start(cdc_rig.pg.port, cdc_rig.pg.data_dir)
            wait_for(lambda: writer.done > 240, 90, "changes after the database restart")
            writer.stop.set()
            writer.join(30)

            def expected():
                rows = {str(r["id"]): r for r in table.rows()}
                return expected_state(rows, chunker, ("title", "body"), lambda r: {"status": r["status"]})

            connect.wait_running(cdc_rig.connect, table.connector)
            final = rig.reaches(expected(), timeout_s=180)
    finally:
        writer.stop.set()
        os.killpg(bridge.pid, signal.SIGTERM)
        bridge.wait(60)
    assert final == expected()
    assert len({doc for doc, _, _, _ in final.values()}) == len(table.rows()) > 5
    assert not read_dead_letters(rig.settings, 1, timeout_s=2)
