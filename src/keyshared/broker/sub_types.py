"""Which subscription types a topic accepts: Pulsar's ``subscriptionTypesEnabled``.

The broker setting is a comma-separated list (default all four); a namespace policy
(``subscription_types_enabled``) or a topic policy replaces it for its topics. An empty policy
list means "not set", as in Pulsar, so it falls back to the next level; the resolution itself
is :meth:`keyshared.broker.policies.PolicyService.enabled_sub_types`.
"""

from __future__ import annotations

from collections.abc import Iterable

from keyshared.broker.consumer import SubType
from keyshared.broker.errors import BrokerError, ServerError

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


def check_enabled(topic: str, sub_type: SubType, enabled: frozenset[str]) -> None:
    """Refuse a subscribe of a type the topic does not accept, with Pulsar's error."""
    if sub_type.name not in enabled:
        raise BrokerError(
            ServerError.NotAllowedError,
            f"Topic[{{{topic}}}] doesn't support {sub_type.name} sub type!",
        )
