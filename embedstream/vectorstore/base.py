"""Backend-neutral vector store contract.

The rest of embedstream talks to Qdrant only through :class:`VectorStore`, so the
same pipeline runs against a Qdrant server (production), the qdrant-client
in-memory mode (tests) and the embedded qdrant-edge engine (single machine).
The types here are plain dataclasses so callers never import a backend's models.
"""

from __future__ import annotations

import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal, Union

import numpy as np

from embedstream.errors import CodedError
from embedstream.vectors import SparseVector

Distance = Literal["cosine", "dot", "euclid"]
Datatype = Literal["float32", "float16", "uint8"]
Quantization = Literal["scalar", "binary"]

DISTANCES: tuple[str, ...] = ("cosine", "dot", "euclid")
DATATYPES: tuple[str, ...] = ("float32", "float16", "uint8")
QUANTIZATIONS: tuple[str | None, ...] = (None, "scalar", "binary")

@dataclass(frozen=True)
class AtLeast:
    """A filter value matching numbers ``>= value`` (e.g. the chunks of a document from one on)."""

    value: int


#: A filter value: equality for a scalar, "any of" for a list, a range for :class:`AtLeast`.
FilterValue = Union[str, int, float, bool, Sequence[Union[str, int]], AtLeast]
VectorLike = Union[Sequence[float], np.ndarray, SparseVector]
SPARSE_MODIFIERS: tuple[str | None, ...] = (None, "idf")

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class VectorStoreError(CodedError):
    """Base class, so callers can catch every store failure in one place. Raised with a message
    alone; each kind has a fixed ``code`` (the project-wide :class:`CodedError` fields)."""

    code = "vector_store_error"

    def __init__(self, message: str = ""):
        super().__init__(type(self).code, message)


class CollectionNotFound(VectorStoreError, KeyError):
    """Name is neither a collection nor an alias."""

    code = "unknown_collection"

    def __init__(self, message: str = "collection not found"):
        super().__init__(message)


class CollectionConfigMismatch(VectorStoreError, ValueError):
    """ensure_collection found the collection with a different vector config.

    Raised instead of silently reusing it: writing 384-d vectors into a
    collection created for another model would corrupt search quietly.
    """

    code = "collection_config_mismatch"


class AliasError(VectorStoreError, ValueError):
    """Alias operation is invalid (e.g. alias name clashes with a collection)."""

    code = "alias_error"


#: Quantized candidates fetched per result before exact rescoring, per quantization kind. From
#: `embedstream bench quality` (MiniLM, 384-d, 10,393 real chunks): int8 reaches recall@10 >= 0.98
#: with no oversampling (x2 is headroom), binary codes need x10 (0.938 at x4).
QUANT_OVERSAMPLING = {"scalar": 2.0, "binary": 10.0}


def quant_oversampling(kind: str | None) -> float:
    return QUANT_OVERSAMPLING.get(kind or "", 1.0)


@dataclass(frozen=True)
class VectorSpec:
    """Config of one named vector; compared field by field by ensure_collection."""

    size: int
    distance: Distance = "cosine"
    datatype: Datatype = "float32"
    quantization: Quantization | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size <= 0:
            raise ValueError(f"VectorSpec.size must be a positive int, got {self.size!r}")
        if self.distance not in DISTANCES:
            raise ValueError(f"VectorSpec.distance must be one of {DISTANCES}, got {self.distance!r}")
        if self.datatype not in DATATYPES:
            raise ValueError(f"VectorSpec.datatype must be one of {DATATYPES}, got {self.datatype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"VectorSpec.quantization must be one of {QUANTIZATIONS}, got {self.quantization!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VectorSpec":
        return cls(
            size=int(d["size"]),
            distance=d.get("distance", "cosine"),
            datatype=d.get("datatype", "float32"),
            quantization=d.get("quantization"),
        )


@dataclass(frozen=True)
class SparseSpec:
    """Config of one named sparse vector: ``modifier="idf"`` has the store weigh each term by its
    inverse document frequency at search time (BM25's IDF, always current)."""

    modifier: Literal["idf"] | None = None

    def __post_init__(self) -> None:
        if self.modifier not in SPARSE_MODIFIERS:
            raise ValueError(f"SparseSpec.modifier must be one of {SPARSE_MODIFIERS}, got {self.modifier!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"sparse": True, "modifier": self.modifier}


AnySpec = Union[VectorSpec, SparseSpec]


def spec_from_dict(d: Mapping[str, Any]) -> AnySpec:
    """A stored spec (``VectorSpec.to_dict`` or ``SparseSpec.to_dict``) back as its type."""
    return SparseSpec(d.get("modifier")) if d.get("sparse") else VectorSpec.from_dict(d)


def dense_specs(specs: Mapping[str, AnySpec]) -> dict[str, VectorSpec]:
    return {name: spec for name, spec in specs.items() if isinstance(spec, VectorSpec)}


def sparse_specs(specs: Mapping[str, AnySpec]) -> dict[str, SparseSpec]:
    return {name: spec for name, spec in specs.items() if isinstance(spec, SparseSpec)}


@dataclass
class Point:
    """One stored item: a UUID string id, one vector per name, a JSON payload.

    ``uint8`` vectors are given as ints 0..255 (int8 shifted by 128),
    ``float16`` ones as floats; the store converts for its backend.
    """

    id: str
    vectors: dict[str, VectorLike]
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    """One search result; ``vector_name`` tells which vector produced the score; ``vector``: that vector of the
    point, where the search asked for it (:meth:`VectorStore.search_batch`), else None."""

    id: str
    score: float
    payload: dict[str, Any]
    vector_name: str
    vector: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Prefetch:
    """First stage of a two-stage search (Qdrant Query API prefetch).

    Retrieve ``limit`` candidates by ``vector`` on the (small, cheap)
    ``vector_name``; the outer search then rescores only those candidates on
    its own (full) vector.
    """

    vector_name: str
    vector: VectorLike
    limit: int


def normalize_id(point_id: Any) -> str:
    """Canonical UUID string; Qdrant returns ids in this form, so round trips compare equal."""
    if isinstance(point_id, uuid.UUID):
        return str(point_id)
    try:
        return str(uuid.UUID(str(point_id)))
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"point id must be a UUID string, got {point_id!r}") from exc


def validate_name(name: str, what: str = "collection") -> str:
    """Names double as directory names in the edge store, so keep them filesystem safe."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"invalid {what} name {name!r}: use 1-128 chars of [A-Za-z0-9_.-], not starting with '.', '_' or '-'"
        )
    return name


def describe_mismatch(
    name: str, existing: Mapping[str, VectorSpec], wanted: Mapping[str, VectorSpec]
) -> str:
    """Human-readable diff for CollectionConfigMismatch."""
    parts: list[str] = []
    for vname in sorted(set(existing) | set(wanted)):
        have, want = existing.get(vname), wanted.get(vname)
        if have != want:
            parts.append(f"{vname!r}: existing={have} requested={want}")
    return f"collection {name!r} exists with a different vector config: " + "; ".join(parts)


def as_float_list(vector: VectorLike) -> list[float]:
    """Plain list for backends that want JSON-like input."""
    if isinstance(vector, np.ndarray):
        return vector.astype(np.float32, copy=False).tolist()
    return [float(x) for x in vector]


class VectorStore(ABC):
    """What embedstream needs from a vector database.

    ``name`` arguments of data operations may be an alias; it is resolved on
    each call (so readers follow an alias switch on their next call).
    """

    # ---- collections -------------------------------------------------------------
    @abstractmethod
    def collection_exists(self, name: str) -> bool:
        """True only for a real collection (an alias name gives False)."""

    @abstractmethod
    def ensure_collection(
        self,
        name: str,
        vectors: Mapping[str, AnySpec],
        payload_indexes: Iterable[str] = ("doc_id",),
    ) -> bool:
        """Create ``name`` when missing; return True if it was created. Sparse vectors are given
        beside the dense ones as :class:`SparseSpec`.

        An existing collection must have exactly ``vectors``, otherwise
        CollectionConfigMismatch. Missing keyword payload indexes are added.
        """

    @abstractmethod
    def get_vector_specs(self, name: str) -> dict[str, AnySpec]:
        """Vector config of a collection (or alias target): dense ones as VectorSpec, sparse ones as SparseSpec."""

    @abstractmethod
    def delete_collection(self, name: str) -> bool:
        """Drop a collection (and aliases pointing to it); False if it did not exist."""

    @abstractmethod
    def list_collections(self) -> list[str]:
        """Sorted collection names (aliases not included)."""

    # ---- points --------------------------------------------------------------------
    @abstractmethod
    def upsert(self, name: str, points: Sequence[Point], wait: bool = True) -> None:
        """Insert or replace points by id (idempotent: re-sending a batch is harmless)."""

    @abstractmethod
    def overwrite_payloads(self, name: str, payloads: Mapping[str, Mapping[str, Any]], wait: bool = True,
                           expect: Mapping[str, Mapping[str, FilterValue]] | None = None) -> None:
        """Replace the whole payload of each point (id -> its new payload) in one request, its vectors
        kept. An id with no point is skipped: a payload write never creates a point.

        ``expect`` (id -> {field: value}; a dotted field reaches into an object): the point's payload is
        replaced only while it holds each of those values, checked and written in one atomic step (a filter
        on the id and the values); a point that no longer does is left as it is. Nothing says which points
        were written: read them back."""

    @abstractmethod
    def delete_points(self, name: str, ids: Sequence[str]) -> None:
        """Delete points by id; unknown ids are ignored."""

    @abstractmethod
    def delete_where(self, name: str, filter: Mapping[str, FilterValue]) -> None:
        """Delete every point matching every condition of ``filter`` (all chunks of a doc: ``{"doc_id": d}``; its
        tail: ``{"doc_id": d, "chunk_id": AtLeast(n)}``), in one request whatever the number of points."""

    @abstractmethod
    def count(self, name: str, exact: bool = True) -> int:
        """Number of points."""

    @abstractmethod
    def scroll(
        self,
        name: str,
        field: str | None = None,
        value: FilterValue | None = None,
        with_vectors: bool = False,
        filter: Mapping[str, FilterValue] | None = None,
    ) -> list[Point]:
        """All points (optionally those matching ``field == value`` and every ``filter`` condition), ordered by id."""

    @abstractmethod
    def get_payloads(self, name: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Payloads of the points with these ids, in one round trip: canonical id -> payload.

        Ids with no point are left out (so ``len(result) <= len(ids)``).
        """

    @abstractmethod
    def get_vectors(self, name: str, ids: Sequence[str], vector_name: str) -> dict[str, Any]:
        """The ``vector_name`` vectors of the points with these ids, in one round trip: canonical id -> vector
        (as stored: uint8 ones as their integers, or L2-normalised by ``:memory:``). Ids with no point are left out."""

    @abstractmethod
    def search(
        self,
        name: str,
        vector_name: str,
        vector: VectorLike,
        top_k: int,
        filter: Mapping[str, FilterValue] | None = None,
        prefetch: Sequence[Prefetch] | None = None,
        ids: Sequence[str] | None = None,
        exact: bool = False,
    ) -> list[Hit]:
        """Nearest points on ``vector_name``, best first.

        ``filter`` is an AND of ``field == value`` (list value: any of).
        With ``prefetch`` the candidates come from the prefetch stages and are
        rescored on ``vector_name``. With ``ids`` only these points are candidates
        (how a caller scores given points: a sparse query scores only the points that
        hold one of its terms, the others are left out). ``exact`` asks for an exact
        scan instead of the engine's HNSW graph (a server builds one above its indexing
        threshold; the embedded store after :meth:`optimize`).
        """

    # ---- collection metadata ---------------------------------------------------------
    @abstractmethod
    def collection_metadata(self, name: str) -> dict[str, Any]:
        """The collection's own metadata (a JSON object; empty when it has none), through an alias too."""

    @abstractmethod
    def set_collection_metadata(self, name: str, metadata: Mapping[str, Any]) -> None:
        """Set these keys of the collection's metadata (the others are kept: Qdrant's merge)."""

    def search_batch(
        self,
        name: str,
        vector_name: str,
        vectors: Sequence[VectorLike],
        top_k: int,
        exact: bool = False,
        with_vector: bool = False,
    ) -> list[list[Hit]]:
        """:meth:`search` for each of ``vectors`` (no filter), in one round trip where the backend has a batch call;
        one list of hits per vector, in order. ``with_vector``: each hit carries its ``vector_name`` vector."""
        out = [self.search(name, vector_name, vector, top_k, exact=exact) for vector in vectors]
        if not with_vector:
            return out
        stored = self.get_vectors(name, list({h.id for hits in out for h in hits}), vector_name)
        return [[replace(h, vector=stored.get(h.id)) for h in hits] for hits in out]

    # ---- aliases -------------------------------------------------------------------
    @abstractmethod
    def get_alias(self, alias: str) -> str | None:
        """Collection the alias points to, or None."""

    @abstractmethod
    def set_alias(self, alias: str, collection: str) -> None:
        """Create or atomically move ``alias`` to ``collection``."""

    @abstractmethod
    def delete_alias(self, alias: str) -> bool:
        """Remove an alias; False if it did not exist."""

    @abstractmethod
    def list_aliases(self) -> dict[str, str]:
        """alias -> collection."""

    def exists(self, name_or_alias: str) -> bool:
        """True for a collection or an alias (what readers and writers may address)."""
        return self.get_alias(name_or_alias) is not None or self.collection_exists(name_or_alias)

    def drop(self, name_or_alias: str) -> bool:
        """Delete a collection, or the collection behind an alias (with the alias); False if neither exists."""
        target = self.get_alias(name_or_alias)
        return self.delete_collection(target or name_or_alias)

    def resolve(self, name_or_alias: str) -> str:
        """Collection name behind ``name_or_alias``; CollectionNotFound if neither exists."""
        target = self.get_alias(name_or_alias)
        if target is not None:
            return target
        if self.collection_exists(name_or_alias):
            return name_or_alias
        raise CollectionNotFound(f"no collection or alias named {name_or_alias!r}")

    # ---- maintenance -----------------------------------------------------------------
    def optimize(self, name: str) -> bool:
        """Build indexes now where the backend only does it on request.

        A Qdrant server optimizes in the background, so the default is a no-op.
        """
        return False

    def close(self) -> None:
        """Release files and connections."""

    def __enter__(self) -> "VectorStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
