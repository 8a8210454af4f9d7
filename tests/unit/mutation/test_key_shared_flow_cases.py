"""Entries queued for replay go out as soon as their consumer has permits: no stale "skip the
replay once" state may park them behind a normal read waiting at the tail of the topic (where
they would wait for the next publish). Each case kills mutants that survived ``make mutate``
(bench/results/mutation/report.md); the simulator publishes often enough to hide the stall.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.mutation.ks_harness import Harness

KEYS = [f"k{i}" for i in range(40)]


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def test_nacked_entries_go_again_once_the_consumer_flows(h: Harness) -> None:
    h.join("c1", 2)
    p1, p2 = h.publish("a", "b")
    assert h.got("c1") == [p1, p2]  # no permits left: no read waits at the tail
    h.sub.redeliver_unacknowledged(h.consumers["c1"], None)
    h.settle()
    h.flow("c1", 2)
    assert h.got("c1") == [p1, p2, p1, p2]


def test_what_a_leaving_consumer_held_goes_to_the_other_once_it_flows(h: Harness) -> None:
    c1 = h.join("c1", 0)
    h.join("c2", 0)
    d = h.dispatcher
    keys = KEYS[:10]
    mine = {k: d.selector.select(d.slot_of_key(k.encode())) for k in keys}
    n1 = sum(1 for k in keys if mine[k] is c1)
    assert 0 < n1 < len(keys)
    # Exactly the permits each needs: once all is delivered, no read waits at the tail.
    h.flow("c1", n1)
    h.flow("c2", len(keys) - n1)
    pos = h.publish(*keys)
    held = h.held("c1")
    assert len(held) == n1 and len(h.got("c2")) == len(keys) - n1
    h.leave("c1")
    h.flow("c2", n1)
    assert sorted(h.got("c2")) == pos
