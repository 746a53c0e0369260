"""Activation ranges for static int8, measured once per model and cached on disk.

Static int8 quantises each linear's input with a scale fixed ahead of time (no per-call min/max
pass), so the ranges must come from real text: the float32 packed encoder embeds a fixed set of
calibration texts (the bench corpus's traffic mix under another seed: 200 texts, about 24k
tokens) while an observer records each linear input's per-channel min and max. The statistics,
not the derived scales, are cached, so the quantisation recipe (linear.StaticInt8Linear) can change
without re-measuring. Cache: ``<model>/.embedstream-calibration/<key>.pt`` when the model folder is
writable and not part of an installed package, else ``~/.cache/embedstream/calibration/<key>/``;
the key hashes the weights, the config and the recipe version, so new weights re-calibrate.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import torch

from embedstream import logs
from embedstream.engine.identity import folder_digest

CALIBRATION_VERSION = 1  # bump when what is measured changes (not when the recipe using it does)
CALIBRATION_TEXTS = 200
CALIBRATION_SEED = 101  # the bench corpus uses seed 13: calibration never sees the texts it is judged on
BATCH_TEXTS = 32

Stats = dict[str, tuple[torch.Tensor, torch.Tensor]]  # linear name -> (per-channel min, per-channel max)

log = logs.get("embedstream.engine.calibrate")
calibrations_run = 0  # how many times this process measured ranges (tests: the second load reuses the cache)


def model_key(folder: Path) -> str:
    """Hash of the weights and config (content, not names or dates) plus the calibration version."""
    material = f"embedstream-calibration-v{CALIBRATION_VERSION}:{folder_digest(folder, tokenizer=False)}"
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def _installed_package(folder: Path) -> bool:
    """Inside site-packages: never written to, whatever the permissions say (pip owns it)."""
    resolved = folder.resolve()
    if {"site-packages", "dist-packages"} & set(resolved.parts):  # any environment's, not only this interpreter's
        return True
    for key in ("purelib", "platlib"):
        root = Path(sysconfig.get_paths()[key]).resolve()
        if resolved == root or root in resolved.parents:
            return True
    return False


def _beside_model(folder: Path) -> bool:
    """Whether a model's once-measured files may live in its own folder: writable and not pip's."""
    return os.access(folder, os.W_OK) and not _installed_package(folder)


def _user_cache(key: str) -> Path:
    return Path(os.environ.get("EMBEDSTREAM_CALIBRATION_DIR", Path.home() / ".cache" / "embedstream" / "calibration")) / key


def cache_file(folder: Path, key: str) -> Path:
    """The activation ranges: next to the model when that folder is ours to write, else in the user's cache."""
    return folder / ".embedstream-calibration" / f"{key}.pt" if _beside_model(folder) else _user_cache(key) / "activation-ranges.pt"


def artifacts_dir(folder: Path, key: str) -> Path:
    """Where other once-per-model files live (an exported graph, a quantised model): beside the ranges."""
    return folder / ".embedstream-calibration" / key if _beside_model(folder) else _user_cache(key)


class RangeObserver:
    """Wraps one linear layer; records the per-channel min and max of every input it sees."""

    def __init__(self, layer, name: str, stats: Stats):
        self.layer, self.name, self.stats = layer, name, stats

    def _record(self, x: torch.Tensor) -> None:
        x = x.detach().float()
        lo, hi = x.amin(0), x.amax(0)
        if self.name in self.stats:
            old_lo, old_hi = self.stats[self.name]
            lo, hi = torch.minimum(lo, old_lo), torch.maximum(hi, old_hi)
        self.stats[self.name] = (lo, hi)

    def __call__(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        self._record(x)
        return self.layer(x, activation)

    def plus(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        self._record(x)
        return self.layer.plus(x, residual)

    def add_into(self, residual: torch.Tensor, x: torch.Tensor) -> None:
        self._record(x)
        self.layer.add_into(residual, x)


def measure(encoder, batches) -> Stats:
    """Run ``encoder`` (float32, exposing ``named_linears()`` / ``set_linear()``) over ``batches``."""
    stats: Stats = {}
    originals = dict(encoder.named_linears())
    try:
        for name, layer in originals.items():
            encoder.set_linear(name, RangeObserver(layer, name, stats))
        for batch in batches:
            encoder(batch)
    finally:
        for name, layer in originals.items():
            encoder.set_linear(name, layer)
    return stats


def calibration_texts(spec, count: int = CALIBRATION_TEXTS) -> tuple[object, list[str]]:
    """(the engine's TextTokenizer for ``spec``, the fixed calibration texts); peers calibrate on the same."""
    from embedstream.corpus import mixed_length_texts
    from embedstream.engine.tokenize import TextTokenizer, load_tokenizer, st_lowercase

    tokenizer = TextTokenizer(load_tokenizer(spec.path), spec.max_tokens, st_lowercase(spec.path))
    texts = mixed_length_texts(count, lambda s: len(tokenizer.tokenizer.encode(s).ids), spec.max_tokens,
                               seed=CALIBRATION_SEED)
    return tokenizer, texts


def calibration_batches(spec):
    """The fixed calibration texts, tokenised like the engine does and packed 32 texts a batch."""
    from embedstream.engine.packed import pack_sequences

    tokenizer, texts = calibration_texts(spec)
    items = sorted(tokenizer.encode_many(texts, [True] * len(texts)), key=len)
    for start in range(0, len(items), BATCH_TEXTS):
        yield pack_sequences(items[start : start + BATCH_TEXTS])


def load_or_calibrate(spec, build_float_encoder: Callable[[], object]) -> Stats:
    """The cached activation ranges for ``spec``'s model, measuring (and caching) them on first use."""
    global calibrations_run
    path = cache_file(spec.path, model_key(spec.path))
    if path.is_file():
        try:
            loaded = torch.load(path, weights_only=True)
            return {name: (lo, hi) for name, (lo, hi) in loaded.items()}
        except Exception as exc:  # noqa: BLE001 - a torn or foreign file: measure again, say why
            log.warning("calibration_cache_unreadable", path=str(path), error=str(exc))
    log.info("int8_calibrating", model=spec.name, texts=CALIBRATION_TEXTS, cache=str(path))
    start = time.perf_counter()
    stats = measure(build_float_encoder(), calibration_batches(spec))
    calibrations_run += 1
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(stats, tmp)
    os.replace(tmp, path)  # atomic: two workers starting together never read half a file
    log.info("int8_calibrated", model=spec.name, seconds=round(time.perf_counter() - start, 1), cache=str(path))
    return stats
