"""Yield points: a packed pass runs urgent work between its layers and computes exactly what it would alone."""

from __future__ import annotations

import numpy as np
from conftest import make_engine

from embedstream.engine.engine import EmbedRequest, StageTimings
from embedstream.engine.yield_points import checkpoint, yielding_to


def test_a_checkpoint_outside_yielding_to_does_nothing_and_inside_calls_serve_once_per_point():
    calls = []
    checkpoint()
    with yielding_to(lambda: calls.append(1)):
        checkpoint()
        checkpoint()
    checkpoint()
    assert calls == [1, 1]


def test_serve_is_not_reentered_and_nested_blocks_restore_the_outer_serve():
    calls = []

    def serve():
        calls.append("outer")
        checkpoint()  # work run from serve is not interrupted in turn

    with yielding_to(serve):
        with yielding_to(lambda: calls.append("inner")):
            checkpoint()
        checkpoint()
    assert calls == ["inner", "outer"]


def test_a_bulk_pass_serves_a_query_between_its_layers_and_both_vectors_are_exact(tiny_bert_dir):
    engine = make_engine(tiny_bert_dir, engine={"threads": 1})
    assert engine.runner.path.startswith("packed-bert/cpu")
    docs = engine.prepare([EmbedRequest(i, f"document number {i} " * (3 + i), prompt="document") for i in range(6)])
    (query,) = engine.prepare([EmbedRequest("q", "what is a query", prompt="query")])
    bulk_alone = engine.forward(docs, StageTimings())
    query_alone = engine.forward([query], StageTimings())

    served = []

    def serve():
        if not served:  # the first checkpoint: the query that arrived meanwhile runs now
            served.append(engine.forward([query], StageTimings()))
        else:
            served.append(None)

    with yielding_to(serve):
        bulk = engine.forward(docs, StageTimings())
    layers = len(engine.runner.encoder.layers)
    assert len(served) >= layers  # at least one point per layer (here: after attention and after the MLP)
    np.testing.assert_allclose(served[0], query_alone, atol=1e-6)
    np.testing.assert_allclose(bulk, bulk_alone, atol=1e-6)
