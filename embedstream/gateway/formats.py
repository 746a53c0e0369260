"""Vector and score encodings the clients expect, computed from the workers' float32 replies.

Quantized forms go through the engine's own quantizers (``postprocess.quantize``), so an int8 or
binary vector from the gateway is bit for bit what the engine would produce for the same float
vector; uint8 is int8 shifted by 128 (``embedstream.vectors.uint8_encode``, as the stores keep it),
Cohere's signed ``binary`` is the packed sign bits minus 128 (``ubinary`` unshifted).
"""

from __future__ import annotations

import base64

import numpy as np

from embedstream.engine.postprocess import quantize
from embedstream.vectors import uint8_encode


def float_base64(vector: np.ndarray) -> str:
    """Little-endian float32 bytes, base64: what the openai SDK asks for unless told otherwise."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def int8(vector: np.ndarray) -> np.ndarray:
    return quantize(vector, "int8").values


def ubinary(vector: np.ndarray) -> np.ndarray:
    return quantize(vector, "binary").values


def encode_as(vectors: np.ndarray, kind: str) -> np.ndarray | list[str]:
    """One Cohere embedding type for every row (numpy rows; base64 strings)."""
    if kind == "float":
        return vectors
    if kind == "base64":
        return [float_base64(v) for v in vectors]
    if kind == "int8":
        return np.stack([int8(v) for v in vectors])
    if kind == "uint8":
        return np.stack([uint8_encode(v)[0] for v in vectors]).astype(np.uint8)
    if kind == "ubinary":
        return np.stack([ubinary(v) for v in vectors])
    if kind == "binary":
        return np.stack([ubinary(v).astype(np.int16) - 128 for v in vectors])
    raise ValueError(f"unknown embedding type {kind!r}")


def relevance(score: float, activation: str, raw: bool) -> float:
    """A cross-encoder score as asked: ``raw`` logits or sigmoid probabilities, whichever the model emits.

    The rerank worker returns what the model config says (sigmoid for one-label heads); TEI's
    ``raw_scores`` and Cohere's 0..1 relevance are derived from it exactly enough for ranking."""
    if activation == "sigmoid":
        if not raw:
            return score
        p = min(max(score, 1e-12), 1 - 1e-12)
        return float(np.log(p / (1 - p)))
    return score if raw else float(1.0 / (1.0 + np.exp(-score)))
