"""A store wrapper that serialises every call: qdrant-client's local (":memory:") mode is not
thread-safe, and tests and benchmarks read it while a worker thread writes."""

from __future__ import annotations

import threading
from typing import Any


class LockedStore:
    """Delegates every attribute to ``store``; callables run under one re-entrant lock."""

    def __init__(self, store: Any):
        self._store = store
        self._lock = threading.RLock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def locked(*args, **kwargs):
            with self._lock:
                return attr(*args, **kwargs)

        return locked
