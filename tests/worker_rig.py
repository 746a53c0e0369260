"""An embed worker running in a thread of the test process, for the broker tests."""

from __future__ import annotations

import threading

from embedstream.workers.runtime import build_embed_worker


class RunningWorker:
    def __init__(self, settings, engine, store, lanes=("online", "bulk")):
        self.worker = build_embed_worker(settings, lanes, store=store, engine=engine)
        self.thread = threading.Thread(target=self.worker.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.worker

    def __exit__(self, *exc):
        self.worker.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the worker did not stop within 60 s"
