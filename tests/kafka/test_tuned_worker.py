"""A worker on precision tuned starts from this host's cached measurements (seconds, no measuring), logs the
path that won with its speed, quality and runner-up, and indexes through the real broker on that path."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tiny_models
from conftest import isolated_settings, make_engine, memory_store, wait_for
from structlog.testing import capture_logs

from embedstream.config import ModelConfig
from embedstream.engine import tuner
from embedstream.engine.engine import EmbedRequest
from embedstream.producers.topics import ensure_topics
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.sink import point_id

from worker_rig import Running, publish_bulk_chunks

pytestmark = pytest.mark.kafka
ENGINE = {"precision": "tuned", "backend": "packed", "threads": 1}


def test_a_worker_starts_on_the_cached_choice_within_seconds_and_logs_it(kafka_bootstrap, tmp_path):
    folder = tiny_models.build_tiny_bert(tmp_path / "tiny-tuned", pooling="mean")
    first = make_engine(folder, name="tiny-tuned", engine=ENGINE)  # the first start on this host measures
    measured = tuner.tunings_run
    settings = isolated_settings(kafka_bootstrap, "tuned")
    settings.models["tiny-tuned"] = ModelConfig(path=str(folder))
    settings.default_model = "tiny-tuned"
    for key, value in ENGINE.items():
        setattr(settings.engine, key, value)
    ensure_topics(settings.kafka, partitions=1)
    store = memory_store()
    with capture_logs() as logs:
        start = time.perf_counter()
        worker = build_embed_worker(settings, ("bulk",), store=store)
        seconds = time.perf_counter() - start
    assert tuner.tunings_run == measured  # read from the cache, not measured again
    assert seconds <= 10, f"a start with a cached choice took {seconds:.1f} s"
    chosen = [e for e in logs if e["event"] == "engine_path_chosen"]
    assert len(chosen) == 1
    entry = chosen[0]
    assert entry["shape"] == "bulk" and entry["floor"] == "recall@10>=0.98"
    assert entry["chosen"]["path"] == first.runner.choice.winner.path.label
    assert {"tok_s", "query_ms", "recall_at_10", "min_cos"} <= set(entry["chosen"])
    assert "runner_up" in entry and entry["path"] == worker.engine.runner.path

    texts = [f"document {i} " + "about foxes and dogs " * (1 + i % 7) for i in range(20)]
    publish_bulk_chunks(settings, texts)
    collection = settings.qdrant.collection
    with capture_logs() as logs, Running(worker):
        wait_for(lambda: store.collection_exists(collection) and store.count(collection) == len(texts), 120,
                 "all chunks indexed")
    started = [e for e in logs if e["event"].endswith("started")]
    assert started and "tuned for bulk at recall@10>=0.98" in started[0]["path"]
    want, _ = first.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)])
    points = {p.id: p for p in store.scroll(collection, with_vectors=True)}
    for i, result in enumerate(want):  # the worker ran the path the first start chose
        stored = np.asarray(points[point_id(f"d{i}", 0)].vectors["full"], dtype=np.float32)
        assert float(np.dot(stored / np.linalg.norm(stored), result.full)) >= 0.9999
