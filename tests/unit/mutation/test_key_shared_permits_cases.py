"""One read serves several consumers: each gets at most its permits, in order, and what is over
waits in the replay queue for its next FLOW. Each case kills mutants that survived ``make
mutate`` (bench/results/mutation/report.md).
"""

from __future__ import annotations

from tests.unit.mutation.ks_harness import Harness

KEYS = [f"k{i}" for i in range(40)]


def test_a_read_gives_each_consumer_at_most_its_permits() -> None:
    h = Harness()
    try:
        c1 = h.join("c1", 0)
        c2 = h.join("c2", 0)
        d = h.dispatcher
        owner = {k: d.selector.select(d.slot_of_key(k.encode())) for k in KEYS}
        ones = [k for k in KEYS if owner[k] is c1][:6]
        twos = [k for k in KEYS if owner[k] is c2][:6]
        h.flow("c1", 2)
        h.flow("c2", 10)
        # One read takes all twelve entries: c1's permits cover two of its six.
        pos = h.publish(*ones, *twos)
        assert h.got("c1") == pos[:2]
        assert h.got("c2") == pos[6:]
        assert c1.pending_acks is not None and len(c1.pending_acks) == 2
        assert [p for p in d.replay.iter_positions()] == pos[2:6]
        h.flow("c1", 4)
        assert h.got("c1") == pos[:6]
        assert c2.pending_acks is not None and len(c2.pending_acks) == 6
    finally:
        h.close()
