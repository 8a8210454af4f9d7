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


def test_a_replay_gives_each_consumer_at_most_its_permits() -> None:
    h = Harness()
    try:
        c1 = h.join("c1", 0)
        c2 = h.join("c2", 10)
        d = h.dispatcher
        owner = {k: d.selector.select(d.slot_of_key(k.encode())) for k in KEYS}
        ones = [k for k in KEYS if owner[k] is c1][:6]
        pos = h.publish(*ones)  # read for c2's permits: all wait for c1 in the replay queue
        assert list(d.replay.iter_positions()) == pos
        h.flow("c1", 2)
        assert h.got("c1") == pos[:2]
        assert c1.pending_acks is not None and len(c1.pending_acks) == 2
        h.flow("c1", 4)
        assert h.got("c1") == pos
        assert c2 is not None
    finally:
        h.close()


def test_a_replay_skips_entries_no_consumer_owns() -> None:
    from keyshared.broker.consumer import KeySharedMeta

    h = Harness(mode="STICKY")
    try:
        s1 = h.join("s1", 0, meta=KeySharedMeta("STICKY", [(0, 30000)]))
        h.join("s2", 10, meta=KeySharedMeta("STICKY", [(40000, 65535)]))
        d = h.dispatcher
        slot = {k: d.slot_of_key(k.encode()) for k in KEYS}
        nobody = next(k for k in KEYS if 30000 < slot[k] < 40000)
        mine = next(k for k in KEYS if slot[k] <= 30000)
        p_nobody, p_mine = h.publish(nobody, mine)
        assert list(d.replay.iter_positions()) == [p_nobody, p_mine]
        h.flow("s1", 1)
        assert h.got("s1") == [p_mine]
        assert s1.pending_acks is not None
    finally:
        h.close()
