"""Every worker knob is settable from EMBEDSTREAM_WORKER__*, one name each, and reaches the worker options."""

from __future__ import annotations

import socket

import pytest

from embedstream.config import Settings, WorkerSettings
from embedstream.workers.embed_worker import WorkerOptions
from embedstream.workers.rerank_worker import RerankOptions

ENV = {
    "EMBEDSTREAM_WORKER__BATCH_WINDOW_MS": "7.5",
    "EMBEDSTREAM_WORKER__BULK_SLICE_TOKENS": "512",
    "EMBEDSTREAM_WORKER__ONLINE_QUIET_S": "0.25",
    "EMBEDSTREAM_WORKER__MAX_QUEUE_TOKENS": "4096",
    "EMBEDSTREAM_WORKER__MAX_QUEUE_REQUESTS": "32",
    "EMBEDSTREAM_WORKER__COMMIT_INTERVAL_S": "1.5",
    "EMBEDSTREAM_WORKER__FLUSH_TIMEOUT_S": "12",
    "EMBEDSTREAM_WORKER__SINK_BACKOFF_S": "[0.5, 4]",
    "EMBEDSTREAM_WORKER__RECORD_RETRY_LIMIT_S": "60",
    "EMBEDSTREAM_WORKER__SKIP_UNCHANGED": "false",
    "EMBEDSTREAM_WORKER__WARM_UP_TOKENS": "0",
    "EMBEDSTREAM_WORKER__MAX_CANDIDATES": "20",
    "EMBEDSTREAM_WORKER__MAX_PAIRS_PER_PASS": "128",
    "EMBEDSTREAM_WORKER__HEALTH_HOST": "0.0.0.0",
    "EMBEDSTREAM_WORKER__STALL_TIMEOUT_S": "90",
    "EMBEDSTREAM_WORKER__ACCESS_CHECK_TIMEOUT_S": "5",
    "EMBEDSTREAM_WORKER__LATENCY_TARGET_MS": "25",
    "EMBEDSTREAM_WORKER__RERANK_LATENCY_TARGET_MS": "250",
    "EMBEDSTREAM_WORKER__ADMISSION_POLICY": "deadline",
    "EMBEDSTREAM_WORKER__MAX_WINDOW_MS": "6",
    "EMBEDSTREAM_WORKER__DEFAULT_DEADLINE_MS": "3000",
    "EMBEDSTREAM_WORKER__MAX_REQUEST_AGE_MS": "30000",
    "EMBEDSTREAM_WORKER__REPLY_ALLOWANCE_MS": "1.5",
    "EMBEDSTREAM_WORKER__SHED_PREDICTED": "false",
    "EMBEDSTREAM_WORKER__GIL_SWITCH_INTERVAL_MS": "2",
}
EXPECTED = {
    "batch_window_ms": 7.5, "bulk_slice_tokens": 512, "online_quiet_s": 0.25, "max_queue_tokens": 4096,
    "max_queue_requests": 32, "commit_interval_s": 1.5, "flush_timeout_s": 12.0, "sink_backoff_s": (0.5, 4.0),
    "record_retry_limit_s": 60.0, "skip_unchanged": False, "warm_up_tokens": 0, "max_candidates": 20,
    "max_pairs_per_pass": 128, "health_host": "0.0.0.0", "stall_timeout_s": 90.0,
    "access_check_timeout_s": 5.0, "latency_target_ms": 25.0, "rerank_latency_target_ms": 250.0,
    "admission_policy": "deadline", "max_window_ms": 6.0, "default_deadline_ms": 3000.0, "max_request_age_ms": 30000.0,
    "reply_allowance_ms": 1.5, "shed_predicted": False, "gil_switch_interval_ms": 2.0,
}


@pytest.fixture
def worker_env(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .env file of the checkout
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)


def test_every_worker_setting_has_an_environment_variable():
    assert {f"EMBEDSTREAM_WORKER__{name.upper()}" for name in WorkerSettings.model_fields} == set(ENV)


def test_environment_reaches_embed_and_rerank_options(worker_env):
    settings = Settings()
    embed = WorkerOptions.from_settings(settings, ("bulk",))
    rerank = RerankOptions.from_settings(settings, max_candidates=5)
    for name, value in EXPECTED.items():
        assert getattr(settings.worker, name) == value, name
        assert getattr(embed, name) == value, name
    assert embed.lanes == ("bulk",)
    assert rerank.batch_window_ms == 7.5 and rerank.max_queue_requests == 32
    assert rerank.max_candidates == 5  # a CLI flag still overrides the environment
    assert rerank.default_collection == settings.qdrant.collection


def test_defaults_match_the_measured_behaviour(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    options = WorkerOptions()
    assert (options.batch_window_ms, options.bulk_slice_tokens, options.online_quiet_s) == (2.0, 512, 1.0)
    assert options.warm_up_tokens == 64 and options.skip_unchanged and options.lanes == ("online", "bulk")
    assert options.gil_switch_interval_ms == 0.5


@pytest.mark.parametrize("name, value", [("BULK_SLICE_TOKENS", "0"), ("ONLINE_QUIET_S", "-1"), ("GIL_SWITCH_INTERVAL_MS", "0"),
                                         ("SINK_BACKOFF_S", "[5, 1]"), ("SINK_BACKOFF_S", "[0, 1]")])
def test_an_impossible_knob_is_refused(monkeypatch, tmp_path, name, value):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(f"EMBEDSTREAM_WORKER__{name}", value)
    with pytest.raises(ValueError, match=name.lower()):
        Settings()


def test_fleet_settings_from_the_environment(monkeypatch, tmp_path):
    """Trust allow-lists, static membership and Qdrant cluster options are EMBEDSTREAM_* settings too."""
    monkeypatch.chdir(tmp_path)
    assert Settings().kafka.instance_id() is None and Settings().qdrant.cluster_options() == {}
    assert Settings().worker.health_host == "127.0.0.1"  # outside containers: not on every interface
    monkeypatch.setenv("EMBEDSTREAM_TRUST__COLLECTIONS", '["docs_next"]')
    monkeypatch.setenv("EMBEDSTREAM_TRUST__REPLY_TOPIC_PREFIXES", '["gw."]')
    monkeypatch.setenv("EMBEDSTREAM_KAFKA__STATIC_MEMBERSHIP", "true")
    monkeypatch.setenv("EMBEDSTREAM_QDRANT__SHARD_NUMBER", "6")
    monkeypatch.setenv("EMBEDSTREAM_QDRANT__REPLICATION_FACTOR", "2")
    settings = Settings()
    assert settings.trust.collections == ["docs_next"] and settings.trust.reply_topic_prefixes == ["gw."]
    assert settings.kafka.instance_id() == socket.gethostname()
    assert settings.qdrant.cluster_options() == {"shard_number": 6, "replication_factor": 2}
    monkeypatch.setenv("EMBEDSTREAM_KAFKA__GROUP_INSTANCE_ID", "embed-0")
    assert Settings().kafka.instance_id() == "embed-0"


def test_cluster_options_reach_the_collections_the_workers_create(monkeypatch, tmp_path):
    from embedstream.vectorstore.base import VectorSpec
    from embedstream.workers.runtime import open_settings_store

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EMBEDSTREAM_QDRANT__URL", ":memory:")
    monkeypatch.setenv("EMBEDSTREAM_QDRANT__SHARD_NUMBER", "3")
    monkeypatch.setenv("EMBEDSTREAM_QDRANT__REPLICATION_FACTOR", "2")
    monkeypatch.setenv("EMBEDSTREAM_QDRANT__WRITE_CONSISTENCY_FACTOR", "2")
    store = open_settings_store(Settings())
    sent = {}
    create = store.client.create_collection
    monkeypatch.setattr(store.client, "create_collection", lambda **kw: sent.update(kw) or create(**kw))
    assert store.ensure_collection("docs_v1", {"full": VectorSpec(4)})
    assert {k: sent[k] for k in ("shard_number", "replication_factor", "write_consistency_factor")} == \
        {"shard_number": 3, "replication_factor": 2, "write_consistency_factor": 2}


def test_a_worker_process_runs_with_the_configured_switch_interval():
    import signal
    import sys
    from types import SimpleNamespace

    from embedstream.workers.serve import run_until_signalled

    before = sys.getswitchinterval()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    seen: list[float] = []
    worker = SimpleNamespace(name="stub", failure=None, stop=lambda: None,
                             tuning=WorkerSettings(gil_switch_interval_ms=0.7),
                             run=lambda: seen.append(sys.getswitchinterval()))
    try:
        run_until_signalled(worker, metrics_port=None)
    finally:
        sys.setswitchinterval(before)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert seen == [pytest.approx(0.0007)]
