"""Documents in flight (workers/output_stage.py ``DocsInFlight``): held from their batch's lookup until its writes
are done, by doc_id alone; a lookup may wait for a batch that can finish, never for one whose pass is suspended
at the waiter's own checkpoint."""

from __future__ import annotations

import threading

from embedstream.workers.output_stage import DocsInFlight


def test_a_batch_holds_its_documents_from_the_lookup_until_written():
    docs = DocsInFlight(threading.Condition())
    bulk = docs.hold(["a", "b", "a"])  # a bulk batch looked up: its pass runs (and may serve online work)
    assert docs.held() == {"a", "b"} and docs.awaitable() == set()  # a checkpoint's lookup must not wait for it
    online = docs.hold(["a"])  # an online batch served at a checkpoint of that pass
    docs.computed(online)  # handed on: the output stage will write it
    assert docs.awaitable() == {"a"}
    docs.release(online)
    assert docs.held() == {"a", "b"} and docs.awaitable() == set()
    docs.computed(bulk)
    assert docs.awaitable() == {"a", "b"}
    docs.release(bulk)
    docs.release(bulk)  # once only
    assert docs.held() == set() and docs.awaitable() == set()


def test_a_waiter_is_woken_when_the_write_is_done():
    changed = threading.Condition()
    docs = DocsInFlight(changed)
    hold = docs.hold(["d"])
    docs.computed(hold)
    released = threading.Timer(0.2, docs.release, [hold])
    released.start()
    with changed:
        assert changed.wait_for(lambda: "d" not in docs.awaitable(), 10)
    released.join()
