"""The unacked limits' block and unblock rules, on their own (the simulator drives them in
dispatch; tests/integration/test_unacked_limits.py through the client)."""

from __future__ import annotations

from keyshared.broker.dispatch.unacked import SubscriptionUnackedLimit


def test_subscription_blocks_at_the_limit_and_resumes_below_half() -> None:
    limit = SubscriptionUnackedLimit(lambda: 10)
    assert limit.room(0) == 10
    assert limit.update(9) is False and not limit.blocked
    assert limit.room(9) == 1
    assert limit.update(10) is False and limit.blocked
    assert limit.room(10) == 0
    assert limit.update(5) is False and limit.blocked  # half is not enough: fewer than half
    assert limit.room(5) == 0
    assert limit.update(4) is True and not limit.blocked
    assert limit.update(9) is False and not limit.blocked  # no block again before the limit


def test_a_limit_of_one_unblocks_when_nothing_is_held() -> None:
    limit = SubscriptionUnackedLimit(lambda: 1)
    limit.update(1)
    assert limit.blocked
    assert limit.update(0) is True and not limit.blocked


def test_no_limit_never_blocks_and_lifting_it_unblocks() -> None:
    value = [3]
    limit = SubscriptionUnackedLimit(lambda: value[0])
    limit.update(3)
    assert limit.blocked
    value[0] = 0
    assert limit.room(3) is None
    assert limit.update(3) is True and not limit.blocked
    assert limit.update(10**9) is False and not limit.blocked
