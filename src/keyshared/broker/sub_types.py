"""Which subscription types a topic accepts: Pulsar's ``subscriptionTypesEnabled``.

The broker setting is a comma-separated list (default all four); a namespace policy
(``subscription_types_enabled``) or a topic policy replaces it for its topics. An empty policy
list means "not set", as in Pulsar, so it falls back to the next level.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from keyshared.broker.consumer import SubType
from keyshared.broker.errors import BrokerError, ServerError

if TYPE_CHECKING:
    from keyshared.broker.policies import PolicyStore
    from keyshared.broker.topic_name import TopicName

POLICY_KEY = "subscription_types_enabled"
"""The field of the namespace ``Policies`` (and of our stored topic policies)."""

ALL_TYPES = tuple(t.name for t in SubType)


def parse_types(value: str | Iterable[str]) -> frozenset[str]:
    """Subscription type names from a comma-separated setting or a policy list.

    Raises ``ValueError`` naming the first unknown type.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [n.strip() for n in items if n.strip()]
    for n in names:
        if n not in ALL_TYPES:
            raise ValueError(f"Unknown subscription type {n!r}; known: {', '.join(ALL_TYPES)}")
    return frozenset(names)


def enabled_types(topic_policy: Any, namespace_policy: Any, broker_setting: str) -> frozenset[str]:
    """Topic policy over namespace policy over broker setting (empty lists are "not set")."""
    for level in (topic_policy, namespace_policy):
        if level:
            return parse_types(level)
    return parse_types(broker_setting)


def enabled_for_topic(
    policies: PolicyStore, name: TopicName, broker_setting: str
) -> frozenset[str]:
    """The types topic ``name`` accepts: its topic policy over its namespace's over
    ``broker_setting`` (``subscriptionTypesEnabled``)."""
    ns = policies.namespace(name.namespace_name) or {}
    return enabled_types(
        policies.topic(name.full).get(POLICY_KEY), ns.get(POLICY_KEY), broker_setting
    )


def check_enabled(topic: str, sub_type: SubType, enabled: frozenset[str]) -> None:
    """Refuse a subscribe of a type the topic does not accept, with Pulsar's error."""
    if sub_type.name not in enabled:
        raise BrokerError(
            ServerError.NotAllowedError,
            f"Topic[{{{topic}}}] doesn't support {sub_type.name} sub type!",
        )
