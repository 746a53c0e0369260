"""Workers running in a thread of the test process, for the broker tests."""

from __future__ import annotations

import threading

from embedstream.workers.runtime import build_embed_worker


class Running:
    """Any worker (embed, rerank, CDC bridge) in a daemon thread; stopped and joined on exit."""

    def __init__(self, worker):
        self.worker = worker
        self.thread = threading.Thread(target=worker.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self.worker

    def __exit__(self, *exc):
        self.worker.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the worker did not stop within 60 s"


class RunningWorker(Running):
    """An embed worker on ``lanes`` over ``store``."""

    def __init__(self, settings, engine, store, lanes=("online", "bulk")):
        super().__init__(build_embed_worker(settings, lanes, store=store, engine=engine))
