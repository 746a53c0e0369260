"""Tiny readers-writer lock.

The edge store lets searches run concurrently with each other and with upserts,
but closing/deleting a shard must wait until no reader still holds it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    """Many readers or one writer; writers are preferred so they are not starved."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._owner: int | None = None

    @contextmanager
    def read(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:  # the writer may read what it holds
            yield
            return
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        me = threading.get_ident()
        if self._owner == me:  # re-entrant for the owning thread
            yield
            return
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
            self._owner = me
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._owner = None
                self._cond.notify_all()
