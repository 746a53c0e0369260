"""Vector store layer: one contract (:class:`VectorStore`), three ways to run Qdrant.

- :class:`QdrantClientStore`: Qdrant server (production) or qdrant-client ``:memory:`` (tests)
- :class:`EdgeStore`: qdrant-edge, Qdrant's engine embedded in-process (single machine default)
- :func:`open_store`: choose one from url / path configuration

Backends are imported lazily so importing the contract does not load either engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    AliasError,
    CollectionConfigMismatch,
    CollectionNotFound,
    Hit,
    Point,
    Prefetch,
    SparseSpec,
    SparseVector,
    VectorSpec,
    VectorStore,
    VectorStoreError,
)
from .factory import default_edge_path, open_store

if TYPE_CHECKING:
    from .edge_store import EdgeStore
    from .qdrant_client_store import QdrantClientStore

__all__ = [
    "AliasError",
    "CollectionConfigMismatch",
    "CollectionNotFound",
    "EdgeStore",
    "Hit",
    "Point",
    "Prefetch",
    "QdrantClientStore",
    "SparseSpec",
    "SparseVector",
    "VectorSpec",
    "VectorStore",
    "VectorStoreError",
    "default_edge_path",
    "open_store",
]


def __getattr__(name: str) -> Any:
    if name == "EdgeStore":
        from .edge_store import EdgeStore

        return EdgeStore
    if name == "QdrantClientStore":
        from .qdrant_client_store import QdrantClientStore

        return QdrantClientStore
    raise AttributeError(name)
