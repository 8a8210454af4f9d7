"""Draining-tracker cases the simulator cannot see: each kills mutants that survived ``make
mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

import pytest

from keyshared.broker.dispatch.draining import DrainingHashesTracker, DrainingStateError
from keyshared.broker.dispatch.selectors import ImpactedRanges, RangeMove


@pytest.mark.parametrize("call", ["add_entry", "may_add_pending_ack"])
def test_hash_zero_is_refused_with_pulsars_message(call: str) -> None:
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker(name="sub")
    with pytest.raises(ValueError) as err:
        getattr(tracker, call)("c1", 0)
    assert str(err.value) == "Sticky hash cannot be 0"


def test_reducing_without_saying_closing_runs_the_unblocking_handler() -> None:
    # closing defaults to False: an ack of the last entry of a blocked hash unblocks it.
    calls: list[int] = []
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker(calls.append, name="sub")
    tracker.add_entry("c1", 7)
    assert tracker.should_block_sticky_key_hash("c2", 7)
    tracker.reduce_ref_count("c1", 7)
    assert calls == [7]


def test_a_reduction_by_another_consumer_is_refused_with_pulsars_message() -> None:
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker(name="disp")
    tracker.add_entry("c1", 7)
    with pytest.raises(DrainingStateError) as err:
        tracker.reduce_ref_count("c2", 7)
    assert str(err.value) == (
        "Consumer 'c1' is already draining hash 7 in dispatcher disp. "
        "Same hash being used for consumer 'c2'."
    )


def test_cleared_total_counts_every_hash_that_stopped_draining() -> None:
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker(name="sub")
    for sticky_hash in (3, 5, 9):
        tracker.add_entry("c1", sticky_hash)
    tracker.reduce_ref_count("c1", 3)
    tracker.reduce_ref_count("c1", 5)
    stats = tracker.consumer_stats("c1")
    assert stats.draining_hashes_cleared_total == 2
    assert stats.draining_hashes_count == 1


def test_a_hash_its_drainer_is_given_again_leaves_the_drainers_list() -> None:
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker(name="sub")
    tracker.add_entry("c1", 3)
    tracker.add_entry("c1", 5)
    assert not tracker.should_block_sticky_key_hash("c1", 5)
    assert tracker.draining_hashes_of("c1") == [3]
    assert tracker.consumer_stats("c1").draining_hashes_cleared_total == 1


def test_a_hash_moving_back_to_its_drainer_leaves_the_drainers_list() -> None:
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker(name="sub")
    pending = {"c1": [5, 5, 12], "c2": []}
    tracker.register_draining_hashes(
        ImpactedRanges.from_moves([RangeMove(1, 20, "c1", "c2")]), pending.__getitem__
    )
    assert tracker.draining_hashes_of("c1") == [5, 12]
    tracker.register_draining_hashes(
        ImpactedRanges.from_moves([RangeMove(1, 10, "c2", "c1")]), pending.__getitem__, skip="c2"
    )
    assert tracker.draining_hashes_of("c1") == [12]


def test_a_tracker_made_without_a_name_has_an_empty_one() -> None:
    tracker: DrainingHashesTracker[str] = DrainingHashesTracker()
    assert tracker.name == ""
    tracker.add_entry("c1", 7)
    with pytest.raises(DrainingStateError, match=r"in dispatcher \. Same hash"):
        tracker.add_entry("c2", 7)
