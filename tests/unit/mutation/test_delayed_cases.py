"""The delayed-delivery tracker on its own: what ``make mutate`` found no test saying of it
(bench/results/mutation/report.md). The simulator never publishes a delayed message."""

from __future__ import annotations

import pytest

from keyshared.broker.dispatch.delayed import DelayedDeliveryTracker
from keyshared.storage.position import Position


def p(entry: int) -> Position:
    return Position(3, entry)


@pytest.mark.parametrize(("tick", "kept"), [(0, 1), (-5, 1), (1, 1), (250, 250)])
def test_the_tick_is_at_least_a_millisecond(tick: int, kept: int) -> None:
    assert DelayedDeliveryTracker(tick).tick_ms == kept


def test_a_position_is_held_once_and_its_first_time_stands() -> None:
    t = DelayedDeliveryTracker(10)
    assert len(t) == 0 and p(1) not in t
    t.add(p(1), 1_000)
    # Added again (read again after a rewind) with an earlier time: still due at the first.
    t.add(p(1), 500)
    assert len(t) == 1 and p(1) in t and p(2) not in t
    assert t.next_due_ms() == 1_000
    assert t.pop_due(999) == []
    assert t.pop_due(1_000) == [p(1)]
    assert len(t) == 0 and p(1) not in t
    assert t.pop_due(10**12) == []


def test_due_entries_come_out_in_position_order_and_the_rest_stay() -> None:
    t = DelayedDeliveryTracker(10)
    t.add(p(5), 100)
    t.add(p(2), 200)
    t.add(p(9), 50)
    t.add(p(7), 300)
    assert t.next_due_ms() == 50
    assert t.pop_due(200) == [p(2), p(5), p(9)]
    assert len(t) == 1 and p(7) in t
    assert t.next_due_ms() == 300


def test_acked_positions_are_forgotten_up_to_and_including() -> None:
    t = DelayedDeliveryTracker(10)
    for e, at in ((1, 40), (2, 10), (3, 30), (4, 20)):
        t.add(p(e), at)
    t.remove_up_to(p(2))
    assert len(t) == 2 and p(2) not in t and p(1) not in t and p(3) in t
    # The heap still has the forgotten ones: they are skipped, never handed out.
    assert t.next_due_ms() == 20
    assert t.pop_due(100) == [p(3), p(4)]
    assert t.next_due_ms() is None
    t.remove_up_to(p(100))  # nothing held: a no-op
    assert len(t) == 0


def test_clear_forgets_everything() -> None:
    t = DelayedDeliveryTracker(10)
    t.add(p(1), 10)
    t.add(p(2), 20)
    t.clear()
    assert len(t) == 0 and t.next_due_ms() is None and t.pop_due(100) == []
    t.add(p(1), 30)  # held again after the clear: not refused as known
    assert t.pop_due(30) == [p(1)]


def test_the_wakeup_is_the_due_time_or_now_when_overdue() -> None:
    t = DelayedDeliveryTracker(100)
    assert t.next_wakeup_ms(1_000) is None
    t.add(p(1), 5_000)  # due in many ticks
    assert t.next_wakeup_ms(1_000) == 5_000
    assert t.next_wakeup_ms(5_000) == 5_000
    # Overdue: wake at once, not a tick (or a millisecond) later.
    assert t.next_wakeup_ms(5_070) == 5_070


def test_wakeups_are_a_tick_apart_and_never_before_the_due_time() -> None:
    """delayedDeliveryTickTimeMillis spaces the timer (Pulsar's lastTickRun + tickTimeMillis):
    an entry due soon after a wake-up waits for the next tick; one due later is woken for on
    time; an overdue one at once."""
    t = DelayedDeliveryTracker(1_000)
    t.add(p(1), 5_000)
    assert t.next_wakeup_ms(1_000) == 5_000  # no wake-up yet: the due time itself
    assert t.pop_due(5_000) == [p(1)]
    t.ticked(5_000)
    t.add(p(2), 5_100)
    assert t.next_wakeup_ms(5_000) == 6_000  # a tick after the last wake-up, not 5,100
    assert t.pop_due(5_099) == []  # never early: the tick only spaces the timer
    t.add(p(3), 7_500)
    assert t.pop_due(6_000) == [p(2)]
    t.ticked(6_000)
    assert t.next_wakeup_ms(6_000) == 7_500  # more than a tick away: on time
    assert t.next_wakeup_ms(7_600) == 7_600  # overdue: at once
