"""Output forms of an embedding: the request checks and the quantisers the output head ends with.

The order of the head's steps is :mod:`embedstream.engine.head`'s; normalisation, Matryoshka
truncation and the int8 codec are the stored-vector layout's (:mod:`embedstream.vectors`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from embedstream.engine.errors import EngineError
from embedstream.vectors import int8_decode, int8_encode

__all__ = [
    "OUTPUT_DTYPES", "OutputDType", "Quantized", "check_dimensions", "check_dtype", "dequantize", "quantize",
]

OutputDType = Literal["float32", "float16", "int8", "binary"]
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "float16", "int8", "binary")


@dataclass
class Quantized:
    """A vector in its output form. ``scale`` is set for int8: value ~= q * scale."""

    values: np.ndarray
    dtype: str
    scale: float | None = None

    def to_list(self) -> list:
        return self.values.tolist()


def check_dimensions(dimensions: int | None, matryoshka_dims: tuple[int, ...], full: int, model: str) -> None:
    """Reject sizes the model was not trained for (vLLM's rule for the `dimensions` field)."""
    if dimensions is None or dimensions == full:
        return
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
        raise EngineError("bad_dimensions", f"dimensions must be a positive integer, got {dimensions!r}")
    if dimensions > full:
        raise EngineError("bad_dimensions", f"dimensions={dimensions} is larger than model {model!r} ({full})")
    if not matryoshka_dims:
        raise EngineError(
            "bad_dimensions", f"model {model!r} is not Matryoshka-trained: dimensions other than {full} are refused"
        )
    if dimensions not in matryoshka_dims:
        raise EngineError(
            "bad_dimensions",
            f"dimensions={dimensions} is not a trained Matryoshka size of {model!r} ({sorted(matryoshka_dims)})",
        )


def check_dtype(dtype: object) -> str:
    if dtype not in OUTPUT_DTYPES:
        raise EngineError("bad_dtype", f"dtype must be one of {', '.join(OUTPUT_DTYPES)}, got {dtype!r}")
    return dtype  # type: ignore[return-value]


def quantize(vector: np.ndarray, dtype: str) -> Quantized:
    """float16 cast; int8 symmetric with a per-vector scale; binary as packed sign bits (MSB first)."""
    if dtype == "float32":
        return Quantized(vector.astype(np.float32), dtype)
    if dtype == "float16":
        return Quantized(vector.astype(np.float16), dtype)
    if dtype == "int8":
        codes, scale = int8_encode(vector)
        return Quantized(codes, dtype, scale)
    if dtype == "binary":
        return Quantized(np.packbits(vector > 0), dtype)
    raise EngineError("bad_dtype", f"unknown dtype {dtype!r}")


def dequantize(q: Quantized) -> np.ndarray:
    """Back to float32 (int8 via its scale, binary as +/-1), e.g. for rescoring checks."""
    if q.dtype == "int8":
        return int8_decode(q.values, q.scale)
    if q.dtype == "binary":
        return np.where(np.unpackbits(q.values) > 0, 1.0, -1.0).astype(np.float32)
    return q.values.astype(np.float32)
