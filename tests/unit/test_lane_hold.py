"""A lane held through a sink outage keeps its membership but takes nothing, even across a rebalance."""

from __future__ import annotations

from types import SimpleNamespace

from kafka import TopicPartition

from embedstream.workers.transport.lane import Lane

A, B = TopicPartition("chunks", 0), TopicPartition("chunks", 1)


class RebalancingConsumer:
    """A consumer whose next poll assigns ``B`` (a member left during the hold) and fetches from it."""

    def __init__(self):
        self.assigned, self.paused_set, self.seeks = {A}, set(), []

    def assignment(self):
        return set(self.assigned)

    def paused(self):
        return set(self.paused_set)

    def pause(self, *tps):
        self.paused_set.update(tps)

    def resume(self, *tps):
        self.paused_set.difference_update(tps)

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))

    def poll(self, timeout_ms=0):
        self.assigned.add(B)
        return {B: [SimpleNamespace(topic=B.topic, partition=B.partition, offset=o) for o in (40, 41)]}


def _lane(consumer) -> Lane:
    lane = Lane.__new__(Lane)  # the policy alone: no broker behind it
    lane.consumer, lane.paused = consumer, False
    return lane


def test_records_fetched_while_held_are_fetched_again_and_new_partitions_stay_paused():
    consumer = RebalancingConsumer()
    lane = _lane(consumer)
    held = lane.hold()
    assert held == [A] and consumer.paused() == {A}
    lane.keep_membership()
    assert consumer.seeks == [(B, 40)]  # nothing taken: B's records come again after the hold
    assert consumer.paused() == {A, B}  # the partition assigned during the hold is held too
    lane.release(held)
    assert consumer.paused() == set() and not lane.paused
