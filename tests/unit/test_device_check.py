"""The device check behind scripts/gpu-check.sh, run on CPU: it refuses loudly without CUDA (with the
reason), and its exactness run passes on CPU float32 and names the path and kernel that ran."""

from __future__ import annotations

import pytest
import torch

from embedstream.bench import device_check


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_2_and_says_why(capsys):
    assert device_check.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "FAIL: no CUDA" in err and torch.__version__ in err


def test_a_torch_built_without_cuda_is_named(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert "built without CUDA" in device_check.cuda_missing_reason()


def test_exactness_on_cpu_float32_passes_and_names_the_kernel():
    (result,) = device_check.exactness("cpu", ["float32"], texts=24)
    assert result.path == "packed-bert/cpu/sdpa-grouped-by-length/float32"
    assert result.texts == 24 and result.min_cos >= device_check.MIN_COS["float32"]
    assert result.staged_ahead_matches and result.passed
