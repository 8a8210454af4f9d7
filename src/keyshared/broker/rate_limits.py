"""The broker's rate limits: policies and ``broker.conf`` turned into the limiters of throttle.py.

``publishRate`` (topic > namespace > ``maxPublishRatePerTopicInMessages``/``InBytes``) and the
broker-wide ``brokerPublisherThrottlingMaxMessageRate``/``MaxByteRate`` throttle producers'
connections; ``dispatchRate`` and ``subscriptionDispatchRate`` (topic > namespace >
``dispatchThrottlingRatePer{Topic,Subscription}In{Msg,Byte}``; a subscription's own
``dispatchRate`` comes first) and the broker-wide
``dispatchThrottlingRateInMsg``/``InByte`` limit what dispatchers read. Policies are resolved
through the policy owner and cached per policy generation, so a change applies to the next send
or read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from keyshared.broker.throttle import (
    DispatchThrottle,
    PublishLimits,
    Rate,
    SharedDispatchLimiters,
    Throttleable,
    dispatch_rate_of,
    publish_rate_of,
)

if TYPE_CHECKING:
    from keyshared.broker.dispatch.base import Scheduler
    from keyshared.broker.policies import PolicyService
    from keyshared.broker.topic_name import TopicName
    from keyshared.config import BrokerConfig


class BrokerRateLimits:
    """Publish and dispatch limits of every topic of one broker."""

    def __init__(self, config: BrokerConfig, policies: PolicyService, scheduler: Scheduler) -> None:
        self.policies = policies
        clock = time.monotonic
        self.publish = PublishLimits(
            clock,
            lambda delay, callback: scheduler.call_later(delay, callback),
            broker_rate=Rate(
                config.brokerPublisherThrottlingMaxMessageRate,
                config.brokerPublisherThrottlingMaxByteRate,
            ),
            topic_resolution=max(config.topicPublisherThrottlingTickTimeMillis, 0) / 1000.0,
            broker_resolution=max(config.brokerPublisherThrottlingTickTimeMillis, 0) / 1000.0,
        )
        self.dispatch = SharedDispatchLimiters(
            clock, Rate(config.dispatchThrottlingRateInMsg, config.dispatchThrottlingRateInByte)
        )
        self._clock = clock
        self._cache: dict[tuple[str, str, str], tuple[int, Rate]] = {}
        self._publish_rates: dict[str, tuple[int, Rate]] = {}

    def _rate(self, name: TopicName, policy: str, subscription: str = "") -> Rate:
        key = (name.full, policy, subscription)
        generation = self.policies.generation
        held = self._cache.get(key)
        if held is not None and held[0] == generation:
            return held[1]
        if subscription:
            value = self.policies.subscription_effective(name, subscription, policy)
        else:
            value = self.policies.effective(name, policy)
        rate = publish_rate_of(value) if policy == "publishRate" else dispatch_rate_of(value)
        self._cache[key] = (generation, rate)
        return rate

    # --- publish ---------------------------------------------------------------------------
    def on_publish(self, name: TopicName, conn: Throttleable, msgs: int, nbytes: int) -> None:
        """A send of ``msgs`` messages, ``nbytes`` bytes to ``name`` arrived on ``conn``."""
        # Every send passes here: the topic's resolved publish rate is looked up by its name
        # alone (no key tuple), and when nothing limits publishing at all (no broker-wide
        # limit, no topic limiter, this topic unlimited) there is nothing to account.
        full = name.full
        held = self._publish_rates.get(full)
        if held is not None and held[0] == self.policies.generation:
            rate = held[1]
        else:
            rate = self._rate(name, "publishRate")
            self._publish_rates[full] = (self.policies.generation, rate)
        publish = self.publish
        if publish.broker is None and not rate.limited and not publish.has_topic_limiters:
            return
        publish.on_publish(full, rate, conn, max(msgs, 1), nbytes)

    def publish_limited_times(self, name: TopicName) -> int:
        """Sends to ``name`` that overdrew a publish limit (``publishRateLimitedTimes``)."""
        return self.publish.limited_times(name.full)

    def throttled_connections(self, name: TopicName) -> set[int]:
        """Ids of the connections a publish limit of ``name`` (or the broker's) holds now: a
        producer whose transport is one of them is being throttled."""
        return self.publish.held(name.full)

    # --- dispatch --------------------------------------------------------------------------
    def dispatch_throttle(
        self,
        name: TopicName,
        subscription: str,
        published: Callable[[], tuple[float, ...]] | None = None,
    ) -> DispatchThrottle:
        """The dispatch limits ``subscription`` of ``name`` obeys; ``published()`` gives the
        topic's publish rates, for ``relativeToPublishRate``."""

        def resolve() -> tuple[Rate, Rate]:
            return (
                self._rate(name, "subscriptionDispatchRate", subscription),
                self._rate(name, "dispatchRate"),
            )

        return DispatchThrottle(self._clock, resolve, self.dispatch, name.full, published)

    def forget(self, name: TopicName) -> None:
        """``name`` was deleted or unloaded: drop its limiters."""
        self.publish.forget(name.full)
        self.dispatch.forget(name.full)
        for key in [k for k in self._cache if k[0] == name.full]:
            del self._cache[key]
        self._publish_rates.pop(name.full, None)
