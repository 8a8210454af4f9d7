"""Producer, consumer and subscription limits of a topic, refused with Pulsar's errors.

``maxProducersPerTopic``, ``maxConsumersPerTopic``, ``maxConsumersPerSubscription`` and
``maxSubscriptionsPerTopic`` resolve topic > namespace > broker.conf through the policy owner;
0 (the default at every level) means unlimited. The codes and messages are Pulsar's
(``AbstractTopic`` and ``PersistentTopic``): ProducerBusy "Topic reached max producers limit",
ConsumerBusy "Topic reached max consumers limit" / "Subscription reached max consumers limit",
NotAllowed "Exceed the maximum number of subscriptions of the topic: <topic>".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from keyshared.broker.errors import BrokerError, ServerError

if TYPE_CHECKING:
    from keyshared.broker.policies import PolicyService
    from keyshared.broker.topic_name import TopicName


def _limit(policies: PolicyService, name: TopicName, policy: str) -> int:
    return int(policies.effective(name, policy) or 0)


TOPICS_EXCEEDED = "Exceed maximum number of topics in namespace."


class TopicQuotaExceeded(BrokerError):
    """``maxTopicsPerNamespace`` reached: NotAllowed for a client, 412 on the admin API."""

    http_status = 412

    def __init__(self) -> None:
        super().__init__(ServerError.NotAllowedError, TOPICS_EXCEEDED)


def check_topics(policies: PolicyService, namespace: str, current: int, adding: int) -> None:
    """Refuse ``adding`` topics (partitions count one each) to a namespace that has ``current``
    when that would pass ``maxTopicsPerNamespace``."""
    limit = int(policies.namespace_effective(namespace, "maxTopicsPerNamespace") or 0)
    if limit > 0 and current + adding > limit:
        raise TopicQuotaExceeded()


def check_producers(policies: PolicyService, name: TopicName, producers: int) -> None:
    """Refuse one more producer on a topic that has ``producers`` already at its limit."""
    limit = _limit(policies, name, "maxProducersPerTopic")
    if limit > 0 and producers >= limit:
        raise BrokerError(ServerError.ProducerBusy, "Topic reached max producers limit")


def check_consumers(
    policies: PolicyService, name: TopicName, on_topic: int, on_subscription: int
) -> None:
    """Refuse one more consumer when the topic (``on_topic`` consumers) or its subscription
    (``on_subscription``) is at its limit."""
    limit = _limit(policies, name, "maxConsumersPerTopic")
    if limit > 0 and on_topic >= limit:
        raise BrokerError(ServerError.ConsumerBusy, "Topic reached max consumers limit")
    limit = _limit(policies, name, "maxConsumersPerSubscription")
    if limit > 0 and on_subscription >= limit:
        raise BrokerError(ServerError.ConsumerBusy, "Subscription reached max consumers limit")


def check_subscriptions(policies: PolicyService, name: TopicName, subscriptions: int) -> None:
    """Refuse a new subscription on a topic that has ``subscriptions`` at its limit."""
    limit = _limit(policies, name, "maxSubscriptionsPerTopic")
    if limit > 0 and subscriptions >= limit:
        raise BrokerError(
            ServerError.NotAllowedError,
            f"Exceed the maximum number of subscriptions of the topic: {name.full}",
        )


def check_subscribe(
    policies: PolicyService,
    name: TopicName,
    subscriptions: Mapping[str, HasConsumers],
    subscription: str,
) -> None:
    """Before a consumer joins ``subscription`` of topic ``name``: the subscription limit (for
    a new subscription), then the topic's and the subscription's consumer limits."""
    sub = subscriptions.get(subscription)
    if sub is None:
        check_subscriptions(policies, name, len(subscriptions))
    on_topic = sum(len(s.consumers) for s in subscriptions.values())
    check_consumers(policies, name, on_topic, len(sub.consumers) if sub is not None else 0)


class HasConsumers(Protocol):
    """A subscription, as far as the limits look at it."""

    @property
    def consumers(self) -> Sequence[object]: ...
