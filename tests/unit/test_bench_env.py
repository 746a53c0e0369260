"""The benches' worker processes must trust the reply topics the benches' own clients use."""

from __future__ import annotations

from embedstream.bench.pipeline_bench import _env
from embedstream.config import KafkaSettings, Settings
from embedstream.workers.trust import TrustPolicy, reply_to_refusal


def test_bench_workers_accept_the_bench_reply_topics(monkeypatch):
    prefix = "benchgw-abc123"
    settings = Settings(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1", topic_replies=f"{prefix}.replies",
                                            topic_queries=f"{prefix}.queries"))
    env = _env(settings, prefix, None, "bench", 1)
    for key, value in env.items():
        if key.startswith("EMBEDSTREAM_"):
            monkeypatch.setenv(key, value)
    worker_policy = TrustPolicy.from_settings(Settings())  # what the worker process reads from its environment
    assert reply_to_refusal(f"{prefix}.replies", worker_policy) is None
    assert reply_to_refusal(f"{prefix}.replies-gateway", worker_policy) is None
    assert reply_to_refusal("someone-else.replies", worker_policy) is not None
