"""Pick a VectorStore from configuration, so callers never branch on backends."""

from __future__ import annotations

import os
from pathlib import Path

from .base import VectorStore

DEFAULT_EDGE_PATH = "~/.local/share/embedstream/qdrant-edge"
PATH_ENV = "EMBEDSTREAM_QDRANT_PATH"


def default_edge_path() -> Path:
    """``$EMBEDSTREAM_QDRANT_PATH`` or ``~/.local/share/embedstream/qdrant-edge``."""
    return Path(os.environ.get(PATH_ENV) or DEFAULT_EDGE_PATH).expanduser()


def open_store(
    url: str | None = None,
    api_key: str | None = None,
    path: str | os.PathLike[str] | None = None,
    *,
    timeout: float | None = 30.0,
) -> VectorStore:
    """Open the configured store.

    - ``url`` http(s)://...  -> Qdrant server via qdrant-client (production)
    - ``url == ":memory:"``  -> qdrant-client in-memory mode (tests, throw-away)
    - otherwise              -> embedded qdrant-edge store at ``path`` (default:
      see :func:`default_edge_path`)
    """
    if url == ":memory:":
        from .qdrant_client_store import QdrantClientStore

        return QdrantClientStore.in_memory()
    if url:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Qdrant url must start with http:// or https:// (or be ':memory:'), got {url!r}")
        from .qdrant_client_store import QdrantClientStore

        return QdrantClientStore.connect(url, api_key=api_key, timeout=timeout)
    from .edge_store import EdgeStore

    return EdgeStore(Path(path).expanduser() if path else default_edge_path())
