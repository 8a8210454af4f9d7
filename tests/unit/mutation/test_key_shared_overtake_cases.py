"""A read that completes after an older entry was queued behind it must not overtake that entry
(Pulsar's minReplayedPosition check). A redelivery queued while both a replay read and a normal
read are out is the case the replay queue's per-hash counts cannot see (a nack queues its entry
without a known hash); the simulator lets a nacked entry come late, so only this timeline sees
the order. Kills a mutant that survived ``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from tests.sim.world import payload
from tests.unit.mutation.ks_harness import Harness


def test_a_read_out_when_a_redelivery_is_queued_does_not_overtake_it() -> None:
    with Harness() as h:
        h.join("c1", 10)
        c2 = h.join("c2", 0)
        d = h.dispatcher
        owner = {f"k{i}": d.selector.select(d.slot_of_key(f"k{i}".encode())) for i in range(50)}
        key_a = next(k for k, c in owner.items() if c is h.consumers["c1"])
        key_b = next(k for k, c in owner.items() if c is c2)
        (a0,) = h.publish(key_a)
        (b0,) = h.publish(key_b)  # c2 has no permits: queued
        assert list(d.replay.iter_positions()) == [b0]
        assert d.have_pending_read  # a normal read waits at the tail
        # c2's FLOW starts a replay read of b0; before it completes, c1 nacks a0 (queued with no
        # known hash, behind the replay read already out) and a1 wakes the waiting read.
        c2.add_permits(1)
        d.consumer_flow(c2, 1)
        h.loop.run_one()
        assert d.have_pending_replay_read and d.have_pending_read
        d.redeliver(h.consumers["c1"], None)
        a1 = h.ledger.add_entry(payload(key_a, 1, False))
        h.keys[a1] = key_a
        h.settle()
        assert h.got("c2") == [b0]
        assert h.got("c1") == [a0, a0, a1]
