"""Token buckets, publish throttling and dispatch budgets (broker/throttle.py), on a fake clock."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from keyshared.broker.throttle import (
    DispatchThrottle,
    PublishLimits,
    PublishRateLimiter,
    Rate,
    SharedDispatchLimiters,
    TokenBucket,
)


class Clock:
    """A clock the test moves, and the timers it fires."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None]]] = []

    def __call__(self) -> float:
        return self.now

    def schedule(self, delay: float, callback: Callable[[], None]) -> object:
        assert delay >= 0
        self.timers.append((self.now + delay, callback))
        return None

    def advance(self, seconds: float) -> None:
        """Move time on, firing due timers in order."""
        end = self.now + seconds
        while True:
            due = sorted((t for t in self.timers if t[0] <= end), key=lambda t: t[0])
            if not due:
                break
            when, callback = due[0]
            self.timers.remove(due[0])
            self.now = max(self.now, when)
            callback()
        self.now = end


class Conn:
    """A connection that counts its throttles."""

    def __init__(self) -> None:
        self.holds = 0

    @property
    def conn(self) -> object:
        return self

    def throttle(self) -> None:
        self.holds += 1

    def unthrottle(self) -> None:
        assert self.holds > 0
        self.holds -= 1


def test_bucket_starts_full_refills_at_its_rate_and_caps() -> None:
    clock = Clock()
    bucket = TokenBucket(100, clock)
    assert bucket.tokens == 100
    assert bucket.consume(60) and bucket.tokens == 40
    clock.now += 0.5
    assert bucket.tokens == pytest.approx(90)
    clock.now += 5
    assert bucket.tokens == 100  # never more than one period's worth


def test_overdraft_is_paid_back_by_a_longer_pause() -> None:
    clock = Clock()
    bucket = TokenBucket(10, clock, resolution=0.016)
    assert not bucket.consume(15)  # 10 held, 15 taken: -5
    assert bucket.tokens == -5
    # Back to one token (10/s * 16 ms < 1): 6 tokens at 10/s.
    assert bucket.throttling_duration() == pytest.approx(0.6)
    clock.now += 0.6
    assert bucket.throttling_duration() == pytest.approx(0.0, abs=1e-9)


def test_rate_per_period_and_resolution() -> None:
    clock = Clock()
    bucket = TokenBucket(1000, clock, period=10, resolution=0.05)
    assert bucket.per_second == 100
    assert bucket.target == 5  # 100/s * 50 ms
    bucket.consume(1000)
    assert bucket.throttling_duration() == pytest.approx(0.05)
    with pytest.raises(ValueError):
        TokenBucket(0, clock)


def test_publish_limiter_throttles_and_lifts_when_refilled() -> None:
    clock = Clock()
    limiter = PublishRateLimiter(Rate(msgs=100), clock, clock.schedule)
    conn = Conn()
    for _ in range(99):
        assert not limiter.on_publish(conn, 1, 10)
    assert limiter.on_publish(conn, 1, 10)  # the 100th empties the bucket
    assert conn.holds == 1 and limiter.limited_times == 1
    assert limiter.held() == {id(conn)}
    clock.advance(0.005)
    assert conn.holds == 1
    clock.advance(0.02)  # one token back (100/s: 10 ms), past the 16 ms resolution
    assert conn.holds == 0 and limiter.throttled == 0 and limiter.held() == set()


def test_publish_rate_is_kept_over_time() -> None:
    """A sender that sends whenever it is not throttled gets rate * time, plus one bucket."""
    clock = Clock()
    limits = PublishLimits(clock, clock.schedule)
    conn = Conn()
    rate = Rate(msgs=200)
    sent = 0
    while clock.now < 3.0:
        if conn.holds == 0:
            limits.on_publish("t", rate, conn, 1, 100)
            sent += 1
        else:
            clock.advance(0.001)
    assert 200 + 600 - 5 <= sent <= 200 + 600 + 5
    assert limits.limited_times("t") > 0


def test_byte_rate_and_batches() -> None:
    clock = Clock()
    limits = PublishLimits(clock, clock.schedule)
    conn = Conn()
    rate = Rate(bytes=1000)
    limits.on_publish("t", rate, conn, 10, 1500)  # one batch of 10 overdraws by 500 bytes
    assert conn.holds == 1
    clock.advance(0.49)
    assert conn.holds == 1
    clock.advance(0.03)
    assert conn.holds == 0


def test_broker_limit_holds_every_topic() -> None:
    clock = Clock()
    limits = PublishLimits(clock, clock.schedule, broker_rate=Rate(msgs=10))
    a, b = Conn(), Conn()
    for i in range(10):
        limits.on_publish(f"t{i % 2}", Rate(), a if i % 2 else b, 1, 1)
    assert a.holds + b.holds == 1
    assert limits.limited_times("t1") == 1
    clock.advance(1.0)
    assert a.holds == b.holds == 0


def test_removing_a_topic_rate_lets_its_connections_go() -> None:
    clock = Clock()
    limits = PublishLimits(clock, clock.schedule)
    conn = Conn()
    limits.on_publish("t", Rate(msgs=1), conn, 5, 1)
    assert conn.holds == 1
    limits.on_publish("t", Rate(), conn, 1, 1)  # the policy was removed
    assert conn.holds == 0
    assert limits.limited_times("t") == 1


def throttle(
    clock: Clock, sub: Rate, topic: Rate, shared: SharedDispatchLimiters | None = None
) -> DispatchThrottle:
    return DispatchThrottle(
        clock, lambda: (sub, topic), shared or SharedDispatchLimiters(clock), "t"
    )


def test_dispatch_budget_caps_reads_and_counts_the_limit_that_throttled() -> None:
    clock = Clock()
    th = throttle(clock, Rate(msgs=50), Rate())
    assert th.budget(100) == 50
    th.dispatched(50, 5000)
    assert th.budget(100) == 0
    assert th.stats()["dispatchThrottledMsgEventsBySubscriptionLimit"] == 1
    assert th.retry_delay() == pytest.approx(0.02)  # 1 token at 50/s
    clock.now += 0.1
    assert th.budget(100) == 5


def test_dispatch_topic_limit_is_shared_by_subscriptions() -> None:
    clock = Clock()
    shared = SharedDispatchLimiters(clock)
    a = throttle(clock, Rate(), Rate(msgs=10), shared)
    b = throttle(clock, Rate(), Rate(msgs=10), shared)
    a.dispatched(10, 10)
    assert b.budget(5) == 0
    assert b.stats()["dispatchThrottledMsgEventsByTopicLimit"] == 1


def test_dispatch_byte_limit_and_period() -> None:
    clock = Clock()
    th = throttle(clock, Rate(bytes=1000, period=10), Rate())
    th.dispatched(1, 1200)
    assert th.budget(10) == 0
    assert th.stats()["dispatchThrottledBytesEventsBySubscriptionLimit"] == 1
    # 100 bytes/s: the 200 bytes owed, then one 16 ms resolution's worth (1.6 bytes).
    assert th.retry_delay() == pytest.approx(2.016)


def test_dispatch_broker_limit() -> None:
    clock = Clock()
    shared = SharedDispatchLimiters(clock, Rate(msgs=3))
    th = throttle(clock, Rate(), Rate(), shared)
    assert th.budget(10) == 3
    th.dispatched(3, 3)
    assert th.budget(10) == 0
    assert th.stats()["dispatchThrottledMsgEventsByBrokerLimit"] == 1


def test_unlimited_dispatch_is_untouched() -> None:
    clock = Clock()
    th = throttle(clock, Rate(), Rate())
    assert th.budget(1000) == 1000
    assert th.retry_delay() == 0.0


def test_bucket_rate_change_keeps_the_balance() -> None:
    clock = Clock()
    bucket = TokenBucket(10, clock)
    bucket.consume(10)
    clock.now += 0.5  # 5 earned at the old rate
    bucket.set_rate(100)
    assert bucket.tokens == pytest.approx(5)
    clock.now += 0.1
    assert bucket.tokens == pytest.approx(15)
    bucket.set_rate(4)  # the capacity shrinks with the rate
    assert bucket.tokens == 4


def test_dispatch_relative_to_publish_rate_follows_the_topic() -> None:
    """Pulsar's relativeToPublishRate: the limit is the publish rate plus the configured one."""
    clock = Clock()
    published = [0.0, 0.0]
    th = DispatchThrottle(
        clock,
        lambda: (Rate(msgs=10, relative=True), Rate()),
        SharedDispatchLimiters(clock),
        "t",
        lambda: (published[0], published[1]),
    )
    assert th.budget(100) == 10
    th.dispatched(10, 10)
    assert th.budget(100) == 0
    clock.now += 0.5
    assert th.budget(100) == 5  # 10/s while nothing is published
    th.dispatched(5, 5)
    published[0] = 90.0  # 100/s from the next look on
    clock.now += 0.5
    assert th.budget(1000) == 5  # earned at the old rate until now
    th.dispatched(5, 5)
    clock.now += 0.5
    assert th.budget(1000) == 50
    th.dispatched(50, 50)
    published[0] = 0.0  # back to 10/s
    assert th.retry_delay() == pytest.approx(0.1)  # one token at 10/s
