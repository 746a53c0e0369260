"""An embed worker on the OpenVINO backend: chunks indexed through the real broker with the packed path's
vectors; on both lanes it says at start that queries wait for whole bulk passes."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import isolated_settings, make_engine, memory_store, wait_for
from structlog.testing import capture_logs

from embedstream.engine.backends import openvino_encoder
from embedstream.engine.engine import EmbedRequest
from embedstream.producers.topics import ensure_topics
from embedstream.workers.runtime import build_embed_worker
from embedstream.workers.sink import point_id

from worker_rig import Running, publish_bulk_chunks

pytestmark = [pytest.mark.kafka,
              pytest.mark.skipif(openvino_encoder.missing() is not None, reason=f"{openvino_encoder.missing()}")]


def test_openvino_worker_indexes_what_the_packed_path_would_and_warns_on_shared_lanes(kafka_bootstrap, tiny_bert_dir):
    settings = isolated_settings(kafka_bootstrap, "openvino")
    ensure_topics(settings.kafka, partitions=1)
    store = memory_store()
    engine = make_engine(tiny_bert_dir, name="tiny-ov", engine={"backend": "openvino", "threads": 1})
    packed = make_engine(tiny_bert_dir, name="tiny-ov", engine={"backend": "packed"})
    settings.default_model = "tiny-ov"
    texts = [f"document {i} " + "about foxes and dogs " * (1 + i % 9) for i in range(30)]
    publish_bulk_chunks(settings, texts)
    with capture_logs() as logs:
        worker = build_embed_worker(settings, ("online", "bulk"), store=store, engine=engine)
    warnings = [e for e in logs if e["event"] == "online_waits_for_bulk_passes"]
    assert len(warnings) == 1 and warnings[0]["path"] == "openvino/cpu/float32"
    collection = settings.qdrant.collection
    with Running(worker):
        wait_for(lambda: store.collection_exists(collection) and store.count(collection) == len(texts), 120,
                 "all chunks indexed")
    points = {p.id: p for p in store.scroll(collection, with_vectors=True)}
    want, _ = packed.embed([EmbedRequest(i, t, prompt="document") for i, t in enumerate(texts)])
    for i, result in enumerate(want):
        stored = np.asarray(points[point_id(f"d{i}", 0)].vectors["full"], dtype=np.float32)
        assert float(np.dot(stored / np.linalg.norm(stored), result.full)) >= 0.9999
    with capture_logs() as logs:
        build_embed_worker(settings, ("bulk",), store=memory_store(), engine=engine).close()
    assert not [e for e in logs if e["event"] == "online_waits_for_bulk_passes"]  # bulk alone: nothing to wait
