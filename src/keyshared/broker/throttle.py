"""Publish and dispatch rate limits: token buckets, as Pulsar 3.2+ (PIP-322) implements them.

Pure code: the clock is injected (``time.monotonic`` in the broker, a fake in tests) and so is
the timer that lifts a throttle, so everything here is tested without sleeping.

**Token bucket** (Pulsar's ``AsyncTokenBucket``): ``rate`` tokens per ``period`` seconds, at
most one period's worth held (the capacity), full at the start. Consuming never fails: the
balance may go negative, and whoever consumed is throttled until the bucket has refilled to a
small positive amount (one ``resolution`` worth of tokens, at least one). Over time the rate is
exact: what a burst overdraws is paid back by a longer pause.

**Publish** (``publishRate`` policy; ``brokerPublisherThrottlingMaxMessageRate`` /
``MaxByteRate`` for the whole broker): every send consumes from its topic's buckets and the
broker's; when a bucket is overdrawn the connection the send came on stops being read (as
Pulsar turns Netty's auto-read off), until the bucket has refilled. Sends are delayed, never
refused or dropped. Each throttle counts in the topic's ``publishRateLimitedTimes``.

**Dispatch** (``dispatchRate`` per topic, ``subscriptionDispatchRate`` per subscription,
``dispatchThrottlingRateInMsg`` / ``InByte`` for the whole broker): before a read, a
dispatcher asks how many entries it may read (:meth:`DispatchThrottle.budget`: the messages
left in every bucket); with none left it reads nothing and retries when the buckets have
refilled. What it sends is consumed afterwards. Entries are only ever delayed, so the
dispatchers' ordering rules (Key_Shared's per-key order) are untouched.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

Clock = Callable[[], float]

DEFAULT_RESOLUTION = 0.016
"""Pulsar's default token-bucket resolution (16 ms): the least a throttle lasts, in tokens."""


class TokenBucket:
    """``rate`` tokens per ``period`` seconds, capacity one period's worth, starting full."""

    __slots__ = ("_clock", "_last", "_tokens", "capacity", "period", "rate", "resolution")

    def __init__(
        self,
        rate: float,
        clock: Clock,
        *,
        period: float = 1.0,
        resolution: float = DEFAULT_RESOLUTION,
    ) -> None:
        if rate <= 0 or period <= 0:
            raise ValueError("a token bucket needs a positive rate and period")
        self.rate = float(rate)
        self.period = float(period)
        self.capacity = self.rate
        self.resolution = max(resolution, 0.0)
        self._clock = clock
        self._last = clock()
        self._tokens = self.capacity

    @property
    def per_second(self) -> float:
        """Tokens added per second."""
        return self.rate / self.period

    @property
    def tokens(self) -> float:
        """The balance now (negative while overdrawn)."""
        now = self._clock()
        elapsed = now - self._last
        if elapsed > 0:
            self._tokens = min(self._tokens + elapsed * self.per_second, self.capacity)
            self._last = now
        return self._tokens

    def set_rate(self, rate: float) -> None:
        """Change the rate (and capacity), keeping the balance earned so far."""
        if rate <= 0:
            raise ValueError("a token bucket needs a positive rate")
        tokens = self.tokens
        self.rate = float(rate)
        self.capacity = self.rate
        self._tokens = min(tokens, self.capacity)

    def consume(self, amount: float) -> bool:
        """Take ``amount`` tokens (the balance may go negative); True if some are left."""
        left = self.tokens - amount
        self._tokens = left
        return left > 0

    @property
    def target(self) -> float:
        """The balance a throttle waits for: one resolution's worth, at least one token."""
        return max(self.per_second * self.resolution, 1.0)

    def throttling_duration(self) -> float:
        """Seconds until the balance reaches :attr:`target` (0 when there are tokens)."""
        tokens = self.tokens
        if tokens > 0:
            return 0.0
        return (min(self.target, self.capacity) - tokens) / self.per_second


@dataclass(frozen=True, slots=True)
class Rate:
    """Messages and bytes per period; 0 or less means no limit on that measure."""

    msgs: int = 0
    bytes: int = 0
    period: int = 1
    relative: bool = False
    """Pulsar's ``relativeToPublishRate``: the limit is the topic's publish rate plus these."""

    @property
    def limited(self) -> bool:
        """True when at least one measure is limited."""
        return self.msgs > 0 or self.bytes > 0


def publish_rate_of(value: Any) -> Rate:
    """A ``PublishRate`` JSON object (``publishThrottlingRateInMsg``/``InByte``) as a Rate."""
    if not isinstance(value, Mapping):
        return Rate()
    return Rate(
        int(value.get("publishThrottlingRateInMsg") or 0),
        int(value.get("publishThrottlingRateInByte") or 0),
    )


def dispatch_rate_of(value: Any) -> Rate:
    """A ``DispatchRate`` JSON object as a Rate (per ``ratePeriodInSecond``)."""
    if not isinstance(value, Mapping):
        return Rate()
    return Rate(
        int(value.get("dispatchThrottlingRateInMsg") or 0),
        int(value.get("dispatchThrottlingRateInByte") or 0),
        max(int(value.get("ratePeriodInSecond") or 1), 1),
        bool(value.get("relativeToPublishRate")),
    )


class RateLimiter:
    """A message bucket and a byte bucket (either may be absent) for one :class:`Rate`."""

    __slots__ = ("bytes", "msgs", "rate")

    def __init__(self, rate: Rate, clock: Clock, resolution: float = DEFAULT_RESOLUTION) -> None:
        self.rate = rate
        self.msgs = (
            TokenBucket(rate.msgs, clock, period=rate.period, resolution=resolution)
            if rate.msgs > 0
            else None
        )
        self.bytes = (
            TokenBucket(rate.bytes, clock, period=rate.period, resolution=resolution)
            if rate.bytes > 0
            else None
        )

    def follow(self, published: tuple[float, ...]) -> None:
        """For a rate relative to publishing: the limits become the topic's publish rates
        (``published``: messages and bytes per second) plus the configured ones, as Pulsar's
        ``getRelativeDispatchRateIn{Msg,Byte}``."""
        if self.msgs is not None:
            self.msgs.set_rate(self.rate.msgs + int(published[0]))
        if self.bytes is not None:
            self.bytes.set_rate(self.rate.bytes + int(published[1]))

    def consume(self, msgs: int, nbytes: int) -> tuple[bool, bool]:
        """Consume; returns whether the message bucket and the byte bucket are overdrawn."""
        over_msgs = self.msgs is not None and not self.msgs.consume(msgs)
        over_bytes = self.bytes is not None and not self.bytes.consume(nbytes)
        return over_msgs, over_bytes

    def throttling_duration(self) -> float:
        """Seconds until both buckets have tokens again."""
        return max(
            self.msgs.throttling_duration() if self.msgs is not None else 0.0,
            self.bytes.throttling_duration() if self.bytes is not None else 0.0,
        )

    def available_msgs(self) -> float:
        """Messages that may go now (infinite without a message limit)."""
        return self.msgs.tokens if self.msgs is not None else float("inf")

    def available_bytes(self) -> float:
        """Bytes that may go now (infinite without a byte limit)."""
        return self.bytes.tokens if self.bytes is not None else float("inf")


# --- publish -------------------------------------------------------------------------------
class Throttleable(Protocol):
    """A producer's connection, as far as publish throttling goes (server/publish_buffer.py)."""

    @property
    def conn(self) -> object:
        """The connection itself (the producers' transport), to tell which are held."""

    def throttle(self) -> None:
        """Stop reading from the client (counted: each call needs one :meth:`unthrottle`)."""

    def unthrottle(self) -> None:
        """Undo one :meth:`throttle`; reading resumes when none is left."""


Schedule = Callable[[float, Callable[[], None]], object]
"""``schedule(delay, callback)``: run ``callback`` after ``delay`` seconds (loop.call_later)."""


class PublishRateLimiter:
    """One publish limit (a topic's or the broker's) and the connections it throttles.

    As Pulsar's PublishRateLimiterImpl: a send that overdraws a bucket throttles its
    connection and queues it; one timer lifts throttles, oldest first, while the buckets have
    tokens, and re-arms itself for the rest.
    """

    def __init__(
        self, rate: Rate, clock: Clock, schedule: Schedule, resolution: float = DEFAULT_RESOLUTION
    ) -> None:
        self.limiter = RateLimiter(rate, clock, resolution)
        self._schedule = schedule
        self._queue: deque[Throttleable] = deque()
        self._armed = False
        self.limited_times = 0
        """Sends that overdrew this limit (Pulsar's ``publishRateLimitedTimes``)."""

    @property
    def rate(self) -> Rate:
        """The limit."""
        return self.limiter.rate

    @property
    def throttled(self) -> int:
        """Throttles not yet lifted."""
        return len(self._queue)

    def on_publish(self, conn: Throttleable, msgs: int, nbytes: int) -> bool:
        """Account one send on ``conn``; throttle it if the limit is overdrawn (True)."""
        over_msgs, over_bytes = self.limiter.consume(msgs, nbytes)
        if not (over_msgs or over_bytes):
            return False
        self.limited_times += 1
        conn.throttle()
        self._queue.append(conn)
        self._arm()
        return True

    def _arm(self) -> None:
        if not self._armed:
            self._armed = True
            self._schedule(self.limiter.throttling_duration(), self._lift)

    def _lift(self) -> None:
        self._armed = False
        queue = self._queue
        while queue and self.limiter.throttling_duration() <= 0:
            queue.popleft().unthrottle()
        if queue:
            self._arm()

    def held(self) -> set[int]:
        """Ids of the connections (:attr:`Throttleable.conn`) this limit holds now."""
        return {id(t.conn) for t in self._queue}

    def release_all(self) -> None:
        """Lift every throttle now (the limit was removed or changed)."""
        queue, self._queue = self._queue, deque()
        for conn in queue:
            conn.unthrottle()


class PublishLimits:
    """The broker's publish limits: one per limited topic, and the broker-wide one."""

    def __init__(
        self,
        clock: Clock,
        schedule: Schedule,
        *,
        broker_rate: Rate = Rate(),
        topic_resolution: float = DEFAULT_RESOLUTION,
        broker_resolution: float = DEFAULT_RESOLUTION,
    ) -> None:
        self._clock = clock
        self._schedule = schedule
        self._resolution = topic_resolution
        self.broker = (
            PublishRateLimiter(broker_rate, clock, schedule, broker_resolution)
            if broker_rate.limited
            else None
        )
        self._topics: dict[str, PublishRateLimiter] = {}
        self._limited_times: dict[str, int] = {}

    @property
    def has_topic_limiters(self) -> bool:
        """Whether any topic has a publish limiter now."""
        return bool(self._topics)

    def topic_limiter(self, topic: str, rate: Rate) -> PublishRateLimiter | None:
        """``topic``'s limiter for ``rate`` (made, replaced or dropped as the rate says)."""
        current = self._topics.get(topic)
        if current is not None and current.rate == rate:
            return current
        if current is not None:
            self._limited_times[topic] = self.limited_times(topic)
            del self._topics[topic]
            current.release_all()
        if not rate.limited:
            return None
        made = PublishRateLimiter(rate, self._clock, self._schedule, self._resolution)
        self._topics[topic] = made
        return made

    def on_publish(
        self, topic: str, rate: Rate, conn: Throttleable, msgs: int, nbytes: int
    ) -> None:
        """One send of ``msgs`` messages and ``nbytes`` bytes to ``topic`` (limited by
        ``rate``) arrived on ``conn``: consume, and throttle ``conn`` where overdrawn."""
        limiter = self.topic_limiter(topic, rate)
        if limiter is not None:
            limiter.on_publish(conn, msgs, nbytes)
        if self.broker is not None and self.broker.on_publish(conn, msgs, nbytes):
            self._limited_times[topic] = self._limited_times.get(topic, 0) + 1

    def held(self, topic: str) -> set[int]:
        """Ids of the connections the topic's limit or the broker's holds now."""
        limiter = self._topics.get(topic)
        out = limiter.held() if limiter is not None else set()
        return out | (self.broker.held() if self.broker is not None else set())

    def limited_times(self, topic: str) -> int:
        """Sends to ``topic`` that overdrew a limit since the broker started."""
        limiter = self._topics.get(topic)
        return self._limited_times.get(topic, 0) + (limiter.limited_times if limiter else 0)

    def forget(self, topic: str) -> None:
        """``topic`` was deleted or unloaded."""
        limiter = self._topics.pop(topic, None)
        if limiter is not None:
            limiter.release_all()
        self._limited_times.pop(topic, None)


# --- dispatch ------------------------------------------------------------------------------
REASONS = ("subscription", "topic", "broker")
"""Pulsar's ``reason`` label of the dispatch-throttling metrics, narrowest first."""


class DispatchThrottle:
    """The dispatch limits one subscription obeys: its own, its topic's, the broker's.

    ``resolve()`` returns the subscription and topic rates in force (it is called before each
    read, so policy changes apply at once); the topic's and broker's limiters are shared with
    the other subscriptions through ``shared``. ``published()`` gives the topic's publish rates
    (messages, bytes per second) for a rate relative to them.
    """

    def __init__(
        self,
        clock: Clock,
        resolve: Callable[[], tuple[Rate, Rate]],
        shared: SharedDispatchLimiters,
        topic: str,
        published: Callable[[], tuple[float, ...]] | None = None,
    ) -> None:
        self._clock = clock
        self._resolve = resolve
        self._shared = shared
        self._topic = topic
        self._published = published
        self._own: RateLimiter | None = None
        # Pulsar's dispatchThrottled{Msg,Bytes}EventsBy{Subscription,Topic,Broker}Limit.
        self.msg_events = dict.fromkeys(REASONS, 0)
        self.byte_events = dict.fromkeys(REASONS, 0)

    def _limiters(self) -> list[tuple[str, RateLimiter]]:
        sub_rate, topic_rate = self._resolve()
        own = self._own
        if own is None or own.rate != sub_rate:
            own = self._own = RateLimiter(sub_rate, self._clock) if sub_rate.limited else None
        out: list[tuple[str, RateLimiter]] = []
        if own is not None:
            out.append(("subscription", own))
        topic = self._shared.topic(self._topic, topic_rate)
        if topic is not None:
            out.append(("topic", topic))
        if self._shared.broker is not None:
            out.append(("broker", self._shared.broker))
        if self._published is not None and (sub_rate.relative or topic_rate.relative):
            published = self._published()
            for _, limiter in out:
                if limiter.rate.relative:
                    limiter.follow(published)
        return out

    def budget(self, wanted: int) -> int:
        """How many of ``wanted`` entries may be read now (0: throttled, retry later)."""
        allowed = wanted
        for reason, limiter in self._limiters():
            msgs = limiter.available_msgs()
            if msgs <= 0:
                self.msg_events[reason] += 1
                return 0
            if limiter.available_bytes() <= 0:
                self.byte_events[reason] += 1
                return 0
            if msgs < allowed:
                allowed = max(int(msgs), 1)
        return allowed

    def retry_delay(self) -> float:
        """Seconds until every limit has tokens again."""
        return max((lim.throttling_duration() for _, lim in self._limiters()), default=0.0)

    def dispatched(self, msgs: int, nbytes: int) -> None:
        """``msgs`` messages of ``nbytes`` bytes were sent."""
        for _, limiter in self._limiters():
            limiter.consume(msgs, nbytes)

    def stats(self) -> dict[str, int]:
        """Subscription stats fields, with Pulsar's names."""
        out: dict[str, int] = {}
        for reason in REASONS:
            label = reason.capitalize()
            out[f"dispatchThrottledMsgEventsBy{label}Limit"] = self.msg_events[reason]
            out[f"dispatchThrottledBytesEventsBy{label}Limit"] = self.byte_events[reason]
        return out


class SharedDispatchLimiters:
    """Dispatch limiters shared by subscriptions: one per limited topic, and the broker's."""

    def __init__(self, clock: Clock, broker_rate: Rate = Rate()) -> None:
        self._clock = clock
        self.broker = RateLimiter(broker_rate, clock) if broker_rate.limited else None
        self._topics: dict[str, RateLimiter] = {}

    def topic(self, topic: str, rate: Rate) -> RateLimiter | None:
        """``topic``'s limiter for ``rate`` (made, replaced or dropped as the rate says)."""
        current = self._topics.get(topic)
        if current is not None and current.rate == rate:
            return current
        if not rate.limited:
            self._topics.pop(topic, None)
            return None
        made = self._topics[topic] = RateLimiter(rate, self._clock)
        return made

    def forget(self, topic: str) -> None:
        """``topic`` was deleted or unloaded."""
        self._topics.pop(topic, None)
