"""The stored vector layout, in one place: point ids, vector names, codecs and normalisation.

Everything that writes vectors (the engine's output, the Qdrant sink) or reads them back (the
searcher) goes through these functions, so a point written by one version is read the same way by
every other part:

* **point id**: UUIDv5 of ``doc_id`` and ``chunk_id`` in a fixed namespace, so a redelivered chunk
  overwrites its own point;
* **named vectors**: ``full`` (the model's whole output) and ``mrl_<d>`` per Matryoshka size, the
  first ``d`` components renormalised;
* **int8**: symmetric, one scale per vector (``value ~= code * scale``, peak magnitude -> 127);
* **uint8 storage**: the int8 codes shifted by 128 (Qdrant's uint8 datatype holds 0..255), the scale
  in the payload as ``_scale`` (``_scale_<d>`` for ``mrl_<d>``);
* **L2 normalisation**: :func:`l2_normalize`, the one implementation;
* **payload values** compared as typed canonical JSON (:func:`canonical_json`): ``1``, ``1.0`` and ``true``
  are three values, the order of an object's keys is none;
* **sparse vectors** beside the dense ones in the same point: ``sparse_<kind>`` (``sparse_bm25``,
  ``sparse_splade``), a :class:`SparseVector` of term ids and weights; BM25's is searched with
  Qdrant's IDF modifier (:func:`sparse_modifier`).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

POINT_NAMESPACE = uuid.UUID("6f1c3a52-5b8e-4d7e-9a57-3f1e0b2c9d10")
FULL = "full"
SCALE_KEY = "_scale"
STORAGE_DATATYPES = ("float32", "float16", "uint8")

SPARSE_KINDS = ("bm25", "splade")

_MRL_NAME = re.compile(r"^mrl_([1-9][0-9]*)$")
_SPARSE_PREFIX = "sparse_"
_SPARSE_MODIFIER = {"bm25": "idf", "splade": None}  # BM25 stores term frequencies; the IDF is Qdrant's, at search
_NORM_FLOOR = 1e-12  # as torch.nn.functional.normalize: a zero vector stays zero instead of NaN
_UINT8_SHIFT = 128


def canonical_json(value: Any) -> str:
    """Typed canonical JSON: keys sorted, no spaces; ``1``, ``1.0`` and ``true`` stay three different values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)


def point_id(doc_id: str, chunk_id: int) -> str:
    """Deterministic id: the same chunk always lands on the same point."""
    return str(uuid.uuid5(POINT_NAMESPACE, f"{doc_id}\x1f{chunk_id}"))


# -- names ------------------------------------------------------------------------------------
def mrl_name(dims: int) -> str:
    """The named vector holding the first ``dims`` components."""
    return f"mrl_{int(dims)}"


def parse_mrl_name(name: str) -> int | None:
    """``dims`` of an ``mrl_<dims>`` name; None for any other name (``full`` included)."""
    match = _MRL_NAME.match(name)
    return int(match.group(1)) if match else None


def sparse_name(kind: str) -> str:
    """The named sparse vector of a sparse encoder kind (``sparse_bm25``, ``sparse_splade``)."""
    if kind not in SPARSE_KINDS:
        raise ValueError(f"unknown sparse kind {kind!r}; expected one of {', '.join(SPARSE_KINDS)}")
    return f"{_SPARSE_PREFIX}{kind}"


def parse_sparse_name(name: str) -> str | None:
    """The kind of a ``sparse_<kind>`` name; None for any other name."""
    kind = name[len(_SPARSE_PREFIX):] if name.startswith(_SPARSE_PREFIX) else None
    return kind if kind in SPARSE_KINDS else None


def sparse_modifier(kind: str) -> str | None:
    """What the store applies to a sparse kind's scores at search time: ``idf`` for BM25, nothing for SPLADE."""
    sparse_name(kind)  # refuses an unknown kind
    return _SPARSE_MODIFIER[kind]


def scale_key(name: str) -> str:
    """Payload key of a uint8 vector's scale: ``_scale`` for ``full``, ``_scale_<d>`` for ``mrl_<d>``."""
    dims = parse_mrl_name(name)
    return SCALE_KEY if dims is None else f"{SCALE_KEY}_{dims}"


def is_layout_key(key: str) -> bool:
    """Payload keys the layout writes itself (scales), as opposed to a producer's metadata."""
    return key.startswith(SCALE_KEY)


# -- normalisation and Matryoshka ---------------------------------------------------------------
def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Unit length along the last axis (one vector or a matrix of rows); zero stays zero."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, _NORM_FLOOR)


def matryoshka_cut(vector: np.ndarray, dims: int | None, normalize: bool = True) -> np.ndarray:
    """The first ``dims`` components (renormalised unless asked not to); the vector itself when
    ``dims`` is None or not smaller than it."""
    if dims is None or dims >= vector.shape[-1]:
        return vector
    cut = vector[..., :dims]
    return l2_normalize(cut) if normalize else cut


# -- int8 and uint8 -----------------------------------------------------------------------------
def int8_encode(vector: np.ndarray) -> tuple[np.ndarray, Any]:
    """Symmetric int8 codes with one scale per vector: the largest magnitude maps to +-127.

    One vector gives a float scale; a matrix [N, D] gives one scale per row (an [N] array)."""
    peak = np.max(np.abs(vector), axis=-1, keepdims=True).astype(np.float64) if vector.size else np.zeros(1)
    scale = np.where(peak > 0, peak / 127.0, 1.0)
    codes = np.clip(np.rint(vector / scale), -127, 127).astype(np.int8)
    return codes, float(scale[0]) if vector.ndim == 1 else scale[..., 0]


def int8_decode(codes: np.ndarray, scale: Any) -> np.ndarray:
    """Back to float32: ``code * scale`` (a float, or one per row of a matrix)."""
    scale = np.asarray(1.0 if scale is None else scale, dtype=np.float32)
    return codes.astype(np.float32) * (scale[..., None] if scale.ndim else scale)


def uint8_encode(vector: np.ndarray) -> tuple[np.ndarray, Any]:
    """The int8 codes shifted into 0..255 (as float32, what the stores take) and their scale(s)."""
    codes, scale = int8_encode(vector)
    return codes.astype(np.float32) + _UINT8_SHIFT, scale


def uint8_decode(stored: np.ndarray) -> np.ndarray:
    """The int8 codes (scale-free: cosine only needs the direction) of a stored uint8 vector.

    A Qdrant server and qdrant-edge return the integers 0..255; qdrant-client's local mode returns
    them L2-normalised. :func:`int8_encode` maps the largest magnitude to +-127, so the integers
    reach 255 or 1, which fixes the lost norm: of the two candidate norms, the one giving whole
    numbers wins.
    """
    stored = np.asarray(stored, dtype=np.float64)
    if stored.size and stored.min() >= 0 and stored.max() > 1.5 and np.all(stored == np.round(stored)):
        return stored - _UINT8_SHIFT
    best, best_err = stored * 0, float("inf")
    for norm in (255.0 / stored.max() if stored.max() > 0 else 0.0, 1.0 / stored.min() if stored.min() > 0 else 0.0):
        if norm <= 0:
            continue
        ints = stored * norm
        err = float(np.mean(np.abs(ints - np.round(ints))))
        if err < best_err:
            best, best_err = np.round(ints), err
    return best - _UINT8_SHIFT


# -- storage forms ------------------------------------------------------------------------------
def stored_form(vector: np.ndarray, datatype: str) -> tuple[np.ndarray, float | None]:
    """A vector as a collection of ``datatype`` stores it, with the uint8 scale (None otherwise)."""
    if datatype == "uint8":
        return uint8_encode(vector)
    if datatype == "float16":
        return vector.astype(np.float16).astype(np.float32), None
    if datatype == "float32":
        return vector.astype(np.float32), None
    raise ValueError(f"unknown storage datatype {datatype!r}; expected one of {', '.join(STORAGE_DATATYPES)}")


def query_form(vector: np.ndarray, datatype: str) -> np.ndarray:
    """A query as the store compares it with ``datatype`` vectors (shifted int8 for uint8)."""
    return stored_form(vector, datatype)[0] if datatype == "uint8" else vector


def named_vectors(full: np.ndarray, matryoshka_dims: tuple[int, ...], datatype: str) -> tuple[dict[str, list], dict[str, float]]:
    """A point's vectors (``full`` and one ``mrl_<d>`` per size) in storage form, and the payload
    entries the form needs (uint8 scales)."""
    vectors: dict[str, list] = {}
    scales: dict[str, float] = {}
    for name, vector in ((FULL, full), *((mrl_name(d), matryoshka_cut(full, d)) for d in matryoshka_dims)):
        values, scale = stored_form(vector, datatype)
        vectors[name] = values.tolist()
        if scale is not None:
            scales[scale_key(name)] = scale
    return vectors, scales


# -- sparse vectors -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SparseVector:
    """Term ids (unique, ascending, 0..2**32-1) and their weights (finite float32)."""

    indices: np.ndarray  # int64 [K]
    values: np.ndarray  # float32 [K]

    @classmethod
    def of(cls, indices: Any, values: Any) -> "SparseVector":
        """Checked and sorted by index; a repeated index, a negative or over-u32 one, or a non-finite weight is refused."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        val = np.asarray(values, dtype=np.float32).reshape(-1)
        if idx.shape != val.shape:
            raise ValueError(f"sparse vector: {idx.size} indices but {val.size} values")
        if idx.size and (idx.min() < 0 or idx.max() > 0xFFFFFFFF):
            raise ValueError("sparse vector indices must lie in 0..2**32-1")
        if not np.isfinite(val).all():
            raise ValueError("sparse vector values must be finite")
        order = np.argsort(idx, kind="stable")
        idx, val = idx[order], val[order]
        if idx.size > 1 and np.any(idx[1:] == idx[:-1]):
            raise ValueError("sparse vector indices must be unique")
        return cls(idx, val)

    @classmethod
    def from_dense(cls, row: np.ndarray) -> "SparseVector":
        """The non-zero entries of a dense row (a SPLADE activation over the vocabulary)."""
        idx = np.flatnonzero(row)
        return cls(idx.astype(np.int64), np.asarray(row, dtype=np.float32)[idx])

    def __len__(self) -> int:
        return int(self.indices.size)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SparseVector) and np.array_equal(self.indices, other.indices)
                and np.array_equal(self.values, other.values))

    def to_json(self) -> list[dict]:
        """TEI's ``/embed_sparse`` shape: ``[{"index": i, "value": v}, ...]``."""
        return [{"index": int(i), "value": float(v)} for i, v in zip(self.indices, self.values)]


class EncodedRow(np.ndarray):
    """One dense vector (a 1-d float array) that carries its text's sparse vector as ``.sparse`` and, when
    asked, its tokens' last hidden states as ``.token_states`` (float32 [tokens, hidden]).

    The engine's per-item output: the embed worker hands rows on as they are and the sink writes
    both into the same point (:func:`sparse_of`), so a deployment with a sparse encoder needs no
    other path through the worker. Arrays derived from a row (slices, casts, stacks) are plain
    ones: ``sparse`` and ``token_states`` are None on them."""

    sparse: SparseVector | None = None
    token_states: np.ndarray | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self.sparse = None
        self.token_states = None


def encoded_rows(dense: np.ndarray, sparse: list[SparseVector | None] | None = None,
                 token_states: list[np.ndarray | None] | None = None) -> list[EncodedRow]:
    """The rows of a dense [N, D] matrix, each carrying its sparse vector and token states (None: none)."""
    rows = []
    for i, row in enumerate(dense):
        encoded = row.view(EncodedRow)
        encoded.sparse = None if sparse is None else sparse[i]
        encoded.token_states = None if token_states is None else token_states[i]
        rows.append(encoded)
    return rows


def sparse_of(vector: Any) -> SparseVector | None:
    """The sparse vector an engine row carries (None for a plain array)."""
    return getattr(vector, "sparse", None)


def token_states_of(vector: Any) -> np.ndarray | None:
    """The token states an engine row carries (None for a plain array, or when not asked)."""
    return getattr(vector, "token_states", None)
