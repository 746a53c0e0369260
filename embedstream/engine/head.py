"""The output head of an embedding model: everything between the encoder's hidden states and a reply.

In the order the model was saved with (sentence-transformers' module pipeline, read by
:mod:`embedstream.engine.st_modules`) and then what the request asks for:

1. **pool** the packed hidden states (``pooling.py``; prompt tokens left out where the model says);
2. **Dense** layers, each ``activation(x W^T + b)``, on the pooled batch;
3. **Normalize** (L2, unless the request turns it off);
4. **Matryoshka**: the requested size, renormalised;
5. **output form**: float32, float16, int8 (one scale per vector) or binary (packed sign bits).

Steps 1-2 run batched on the model's device (:meth:`EmbeddingHead.project`); 3-5 per item on the
float32 result. Normalisation, truncation and int8 come from the stored-vector layout
(:mod:`embedstream.vectors`), so a reply and a stored point are encoded by the same code; the
output forms and their checks are in :mod:`embedstream.engine.postprocess`.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch
import torch.nn.functional as F

from embedstream.engine import pooling
from embedstream.engine.errors import ConfigError
from embedstream.engine.model_spec import ModelSpec
from embedstream.engine.packed import PackedBatch
from embedstream.engine.postprocess import Quantized, check_dimensions, check_dtype, quantize
from embedstream.engine.st_modules import DenseSpec
from embedstream.vectors import l2_normalize, matryoshka_cut


def _activation(spec: DenseSpec) -> torch.nn.Module:
    """The saved activation class (e.g. ``torch.nn.modules.activation.Tanh``), as sentence-transformers
    restores it: only torch.nn modules, built without arguments."""
    module_name, _, class_name = spec.activation.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError):
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ConfigError(f"{spec.path}: Dense activation {spec.activation!r} is not a torch.nn module")
    return cls()


def _load_weights(spec: DenseSpec) -> dict[str, torch.Tensor]:
    path = spec.weights
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(str(path), map_location="cpu", weights_only=True)


class DenseLayer:
    """A sentence-transformers ``Dense`` module, in float32 on the model's device: a pooled batch is a
    few rows, so this costs microseconds whatever precision the encoder runs at."""

    def __init__(self, spec: DenseSpec, device: torch.device):
        state = _load_weights(spec)
        shapes = {"linear.weight": (spec.out_features, spec.in_features)}
        if spec.bias:
            shapes["linear.bias"] = (spec.out_features,)
        if spec.residual and spec.in_features != spec.out_features:
            shapes["residual.weight"] = (spec.out_features, spec.in_features)
        for key, shape in shapes.items():
            if key not in state or tuple(state[key].shape) != shape:
                found = tuple(state[key].shape) if key in state else "missing"
                raise ConfigError(f"{spec.path}: Dense weight {key} should be {shape}, found {found}")

        def tensor(key: str) -> torch.Tensor | None:
            return state[key].to(device=device, dtype=torch.float32) if key in shapes else None

        self.weight, self.bias, self.residual = tensor("linear.weight"), tensor("linear.bias"), tensor("residual.weight")
        self.with_residual = spec.residual
        self.activation = _activation(spec).to(device)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(F.linear(x, self.weight, self.bias))
        if self.with_residual:
            out = out + (x if self.residual is None else F.linear(x, self.residual))
        return out


class EmbeddingHead:
    """Pooling, Dense layers, normalisation, Matryoshka size and output form of one model."""

    def __init__(self, spec: ModelSpec, hidden_size: int, device: torch.device):
        self.spec = spec
        self.dense = [DenseLayer(layer, device) for layer in spec.dense]
        self.dimensions = spec.dense[-1].out_features if spec.dense else hidden_size

    def project(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """Pool and apply the Dense layers: float32 [B, D] on the hidden states' device, in packed order
        (called inside the runner's inference mode; the runner copies the result to the host once)."""
        vectors = pooling.pool(hidden, batch, self.spec.pooling, self.spec.include_prompt).float()
        for layer in self.dense:
            vectors = layer(vectors)
        return vectors

    @staticmethod
    def normalize(vectors: np.ndarray, rows: list[bool]) -> np.ndarray:
        """L2-normalise the rows whose request wants it (in place)."""
        chosen = [i for i, wanted in enumerate(rows) if wanted]
        if chosen:
            vectors[chosen] = l2_normalize(vectors[chosen])
        return vectors

    def check(self, dimensions: int | None, dtype: object) -> None:
        """Refuse an output size or form this model cannot give (a per-item error)."""
        check_dimensions(dimensions, self.spec.matryoshka_dims, self.dimensions, self.spec.name)
        check_dtype(dtype)

    @staticmethod
    def output(vector: np.ndarray, dimensions: int | None, dtype: str, normalize: bool) -> Quantized:
        """The requested Matryoshka size (renormalised when the vector is) in the requested form."""
        return quantize(matryoshka_cut(vector, dimensions, normalize), dtype)
