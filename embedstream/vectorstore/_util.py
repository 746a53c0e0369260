"""Input checks shared by the backends.

Both backends validate the same way so a bad batch fails identically in tests
(":memory:", which ignores datatypes) and in production (server / edge).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from embedstream.vectors import canonical_json

from .base import AnySpec, AtLeast, FilterValue, Point, SparseSpec, SparseVector, VectorSpec, normalize_id


def prepare_vector(vname: str, vector: Any, spec: VectorSpec) -> np.ndarray:
    """float32 1-d array of the right size; uint8 vectors must be integers 0..255.

    The edge engine silently accepts out-of-range uint8 values, so the range is
    checked here rather than trusted to the backend.
    """
    arr = np.asarray(vector, dtype=np.float32)
    if arr.ndim != 1 or arr.shape[0] != spec.size:
        raise ValueError(f"vector {vname!r}: expected {spec.size} dims, got shape {arr.shape}")
    if spec.datatype == "uint8":
        if arr.size and (arr.min() < 0 or arr.max() > 255 or not np.all(arr == np.round(arr))):
            raise ValueError(f"vector {vname!r} is uint8: values must be integers in 0..255")
    elif not np.all(np.isfinite(arr)):
        raise ValueError(f"vector {vname!r} contains NaN or inf")
    return arr


def prepare_sparse(vname: str, vector: Any) -> SparseVector:
    """A sparse vector checked (unique indices in 0..2**32-1, finite values)."""
    if isinstance(vector, SparseVector):
        return vector
    try:
        return SparseVector.of(vector.indices, vector.values)
    except AttributeError:
        raise ValueError(f"vector {vname!r} is sparse: give a SparseVector, got {type(vector).__name__}") from None


def prepare_point(point: Point, specs: Mapping[str, AnySpec]) -> tuple[str, dict[str, Any]]:
    """Canonical id + checked vectors; unknown vector names are an error, missing ones are allowed."""
    pid = normalize_id(point.id)
    if not point.vectors:
        raise ValueError(f"point {pid} has no vectors")
    out: dict[str, np.ndarray] = {}
    for vname, vec in point.vectors.items():
        spec = specs.get(vname)
        if spec is None:
            raise ValueError(f"point {pid}: unknown vector name {vname!r}, collection has {sorted(specs)}")
        out[vname] = prepare_sparse(vname, vec) if isinstance(spec, SparseSpec) else prepare_vector(vname, vec, spec)
    return pid, out


def _check_matrix(vname: str, arr: np.ndarray, spec: VectorSpec) -> None:
    """Vectorized form of prepare_vector's checks for a (batch, size) matrix."""
    if arr.ndim != 2 or arr.shape[1] != spec.size:
        raise ValueError(f"vector {vname!r}: expected {spec.size} dims, got shape {arr.shape[1:]}")
    if spec.datatype == "uint8":
        if arr.size and (arr.min() < 0 or arr.max() > 255 or not np.array_equal(arr, np.round(arr))):
            raise ValueError(f"vector {vname!r} is uint8: values must be integers in 0..255")
    elif not np.isfinite(arr).all():
        raise ValueError(f"vector {vname!r} contains NaN or inf")


def prepare_batch(
    points: Sequence[Point], specs: Mapping[str, AnySpec]
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Checked (id, {name: list or SparseVector}, payload) triples for a whole batch.

    Stacks each named dense vector into one matrix so the checks and the list
    conversion run once per batch in numpy: per-point checks cost more than the
    engine's own upsert. Backends get plain lists, which both convert fastest,
    and sparse vectors as checked :class:`SparseVector` objects.
    """
    if not points:
        return []
    names = tuple(points[0].vectors)
    uniform = bool(names) and all(tuple(p.vectors) == names for p in points)
    if not uniform:  # mixed vector sets: per-point path
        out = []
        for p in points:
            pid, vecs = prepare_point(p, specs)
            out.append((pid, {k: v if isinstance(v, SparseVector) else v.tolist() for k, v in vecs.items()},
                        dict(p.payload or {})))
        return out
    columns: dict[str, list[Any]] = {}
    for vname in names:
        spec = specs.get(vname)
        if spec is None:
            raise ValueError(f"unknown vector name {vname!r}, collection has {sorted(specs)}")
        if isinstance(spec, SparseSpec):
            columns[vname] = [prepare_sparse(vname, p.vectors[vname]) for p in points]
            continue
        try:
            mat = np.asarray([p.vectors[vname] for p in points], dtype=np.float32)
        except ValueError as exc:  # ragged: some vector has the wrong length
            raise ValueError(f"vector {vname!r}: expected {spec.size} dims in every point") from exc
        _check_matrix(vname, mat, spec)
        columns[vname] = mat.tolist()
    return [
        (normalize_id(p.id), {k: columns[k][i] for k in names}, dict(p.payload or {}))
        for i, p in enumerate(points)
    ]


def split_filter_value(field: str, value: FilterValue) -> tuple[str, Any]:
    """Classify a filter value: ("any", list) / ("value", scalar) / ("range", float) / ("at_least", int).

    Qdrant matches exact values only for str/int/bool; a float is matched as
    the closed range [v, v].
    """
    if not isinstance(field, str) or not field:
        raise ValueError(f"filter field must be a non-empty string, got {field!r}")
    if isinstance(value, (list, tuple, set, frozenset)):
        vals = list(value)
        if not vals:
            raise ValueError(f"filter on {field!r}: empty list matches nothing; drop the condition instead")
        if all(isinstance(v, str) for v in vals) or all(
            isinstance(v, int) and not isinstance(v, bool) for v in vals
        ):
            return "any", vals
        raise ValueError(f"filter on {field!r}: list values must be all str or all int, got {vals!r}")
    if isinstance(value, AtLeast):
        return "at_least", value.value
    if isinstance(value, (str, bool, int)):
        return "value", value
    if isinstance(value, float):
        return "range", value
    raise ValueError(f"filter on {field!r}: unsupported value {value!r}")


def conditions(filter: Mapping[str, FilterValue] | None) -> list[tuple[str, str, Any]]:
    """(kind, field, value) per condition of an AND filter (kinds of :func:`split_filter_value`)."""
    return [(kind, field, val) for field, value in (filter or {}).items()
            for kind, val in [split_filter_value(field, value)]]


def holds(payload: Mapping[str, Any], expect: Mapping[str, FilterValue]) -> bool:
    """Whether a payload holds every expected value (a dotted field reaches into objects), compared by type and
    value: what a store's filter on those fields would match (a local store checks it in Python)."""
    for field, wanted in expect.items():
        value: Any = payload
        for part in field.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        if canonical_json(value) != canonical_json(wanted):
            return False
    return True


def check_top_k(top_k: int) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k <= 0:
        raise ValueError(f"top_k must be a positive int, got {top_k!r}")


def check_vector_name(specs: Mapping[str, VectorSpec], vector_name: str, collection: str) -> VectorSpec:
    spec = specs.get(vector_name)
    if spec is None:
        raise ValueError(f"collection {collection!r} has no vector {vector_name!r} (has {sorted(specs)})")
    return spec


def sorted_points(points: Sequence[Point]) -> list[Point]:
    """Deterministic order for scroll results, independent of backend internals."""
    return sorted(points, key=lambda p: p.id)
