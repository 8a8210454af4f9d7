"""DrainingHashesTracker: Pulsar's DrainingHashesTrackerTest (row 32), stats, and our additions."""

from __future__ import annotations

import pytest
from ks_dispatch_helpers import FakeConsumer

from keyshared.broker.dispatch.draining import (
    BATCH_UNBLOCKED,
    DrainingHashesStats,
    DrainingHashesTracker,
    DrainingStateError,
    HashBlocker,
)
from keyshared.broker.dispatch.pending_acks import PendingAcksMap
from keyshared.broker.dispatch.selectors import (
    ConsistentHashingStickyKeyConsumerSelector,
    ImpactedRanges,
    RangeMove,
    RemovedHashRanges,
)

Tracker = DrainingHashesTracker[FakeConsumer]


def make() -> tuple[Tracker, list[int], FakeConsumer, FakeConsumer]:
    calls: list[int] = []
    return Tracker(calls.append, "dispatcher1"), calls, FakeConsumer("c1"), FakeConsumer("c2")


# --- ports of DrainingHashesTrackerTest -------------------------------------------------------


def test_add_entry_adds_new_entry() -> None:
    tracker, _, c1, _ = make()
    tracker.add_entry(c1, 1)
    entry = tracker.get_entry(1)
    assert entry is not None and entry.consumer is c1 and entry.ref_count == 1


def test_add_entry_rejects_zero_hash() -> None:
    tracker, _, c1, _ = make()
    with pytest.raises(ValueError):
        tracker.add_entry(c1, 0)


def test_reduce_ref_count_removes_entry_at_zero() -> None:
    tracker, _, c1, _ = make()
    tracker.add_entry(c1, 1)
    tracker.reduce_ref_count(c1, 1, False)
    assert tracker.get_entry(1) is None


def test_reduce_ref_count_refuses_other_consumer() -> None:
    tracker, _, c1, c2 = make()
    tracker.add_entry(c1, 1)
    with pytest.raises(DrainingStateError):
        tracker.reduce_ref_count(c2, 1, False)
    entry = tracker.get_entry(1)
    assert entry is not None and entry.consumer is c1


def test_add_entry_refuses_other_consumer() -> None:
    tracker, _, c1, c2 = make()
    tracker.add_entry(c1, 7)
    with pytest.raises(DrainingStateError, match="already draining hash 7"):
        tracker.add_entry(c2, 7)


def test_should_block_same_consumer_is_false_and_reclaims() -> None:
    tracker, calls, c1, _ = make()
    tracker.add_entry(c1, 1)
    assert tracker.should_block_sticky_key_hash(c1, 1) is False
    assert tracker.get_entry(1) is None
    stats = tracker.consumer_stats(c1)
    assert (stats.draining_hashes_count, stats.draining_hashes_cleared_total) == (0, 1)
    assert calls == []


def test_should_block_other_consumer_is_true_and_counts() -> None:
    tracker, _, c1, c2 = make()
    tracker.add_entry(c1, 1)
    assert tracker.should_block_sticky_key_hash(c2, 1) is True
    assert tracker.should_block_sticky_key_hash(c2, 1) is True
    entry = tracker.get_entry(1)
    assert entry is not None and entry.blocked_count == 2


def test_should_block_new_hash_is_false() -> None:
    tracker, _, c1, _ = make()
    assert tracker.should_block_sticky_key_hash(c1, 1) is False
    assert tracker.should_block_sticky_key_hash(c1, 0) is False


def test_batches_nest_and_report_minus_one_at_the_end() -> None:
    tracker, calls, c1, c2 = make()
    tracker.add_entry(c1, 1)
    tracker.start_batch()
    tracker.start_batch()
    assert tracker.should_block_sticky_key_hash(c2, 1)
    tracker.reduce_ref_count(c1, 1, False)
    assert calls == []
    tracker.end_batch()
    assert calls == []
    tracker.end_batch()
    assert calls == [BATCH_UNBLOCKED]
    with tracker.batch():
        pass
    assert calls == [BATCH_UNBLOCKED]


def test_clear_removes_all_entries() -> None:
    tracker, _, c1, _ = make()
    tracker.add_entry(c1, 1)
    tracker.clear()
    assert tracker.get_entry(1) is None and len(tracker) == 0
    assert tracker.consumer_stats(c1) == DrainingHashesStats()


def test_unblocking_handler_gets_the_hash() -> None:
    tracker, calls, c1, c2 = make()
    tracker.add_entry(c1, 1)
    tracker.should_block_sticky_key_hash(c2, 1)
    tracker.reduce_ref_count(c1, 1, False)
    assert calls == [1]


def test_unblocking_handler_not_called_when_closing_or_never_blocked() -> None:
    tracker, calls, c1, c2 = make()
    tracker.add_entry(c1, 1)
    tracker.should_block_sticky_key_hash(c2, 1)
    tracker.reduce_ref_count(c1, 1, True)
    tracker.add_entry(c1, 2)
    tracker.reduce_ref_count(c1, 2, False)  # nobody was refused: nothing to wake up
    assert calls == []


# --- stats -----------------------------------------------------------------------------------


def test_consumer_stats_match_pulsar_fields() -> None:
    tracker, _, c1, c2 = make()
    for h in (45436, 2862, 2862, 11707):
        tracker.add_entry(c1, h)
    for _ in range(5):
        tracker.should_block_sticky_key_hash(c2, 2862)
    stats = tracker.consumer_stats(c1)
    assert stats.to_json() == {
        "drainingHashesCount": 3,
        "drainingHashesClearedTotal": 0,
        "drainingHashesUnackedMessages": 4,
        "drainingHashes": [
            {"hash": 2862, "unackMsgs": 2, "blockedAttempts": 5},
            {"hash": 11707, "unackMsgs": 1, "blockedAttempts": 0},
            {"hash": 45436, "unackMsgs": 1, "blockedAttempts": 0},
        ],
    }
    tracker.reduce_ref_count(c1, 11707, False)
    tracker.reduce_ref_count(c1, 2862, False)
    stats = tracker.consumer_stats(c1)
    assert stats.draining_hashes_count == 2
    assert stats.draining_hashes_cleared_total == 1
    assert stats.draining_hashes_unacked_messages == 2
    assert tracker.consumer_stats(c2).to_json()["drainingHashes"] == []
    tracker.consumer_removed(c1)
    assert tracker.consumer_stats(c1) == DrainingHashesStats()


def test_blocker_of_and_would_block_have_no_side_effects() -> None:
    tracker, _, c1, c2 = make()
    tracker.add_entry(c1, 99, count=3)
    assert tracker.would_block(c2, 99) and not tracker.would_block(c1, 99)
    assert tracker.blocker_of(99) == HashBlocker(99, c1, 3, 0)
    assert tracker.blocker_of(100) is None
    entry = tracker.get_entry(99)
    assert entry is not None and entry.blocked_count == 0 and 99 in tracker
    assert tracker.may_add_pending_ack(c1, 99) and not tracker.may_add_pending_ack(c2, 99)
    assert tracker.may_add_pending_ack(c2, 100)
    with pytest.raises(ValueError):
        tracker.may_add_pending_ack(c2, 0)


# --- registering draining hashes -------------------------------------------------------------


def test_start_draining_counts_pending_entries_in_removed_ranges() -> None:
    tracker, _, c1, _ = make()
    removed = RemovedHashRanges([(10, 20), (40, 50)])
    n = tracker.start_draining_hashes_for_consumer(c1, removed, [10, 10, 15, 30, 50, 0, 51])
    assert n == 3
    assert tracker.draining_hashes_of(c1) == [10, 15, 50]
    entry = tracker.get_entry(10)
    assert entry is not None and entry.ref_count == 2


def test_registering_the_same_hash_twice_does_not_double_count() -> None:
    # Pulsar adds again here; the hash would then never reach zero.
    tracker, calls, c1, c2 = make()
    removed = RemovedHashRanges([(1, 100)])
    tracker.start_draining_hashes_for_consumer(c1, removed, [5, 5])
    tracker.should_block_sticky_key_hash(c2, 5)
    tracker.start_draining_hashes_for_consumer(c1, removed, [5, 5])
    entry = tracker.get_entry(5)
    assert entry is not None and entry.ref_count == 2 and entry.blocked_count == 1
    tracker.reduce_ref_count(c1, 5, False)
    tracker.reduce_ref_count(c1, 5, False)
    assert tracker.get_entry(5) is None and calls == [5]


def test_register_draining_hashes_skips_the_changed_consumer() -> None:
    tracker, _, c1, c2 = make()
    impacted = ImpactedRanges.from_moves([RangeMove(1, 10, c1, c2), RangeMove(11, 20, c2, c1)])
    pending = {c1: [3, 3, 12], c2: [15]}
    tracker.register_draining_hashes(impacted, pending.__getitem__, skip=c2)
    assert tracker.draining_hashes_of(c1) == [3]
    assert tracker.draining_hashes_of(c2) == []


def test_hash_moving_back_to_its_drainer_stops_draining() -> None:
    tracker, calls, c1, c2 = make()
    tracker.register_draining_hashes(
        ImpactedRanges.from_moves([RangeMove(1, 10, c1, c2)]), {c1: [5, 5]}.__getitem__
    )
    assert tracker.should_block_sticky_key_hash(c2, 5)
    # c2 leaves and the range returns to c1: nothing to wait for any more.
    tracker.register_draining_hashes(
        ImpactedRanges.from_moves([RangeMove(1, 10, c2, c1)]), {c2: []}.__getitem__, skip=c2
    )
    assert tracker.get_entry(5) is None
    assert tracker.consumer_stats(c1).draining_hashes_cleared_total == 1
    assert calls == []


def test_blocker_of_lists_the_unacked_positions_holding_the_hash() -> None:
    tracker, _, c1, c2 = make()
    pending = PendingAcksMap[FakeConsumer, tuple[int, int]](c1, remove_handler=tracker)
    for entry, h in [(4, 9), (1, 9), (2, 8), (3, 9)]:
        pending.add_pending_ack_if_allowed((1, entry), 1, h)
    impacted = ImpactedRanges.from_moves([RangeMove(9, 9, c1, c2)])
    tracker.register_draining_hashes(impacted, lambda c: pending.sticky_hashes())
    lookup = {c1: pending}.get
    blocker = tracker.blocker_of(9, lookup)
    assert blocker == HashBlocker(9, c1, 3, 0, ((1, 1), (1, 3), (1, 4)))
    pending.remove((1, 3))
    blocker = tracker.blocker_of(9, lookup)
    assert blocker is not None and blocker.positions == ((1, 1), (1, 4))
    assert tracker.blocker_of(8, lookup) is None


def test_ordering_when_adding_consumers_scenario() -> None:
    """Row 11 at unit level: c1 holds keys 0..9, c2 joins, c2 is blocked until c1 leaves."""
    selector = ConsistentHashingStickyKeyConsumerSelector[FakeConsumer](100)
    calls: list[int] = []
    tracker = Tracker(calls.append)
    c1, c2 = FakeConsumer("c1"), FakeConsumer("c2")
    acks: dict[FakeConsumer, PendingAcksMap[FakeConsumer, tuple[int, int]]] = {}

    def attach(c: FakeConsumer) -> None:
        impacted = selector.add_consumer(c)
        acks[c] = PendingAcksMap(c, lambda x, _pos, h: tracker.may_add_pending_ack(x, h), tracker)
        tracker.register_draining_hashes(impacted, lambda x: acks[x].sticky_hashes(), skip=c)

    attach(c1)
    hashes = [selector.sticky_key_hash(str(i).encode()) for i in range(10)]
    for i, h in enumerate(hashes):
        assert selector.select(h) is c1
        assert acks[c1].add_pending_ack_if_allowed((1, i), 1, h)
    attach(c2)
    moved = [h for h in hashes if selector.select(h) is c2]
    assert moved, "some keys must move to c2 for the scenario to mean anything"
    for h in moved:
        assert tracker.should_block_sticky_key_hash(c2, h)
        assert not acks[c2].add_pending_ack_if_allowed((2, h), 1, h)
    assert tracker.consumer_stats(c1).draining_hashes_count == len(set(moved))
    # c1 leaves: its entries are handed back, draining ends without waking anybody.
    impacted = selector.remove_consumer(c1)
    handed_back = acks[c1].for_each_and_close()
    tracker.register_draining_hashes(impacted, lambda x: acks[x].sticky_hashes(), skip=c1)
    tracker.consumer_removed(c1)
    assert [a.position for a in handed_back] == [(1, i) for i in range(10)]
    assert len(tracker) == 0 and calls == []
    for h in hashes:
        assert not tracker.should_block_sticky_key_hash(c2, h)
