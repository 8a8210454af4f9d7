"""``subscriptionTypesEnabled`` policies of namespaces and topics, on Pulsar's admin paths.

``POST`` takes a JSON array of type names (``["Exclusive", "Key_Shared"]``); ``GET`` returns
the array set at that level (null when not set); ``DELETE`` falls back to the level above.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from fastapi.responses import Response

from keyshared.admin.rest import Resolver, RestError, no_content
from keyshared.broker.service import BrokerService
from keyshared.broker.sub_types import POLICY_KEY, parse_types

_NS = "/admin/v2/namespaces/{tenant}/{namespace}/subscriptionTypesEnabled"
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscriptionTypesEnabled"


def _validated(types: list[str]) -> list[str]:
    try:
        parse_types(types)
    except ValueError as exc:
        raise RestError(412, str(exc)) from None
    return sorted(set(types))


def sub_types_routes(service: BrokerService) -> APIRouter:
    """The routes of ``service``."""
    router = APIRouter(tags=["policies"])
    resolve = Resolver(service)
    store = service.policies

    @router.get(_NS)
    async def get_namespace_types(tenant: str, namespace: str) -> list[str] | None:
        """The namespace's enabled subscription types (null when not set)."""
        value = store.namespace_value(resolve.namespace(tenant, namespace), POLICY_KEY)
        return list(value) if value else None

    @router.post(_NS, status_code=204)
    async def set_namespace_types(
        tenant: str, namespace: str, types: Annotated[list[str], Body()]
    ) -> Response:
        """Only these subscription types may subscribe to the namespace's topics."""
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {POLICY_KEY: _validated(types) or None})
        return no_content()

    @router.delete(_NS, status_code=204)
    async def remove_namespace_types(tenant: str, namespace: str) -> Response:
        """Fall back to the broker's ``subscriptionTypesEnabled``."""
        store.update_namespace(resolve.namespace(tenant, namespace), {POLICY_KEY: None})
        return no_content()

    @router.get(_TOPIC)
    async def get_topic_types(tenant: str, namespace: str, topic: str) -> list[str] | None:
        """The topic's own enabled subscription types (null when not set)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        value = store.topic_value(name.full, POLICY_KEY)
        return list(value) if value else None

    @router.post(_TOPIC, status_code=204)
    async def set_topic_types(
        tenant: str, namespace: str, topic: str, types: Annotated[list[str], Body()]
    ) -> Response:
        """Only these subscription types may subscribe to the topic."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {POLICY_KEY: _validated(types) or None})
        return no_content()

    @router.delete(_TOPIC, status_code=204)
    async def remove_topic_types(tenant: str, namespace: str, topic: str) -> Response:
        """Fall back to the namespace policy, else the broker setting."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {POLICY_KEY: None})
        return no_content()

    return router
