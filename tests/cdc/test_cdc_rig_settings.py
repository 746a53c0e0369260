"""The dev PostgreSQL as the CDC rig runs it (embedstream/devcdc/postgres.py)."""

from __future__ import annotations

from embedstream.devcdc import postgres


def test_the_dev_cluster_commits_synchronously_for_logical_decoding(cdc_rig):
    """A logical walsender sends only flushed WAL: with synchronous_commit off a change reached Debezium only
    after the WAL writer's next round (wal_writer_delay, 200 ms). The settings come with the server's command
    line, so a cluster made by an older version (its postgresql.conf said off) gets them at its next start."""
    assert postgres.psql(cdc_rig.pg, "SHOW synchronous_commit").strip() == "on"
    assert postgres.psql(cdc_rig.pg, "SHOW wal_level").strip() == "logical"
