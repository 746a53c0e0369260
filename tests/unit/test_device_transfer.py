"""Host -> device staging (transfer.py): the identity on CPU (nothing pinned, nothing copied), the
staging API end to end through the runner, the one-ahead order that lets a copy overlap a forward;
on a CUDA machine also pinned packing, the side-stream copy and the same vectors as on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import make_engine

from embedstream.engine.engine import EmbedRequest
from embedstream.engine.packed import pack_sequences
from embedstream.engine.runner import ForwardTimings
from embedstream.engine.tokenize import Tokenized
from embedstream.engine.transfer import DeviceFeeder, StagedBatch, staged_ahead

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
TEXTS = ["a short one", "a somewhat longer text about packed batches", "mid length text", "b", "a short two"]


@pytest.fixture(scope="module")
def cpu_engine(tiny_bert_dir):
    return make_engine(tiny_bert_dir, pooling="mean", engine={"device": "cpu"})


def _batch(engine, texts=TEXTS):
    return engine.runner.pack([p.tokens for p in engine.prepare([EmbedRequest(i, t) for i, t in enumerate(texts)])])


def test_on_cpu_nothing_is_pinned_or_copied(cpu_engine):
    feeder = DeviceFeeder(torch.device("cpu"))
    batch = _batch(cpu_engine)
    assert not feeder.pins_memory and not cpu_engine.runner.feeder.pins_memory
    assert not any(t.is_pinned() for t in batch.tensors())
    staged = feeder.stage(batch)
    assert staged.batch is batch and staged.ready is None
    assert feeder.wait(staged) is batch
    vectors = torch.ones(3, 4)
    assert feeder.to_host(vectors) is vectors


def test_runner_pack_on_cpu_is_plain_pack_sequences(cpu_engine):
    items = [Tokenized(ids=[5] * n, type_ids=[0] * n) for n in (4, 2, 4)]
    ours, plain = cpu_engine.runner.pack(items), pack_sequences(items)
    for a, b in zip(ours.tensors(), plain.tensors()):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert (ours.lengths, ours.groups, ours.order) == (plain.lengths, plain.groups, plain.order)


def test_staged_and_plain_batches_give_the_same_vectors(cpu_engine):
    runner = cpu_engine.runner
    plain_timings, staged_timings = ForwardTimings(), ForwardTimings()
    plain = runner.embed(_batch(cpu_engine), plain_timings)
    staged = runner.stage(_batch(cpu_engine))
    assert isinstance(staged, StagedBatch)
    via_stage = runner.embed(staged, staged_timings)
    torch.testing.assert_close(via_stage, plain, rtol=0, atol=0)
    assert via_stage.shape == (len(TEXTS), runner.hidden_size) and via_stage.device.type == "cpu"
    assert staged_timings.forward_ms > 0 and staged_timings.pool_ms >= 0


def test_staged_ahead_starts_the_next_copy_before_the_current_batch_runs():
    log: list[str] = []

    def stage(batch):
        log.append(f"stage {batch}")
        return StagedBatch(batch)

    for staged in staged_ahead(stage, [0, 1, 2]):
        log.append(f"run {staged.batch}")
    assert log == ["stage 0", "stage 1", "run 0", "stage 2", "run 1", "run 2"]
    assert list(staged_ahead(stage, [])) == []


def test_engine_embed_and_score_stage_each_batch_before_the_previous_one_runs(tiny_bert_dir, tiny_ce_dir, monkeypatch):
    """Engine.embed / score hand the runner batch i+1 to stage before running batch i (its copy overlaps i's
    forward on CUDA); the vectors are the same as batch-by-batch."""
    for engine, call in ((make_engine(tiny_bert_dir, pooling="mean", engine={"max_batch_tokens": 128}), "embed"),
                         (make_engine(tiny_ce_dir, kind="rerank", engine={"max_batch_tokens": 128}), "score")):
        runner, log, alive = engine.runner, [], []  # batches kept alive: their ids stay unique
        real_stage, real_run = runner.stage, getattr(runner, call)

        def stage(batch, real_stage=real_stage):
            log.append(("stage", id(batch)))
            alive.append(batch)
            return real_stage(batch)

        def run(staged, timings, real_run=real_run):
            assert isinstance(staged, StagedBatch)
            log.append(("run", id(staged.batch)))
            return real_run(staged, timings)

        monkeypatch.setattr(runner, "stage", stage)
        monkeypatch.setattr(runner, call, run)
        texts = [f"text number {i} " * (1 + i % 7) for i in range(40)]
        if call == "embed":
            results, timings = engine.embed([EmbedRequest(i, t) for i, t in enumerate(texts)])
            seen = list(log)
            one_by_one = [engine.embed([EmbedRequest(0, t)])[0][0].vector.values for t in texts]
            np.testing.assert_allclose(np.stack([r.vector.values for r in results]), np.stack(one_by_one), atol=1e-5)
        else:
            from embedstream.engine.engine import ScoreRequest

            results, timings = engine.score([ScoreRequest(i, "a query", t) for i, t in enumerate(texts)])
            seen = list(log)
            assert all(r.score is not None for r in results)
        batches = [b for kind, b in seen if kind == "stage"]
        assert timings.batches == len(batches) >= 3  # several batches, each staged once
        assert [b for kind, b in seen if kind == "run"] == batches
        for i in range(1, len(batches)):  # batch i was staged before batch i-1 ran
            assert seen.index(("stage", batches[i])) < seen.index(("run", batches[i - 1]))
        monkeypatch.undo()


@CUDA
def test_cuda_packing_is_pinned_and_staging_copies_on_a_side_stream(tiny_bert_dir):
    engine = make_engine(tiny_bert_dir, pooling="mean", engine={"device": "cuda"})
    batch = _batch(engine)
    assert batch.is_pinned()
    staged = engine.runner.stage(batch)
    assert staged.ready is not None and all(t.device.type == "cuda" for t in staged.batch.tensors())
    assert staged.batch.cu_seqlens.dtype == torch.int32
    out = engine.runner.embed(staged, ForwardTimings())
    assert out.device.type == "cpu" and out.is_pinned()


@CUDA
def test_cuda_vectors_match_cpu_in_float32(tiny_bert_dir, cpu_engine):
    gpu = make_engine(tiny_bert_dir, pooling="mean", engine={"device": "cuda", "precision": "float32"})
    batches = [_batch(gpu, TEXTS[i:] + TEXTS[:i]) for i in range(3)]
    on_gpu = [gpu.runner.embed(s, ForwardTimings()) for s in staged_ahead(gpu.runner.stage, batches)]
    on_cpu = [cpu_engine.runner.embed(_batch(cpu_engine, TEXTS[i:] + TEXTS[:i]), ForwardTimings()) for i in range(3)]
    for a, b in zip(on_gpu, on_cpu):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-4)
