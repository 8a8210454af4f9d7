"""The subscription's unacked limit: what ``make mutate`` found no test saying of it
(bench/results/mutation/report.md)."""

from __future__ import annotations

from keyshared.broker.dispatch.unacked import SubscriptionUnackedLimit


def test_an_odd_limit_unblocks_below_its_half_rounded_down() -> None:
    # Pulsar compares with maxUnackedMessages / 2 in Java's integer division: 7 unblocks at 2.
    limit = SubscriptionUnackedLimit(lambda: 7)
    limit.update(7)
    assert limit.blocked
    assert limit.update(3) is False and limit.blocked
    assert limit.update(2) is True and not limit.blocked


def test_a_limit_of_one_leaves_room_for_one_message() -> None:
    limit = SubscriptionUnackedLimit(lambda: 1)
    assert limit.room(0) == 1
    limit.update(1)
    assert limit.room(1) == 0


def test_no_room_past_the_limit_even_before_it_blocks() -> None:
    # room() is asked with a count the limit has not seen yet (update runs on the next read).
    limit = SubscriptionUnackedLimit(lambda: 10)
    assert not limit.blocked
    assert limit.room(10) == 0 and limit.room(12) == 0


def test_blocked_is_a_boolean_before_and_after_a_block() -> None:
    # It is the stats' blockedSubscriptionOnUnackedMsgs: JSON false, never null.
    limit = SubscriptionUnackedLimit(lambda: 2)
    assert limit.blocked is False
    limit.update(2)
    assert limit.blocked is True
    assert limit.update(0) is True
    assert limit.blocked is False
