"""Classic Key_Shared redelivery timing the simulator's invariants do not see: each kills mutants
that survived ``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from keyshared.storage.position import EARLIEST
from tests.sim.test_classic_timelines import KEY_A, KEY_B, Timeline
from tests.sim.world import payload


def test_a_nacked_entry_goes_again_at_once_when_permits_come_with_it() -> None:
    # A nack, then a FLOW before the loop runs: the replay must not be skipped for a read
    # ahead, which finds nothing at the tail and waits there until the next publish.
    t = Timeline("last_sent")
    try:
        c1 = t.join("c1", 2)
        a0 = t.publish(KEY_A)
        t.publish(KEY_A)
        assert len(t.positions_of("c1", KEY_A)) == 2  # c1 is out of permits now
        t.sub.redeliver_unacknowledged(c1, [a0])
        c1.add_permits(2)
        assert t.sub.dispatcher is not None
        t.sub.dispatcher.consumer_flow(c1, 2)
        t.settle()
        assert t.positions_of("c1", KEY_A)[2:] == [a0]
    finally:
        t.close()


def test_after_a_reset_cursor_a_held_back_entry_goes_with_the_next_flow() -> None:
    # A reset-cursor starts afresh: no replay round came up empty before it, so the first
    # replay after it must not be skipped for a read ahead (which waits at the tail).
    t = Timeline("last_sent")
    try:
        t.ledger.add_entry(payload(KEY_A, 1, False))
        t.ledger.add_entry(payload(KEY_B, 2, False))  # a batch: takes both of c2's permits
        a1 = t.ledger.add_entry(payload(KEY_A, 1, False))
        t.sub.reset_cursor(EARLIEST)
        c1, c2 = t.join("c1", 0), t.join("c2", 0)
        d = t.sub.dispatcher
        assert d is not None
        c1.add_permits(1)
        d.consumer_flow(c1, 1)
        c2.add_permits(2)
        d.consumer_flow(c2, 2)
        t.settle()
        # One read of all three: c1 took a0, c2 the batch; a1 waits for c1's permits.
        assert len(t.positions_of("c1", KEY_A)) == 1 and len(t.positions_of("c2", KEY_B)) == 1
        c1.add_permits(1)
        d.consumer_flow(c1, 1)
        t.settle()
        assert t.positions_of("c1", KEY_A)[1:] == [a1]
    finally:
        t.close()
