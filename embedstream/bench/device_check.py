"""`python -m embedstream.bench.device_check --device cuda`: the engine on one device against
sentence-transformers on the same device (scripts/gpu-check.sh runs it on a GPU).

Prints the torch / CUDA / cuDNN versions and the device, then for each precision the path and
attention kernel ``runner.describe()`` names, the min and mean cosine against sentence-transformers
float32 on 1,000 real texts of 8-256 tokens, and whether batches staged one ahead (the next copy
overlapping the current forward) give the vectors of batches staged one at a time (to 1e-5: CUDA's
mean pooling sums with atomics, so the last bit may differ; a copy the forward did not wait for
would not be close).
Exits 1 when a precision misses its floor (float32 0.9999, bfloat16 0.999), 2 when the device is
not there (with the reason)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np
import torch

from embedstream.corpus import mixed_length_texts
from embedstream.config import Settings
from embedstream.engine.batcher import pack
from embedstream.engine.engine import EmbedRequest, Engine
from embedstream.engine.runner import ForwardTimings
from embedstream.engine.transfer import staged_ahead

MIN_COS = {"float32": 0.9999, "bfloat16": 0.999}


@dataclass
class ExactnessResult:
    precision: str
    path: str
    texts: int
    min_cos: float
    mean_cos: float
    staged_ahead_matches: bool

    @property
    def passed(self) -> bool:
        return self.min_cos >= MIN_COS[self.precision] and self.staged_ahead_matches


def cuda_missing_reason() -> str | None:
    """Why CUDA cannot be used here, or None when it can."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} was built without CUDA"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no usable GPU (driver missing or too old?)"
    return None


def environment_lines(device: str) -> list[str]:
    lines = [f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"]
    if device == "cuda":
        index = torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        lines.append(f"device: {torch.cuda.get_device_name(index)} (sm_{major}{minor}), "
                     f"flash attention built into torch: {torch.backends.cuda.is_flash_attention_available()}")
    return lines


def _engine(model: str, device: str, precision: str) -> Engine:
    settings = Settings()
    settings.engine.device = device
    settings.engine.precision = precision
    return Engine.from_name(model, settings)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def _staged_ahead_matches(engine: Engine, texts: list[str]) -> bool:
    """Raw pooled vectors for the same batches, staged one ahead vs one at a time."""
    prepared = engine.prepare([EmbedRequest(i, t) for i, t in enumerate(texts)])
    groups = pack([len(p.tokens) for p in prepared], engine.limits, True)
    runner = engine.runner

    def batches():
        return (runner.pack([prepared[i].tokens for i in group]) for group in groups)

    ahead = [runner.embed(s, ForwardTimings()).clone() for s in staged_ahead(runner.stage, batches())]
    alone = [runner.embed(b, ForwardTimings()) for b in batches()]
    return len(ahead) == len(alone) and all(torch.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(ahead, alone))


def exactness(device: str, precisions: list[str], texts: int = 1000, model: str = "all-MiniLM-L6-v2"
              ) -> list[ExactnessResult]:
    from sentence_transformers import SentenceTransformer

    first = _engine(model, device, precisions[0])
    tok = first.tokenizer.tokenizer
    corpus = mixed_length_texts(texts, lambda s: len(tok.encode(s).ids), first.spec.max_tokens, seed=3, tail_share=0.0)
    reference = SentenceTransformer(str(first.spec.path), device=device).encode(corpus, batch_size=32)
    results = []
    for precision in precisions:
        engine = first if precision == precisions[0] else _engine(model, device, precision)
        out, _ = engine.embed([EmbedRequest(i, t) for i, t in enumerate(corpus)])
        cos = _cosines(np.stack([r.vector.values for r in out]), reference)
        results.append(ExactnessResult(precision, engine.runner.describe(), len(corpus), float(cos.min()),
                                       float(cos.mean()), _staged_ahead_matches(engine, corpus[:256])))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--precision", action="append", choices=tuple(MIN_COS), help="repeatable; default: both")
    parser.add_argument("--texts", type=int, default=1000)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    args = parser.parse_args(argv)
    if args.device == "cuda" and (reason := cuda_missing_reason()):
        print(f"device check: FAIL: no CUDA: {reason}", file=sys.stderr)
        return 2
    for line in environment_lines(args.device):
        print(line)
    results = exactness(args.device, args.precision or list(MIN_COS), args.texts, args.model)
    for r in results:
        print(f"{r.precision:>8}: {r.path}: min cos {r.min_cos:.6f} (floor {MIN_COS[r.precision]}), mean "
              f"{r.mean_cos:.6f} over {r.texts} texts vs sentence-transformers float32 on {args.device}; "
              f"staged-ahead batches match: {r.staged_ahead_matches} -> {'PASS' if r.passed else 'FAIL'}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
