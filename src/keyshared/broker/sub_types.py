"""Which subscription types a topic accepts: Pulsar's ``subscriptionTypesEnabled``.

The broker setting is a comma-separated list (default all four); a namespace policy
(``subscription_types_enabled``) or a topic policy replaces it for its topics. An empty policy
list means "not set", as in Pulsar, so it falls back to the next level; the resolution itself
is :meth:`keyshared.broker.policies.PolicyService.enabled_sub_types`.
"""

from __future__ import annotations

from keyshared.broker.consumer import SubType
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.config import SUBSCRIPTION_TYPES, parse_subscription_types

POLICY_KEY = "subscription_types_enabled"
"""The field of the namespace ``Policies`` (and of our stored topic policies)."""

ALL_TYPES = SUBSCRIPTION_TYPES
# config.py names the types without importing the broker: the two lists must be the same.
assert {t.name for t in SubType} == set(ALL_TYPES)

parse_types = parse_subscription_types


def check_enabled(topic: str, sub_type: SubType, enabled: frozenset[str]) -> None:
    """Refuse a subscribe of a type the topic does not accept, with Pulsar's error."""
    if sub_type.name not in enabled:
        raise BrokerError(
            ServerError.NotAllowedError,
            f"Topic[{{{topic}}}] doesn't support {sub_type.name} sub type!",
        )
