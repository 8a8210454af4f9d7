"""Producer, consumer and subscription limits on Pulsar's namespace and topic admin paths.

Namespaces: ``.../maxProducersPerTopic``, ``maxConsumersPerTopic``,
``maxConsumersPerSubscription``, ``maxSubscriptionsPerTopic``, ``maxTopicsPerNamespace``; topics: ``.../maxProducers``,
``maxConsumers``, ``maxConsumersPerSubscription``, ``maxSubscriptionsPerTopic``. The unacked
limits: namespaces ``.../maxUnackedMessagesPerConsumer``, ``maxUnackedMessagesPerSubscription``;
topics ``.../maxUnackedMessagesOnConsumer``, ``maxUnackedMessagesOnSubscription``. ``POST`` takes
the number (0 = unlimited), ``GET`` returns the level's own value (null when not set; on a topic
``?applied=true`` gives the one in force), ``DELETE`` falls back to the level above. The broker
enforces them (``broker/limits.py``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from keyshared.admin.rest import Resolver, RestError, no_content
from keyshared.broker.service import BrokerService

_NS = "/admin/v2/namespaces/{tenant}/{namespace}/"
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/"

# policy name -> (namespace path, topic path)
LIMIT_PATHS: dict[str, tuple[str, str]] = {
    "maxProducersPerTopic": ("maxProducersPerTopic", "maxProducers"),
    "maxConsumersPerTopic": ("maxConsumersPerTopic", "maxConsumers"),
    "maxConsumersPerSubscription": ("maxConsumersPerSubscription", "maxConsumersPerSubscription"),
    "maxSubscriptionsPerTopic": ("maxSubscriptionsPerTopic", "maxSubscriptionsPerTopic"),
    # Unacked limits (issue 13 point 3): Pulsar's topic paths say "On".
    "maxUnackedMessagesPerConsumer": (
        "maxUnackedMessagesPerConsumer",
        "maxUnackedMessagesOnConsumer",
    ),
    "maxUnackedMessagesPerSubscription": (
        "maxUnackedMessagesPerSubscription",
        "maxUnackedMessagesOnSubscription",
    ),
}
# The name a topic-level refusal gives the value, where Pulsar's differs from the policy's.
_TOPIC_VALUE_NAME = {
    "maxUnackedMessagesPerConsumer": "maxUnackedNum",
    "maxUnackedMessagesPerSubscription": "maxUnackedNum",
}
_INT32_MAX = 2**31 - 1
Limit = Annotated[int, Body(ge=-(2**31), le=_INT32_MAX)]


def checked_limit(policy: str, value: int) -> int:
    """A limit as Pulsar accepts it: 0 or more (412 otherwise)."""
    if value < 0:
        raise RestError(412, f"{policy} must be 0 or more")
    return value


def limit_routes(service: BrokerService) -> APIRouter:
    """The limit routes of ``service``."""
    router = APIRouter(tags=["policies"])
    for policy, (ns_path, topic_path) in LIMIT_PATHS.items():
        _add(router, service, policy, ns_path, topic_path)
    _add_namespace_only(router, service, "maxTopicsPerNamespace")
    return router


def _add_namespace_only(router: APIRouter, service: BrokerService, policy: str) -> None:
    resolve = Resolver(service)
    store = service.policies

    @router.get(_NS + policy, name=f"get_namespace_{policy}")
    async def get_ns(tenant: str, namespace: str) -> int | None:
        value = store.namespace_value(resolve.namespace(tenant, namespace), policy)
        return None if value is None else int(value)

    @router.post(_NS + policy, status_code=204, name=f"set_namespace_{policy}")
    async def set_ns(tenant: str, namespace: str, value: Limit) -> Response:
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {policy: checked_limit(policy, value)})
        return no_content()

    @router.delete(_NS + policy, status_code=204, name=f"remove_namespace_{policy}")
    async def remove_ns(tenant: str, namespace: str) -> Response:
        store.update_namespace(resolve.namespace(tenant, namespace), {policy: None})
        return no_content()


def _add(
    router: APIRouter, service: BrokerService, policy: str, ns_path: str, topic_path: str
) -> None:
    resolve = Resolver(service)
    store = service.policies

    @router.get(_NS + ns_path, name=f"get_namespace_{policy}")
    async def get_ns(tenant: str, namespace: str) -> int | None:
        return store.namespace_value(resolve.namespace(tenant, namespace), policy)  # type: ignore[no-any-return]

    @router.post(_NS + ns_path, status_code=204, name=f"set_namespace_{policy}")
    async def set_ns(tenant: str, namespace: str, value: Limit) -> Response:
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {policy: checked_limit(policy, value)})
        return no_content()

    @router.delete(_NS + ns_path, status_code=204, name=f"remove_namespace_{policy}")
    async def remove_ns(tenant: str, namespace: str) -> Response:
        store.update_namespace(resolve.namespace(tenant, namespace), {policy: None})
        return no_content()

    @router.get(_TOPIC + topic_path, name=f"get_topic_{policy}")
    async def get_topic(
        tenant: str, namespace: str, topic: str, applied: bool = Query(False)
    ) -> int | None:
        name = resolve.policy_topic(tenant, namespace, topic)
        if applied:
            return int(store.effective(name, policy))
        return store.topic_value(name.full, policy)  # type: ignore[no-any-return]

    @router.post(_TOPIC + topic_path, status_code=204, name=f"set_topic_{policy}")
    async def set_topic(tenant: str, namespace: str, topic: str, value: Limit) -> Response:
        name = resolve.policy_topic(tenant, namespace, topic)
        checked = checked_limit(_TOPIC_VALUE_NAME.get(policy, policy), value)
        store.update_topic(name.full, {policy: checked})
        return no_content()

    @router.delete(_TOPIC + topic_path, status_code=204, name=f"remove_topic_{policy}")
    async def remove_topic(tenant: str, namespace: str, topic: str) -> Response:
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {policy: None})
        return no_content()
