"""Classic Key_Shared's choice between replaying and reading ahead, where a wrong choice only
delays an entry until the next publish (no ordering invariant sees it): each kills mutants that
survived ``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from keyshared.broker.dispatch.key_shared import KeySharedDispatcher
from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher
from tests.sim.test_classic_timelines import EACH_READ_AHEAD_SKIP_FLAG, KEY_A, KEY_B, Timeline
from tests.sim.world import payload


def _classic(t: Timeline) -> ClassicKeySharedDispatcher:
    d = t.sub.dispatcher
    assert isinstance(d, ClassicKeySharedDispatcher)
    return d


def _key_shared(t: Timeline) -> KeySharedDispatcher:
    d = t.sub.dispatcher
    assert isinstance(d, KeySharedDispatcher)
    return d


def _flow(t: Timeline, permits: dict[str, int]) -> None:
    """FLOWs of several consumers before the loop runs, then settle."""
    d = _key_shared(t)
    for name, n in permits.items():
        t.consumers[name].add_permits(n)
        d.consumer_flow(t.consumers[name], n)
    t.settle()


def _a1_queued_behind_c1s_permits(t: Timeline) -> None:
    """One read of a0, a two-message batch of key b, a1: a0 -> c1 and the batch -> c2 use up
    every permit, so a1 is queued and no read is out (nothing may be read)."""
    t.ledger.add_entry(payload(KEY_A, 1, False))
    t.ledger.add_entry(payload(KEY_B, 2, False))
    t.ledger.add_entry(payload(KEY_A, 1, False))
    t.join("c1", 0)
    t.join("c2", 0)
    _flow(t, {"c1": 1, "c2": 2})
    assert len(t.positions_of("c1", KEY_A)) == 1 and len(t.positions_of("c2", KEY_B)) == 1
    d = _key_shared(t)
    assert len(d.replay) == 1 and not d.have_pending_read


def test_the_first_replay_after_start_up_is_not_skipped_for_a_read_ahead() -> None:
    # No replay round has come up empty yet: the first one must replay, not read ahead (which
    # finds nothing at the tail and waits there until the next publish).
    t = Timeline("last_sent")
    try:
        _a1_queued_behind_c1s_permits(t)
        a1 = next(iter(_classic(t).replay.iter_positions()))
        _flow(t, {"c1": 1})
        assert t.positions_of("c1", KEY_A)[1:] == [a1]
    finally:
        t.close()


def test_the_read_ahead_skip_is_used_once_then_the_replay_goes() -> None:
    # After a replay round that sent nothing, the next round reads ahead instead, once: the
    # read ahead after it must not skip the replay again, else a1 (its consumer has a permit)
    # waits behind a read parked at the tail until the next publish.
    t = Timeline("last_sent")
    try:
        _a1_queued_behind_c1s_permits(t)
        d = _classic(t)
        a1 = next(iter(d.replay.iter_positions()))
        b1 = t.ledger.add_entry(payload(KEY_B, 1, False))  # something to read ahead
        d._stuck_on_replays = True  # a replay round just sent nothing
        _flow(t, {"c1": 1, "c2": 1})
        assert t.positions_of("c2", KEY_B)[1:] == [b1]
        assert t.positions_of("c1", KEY_A)[1:] == [a1]
    finally:
        t.close()


def test_no_normal_read_while_only_recently_joined_consumers_have_permits() -> None:
    # Pulsar's hasConsumersNeededNormalRead: what a read would bring now could only be queued
    # (c1 has no permits, c3 may not take anything after its join position), so nothing is
    # read until c1 acks (and has permits again).
    t = Timeline("last_sent")
    try:
        t.join("c1", 1)
        a0 = t.publish(KEY_A)
        assert t.positions_of("c1", KEY_A) == [a0]
        t.join("c3", 1000)
        d = _classic(t)
        assert list(d.recently_joined or {}) == [t.consumers["c3"]]
        b0 = t.publish(KEY_B)
        assert t.sub.cursor.read_position == b0, "nothing was read"
        assert len(d.replay) == 0
        t.ack_all("c1")
        _flow(t, {"c1": 1})
        t.wait_until(lambda: t.positions_of("c1", KEY_B) + t.positions_of("c3", KEY_B) == [b0])
    finally:
        t.close()


@EACH_READ_AHEAD_SKIP_FLAG
def test_no_read_ahead_skip_at_the_tail_of_the_topic(dispatcher: str, flag: str) -> None:
    # After a replay round that sent nothing the next round skips the replay to read ahead; at
    # the tail there is nothing to read ahead, so the skip only parked a read there, and a1 (its
    # consumer has just got a permit) waited in the queue until the next publish.
    t = Timeline(dispatcher)
    try:
        _a1_queued_behind_c1s_permits(t)
        d = _key_shared(t)
        assert hasattr(d, flag)
        a1 = next(iter(d.replay.iter_positions()))
        assert not d.cursor.has_more_entries() and not d.have_pending_read
        setattr(d, flag, True)  # a replay round just sent nothing
        _flow(t, {"c1": 1})
        assert t.positions_of("c1", KEY_A)[1:] == [a1]
    finally:
        t.close()
