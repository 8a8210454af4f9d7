"""Classic Key_Shared redelivery timing the simulator's invariants do not see: each kills mutants
that survived ``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from tests.sim.test_classic_timelines import KEY_A, Timeline


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
