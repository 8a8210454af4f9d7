"""Publish and dispatch rates on Pulsar's namespace and topic admin paths.

``.../publishRate`` takes Pulsar's ``PublishRate`` (``publishThrottlingRateInMsg``,
``publishThrottlingRateInByte``); ``.../dispatchRate`` and ``.../subscriptionDispatchRate``
take ``DispatchRate`` (``dispatchThrottlingRateInMsg``, ``dispatchThrottlingRateInByte``,
``ratePeriodInSecond``, ``relativeToPublishRate``), on ``/admin/v2/namespaces/{t}/{ns}/`` and
``/admin/v2/persistent/{t}/{ns}/{topic}/``, and one subscription's own at
``/admin/v2/persistent/{t}/{ns}/{topic}/{subName}/dispatchRate``. ``POST`` sets (204), ``GET`` returns the level's own
value (null when not set; on a topic ``?applied=true`` gives the one in force), ``DELETE``
falls back to the level above. -1 or 0 means no limit on that measure, as in Pulsar.

Bad input is refused by name: a body that is not a JSON object, an unknown field or a value of
the wrong type answers 400; a rate below -1 or a period below one second 412. With
``relativeToPublishRate`` the limit is the topic's publish rate plus the given one, as in Pulsar.
The broker enforces the rates (broker/rate_limits.py).
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from keyshared.admin.rest import INT64_MAX, Resolver, RestError, no_content
from keyshared.broker.service import BrokerService

_NS = "/admin/v2/namespaces/{tenant}/{namespace}/"
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/"
_INT32_MAX = 2**31 - 1

PUBLISH_RATE = {"publishThrottlingRateInMsg": _INT32_MAX, "publishThrottlingRateInByte": INT64_MAX}
DISPATCH_RATE = {
    "dispatchThrottlingRateInMsg": _INT32_MAX,
    "dispatchThrottlingRateInByte": INT64_MAX,
    "ratePeriodInSecond": _INT32_MAX,
}
# policy name -> (Pulsar's class name, its numeric fields with their maxima, defaults)
_SHAPES: dict[str, tuple[str, dict[str, int], dict[str, Any]]] = {
    "publishRate": (
        "PublishRate",
        PUBLISH_RATE,
        {"publishThrottlingRateInMsg": -1, "publishThrottlingRateInByte": -1},
    ),
    "dispatchRate": (
        "DispatchRate",
        DISPATCH_RATE,
        {
            "dispatchThrottlingRateInMsg": -1,
            "dispatchThrottlingRateInByte": -1,
            "relativeToPublishRate": False,
            "ratePeriodInSecond": 1,
        },
    ),
}
_SHAPES["subscriptionDispatchRate"] = _SHAPES["dispatchRate"]


def parse_rate(policy: str, raw: bytes) -> dict[str, Any]:
    """A ``PublishRate`` / ``DispatchRate`` body checked and completed with Pulsar's defaults."""
    kind, numbers, defaults = _SHAPES[policy]
    try:
        body = orjson.loads(raw) if raw.strip() else None
    except orjson.JSONDecodeError:
        raise RestError(400, f"Invalid {kind}: the body is not JSON") from None
    if not isinstance(body, dict):
        raise RestError(400, f"Invalid {kind}: expected a JSON object with {', '.join(defaults)}")
    unknown = sorted(set(body) - set(defaults))
    if unknown:
        raise RestError(400, f"Unknown {kind} field(s): {', '.join(unknown)}")
    out = dict(defaults)
    for field, value in body.items():
        if value is None:
            continue
        if field == "relativeToPublishRate":
            if not isinstance(value, bool):
                raise RestError(400, f"Invalid {kind} field {field}: {value!r} is not a boolean")
            out[field] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise RestError(400, f"Invalid {kind} field {field}: {value!r} is not an integer")
        if value > numbers[field]:
            raise RestError(400, f"Invalid {kind} field {field}: {value} is too large")
        out[field] = value
    for field in numbers:
        if field == "ratePeriodInSecond":
            if out[field] < 1:
                raise RestError(412, f"{kind}.ratePeriodInSecond must be at least 1 second")
        elif out[field] < -1:
            raise RestError(412, f"{kind}.{field} must be -1 or more (-1 or 0: no limit)")
    return out


def rate_routes(service: BrokerService) -> APIRouter:
    """The rate routes of ``service``."""
    router = APIRouter(tags=["policies"])
    for policy in _SHAPES:
        _add(router, service, policy)
    _add_subscription_level(router, service)
    return router


def _add_subscription_level(router: APIRouter, service: BrokerService) -> None:
    """``.../{topic}/{subName}/dispatchRate``: one subscription's own dispatch rate, over the
    topic's ``subscriptionDispatchRate``."""
    resolve = Resolver(service)
    store = service.policies
    policy = "subscriptionDispatchRate"
    path = _TOPIC + "{subscription}/dispatchRate"

    @router.get(path, name="get_subscription_level_dispatch_rate")
    async def get_rate(
        tenant: str, namespace: str, topic: str, subscription: str, applied: bool = Query(False)
    ) -> Any:
        name = resolve.policy_topic(tenant, namespace, topic)
        if applied:
            return store.subscription_effective(name, subscription, policy)
        return store.subscription_value(name, subscription, policy)

    @router.post(path, status_code=204, name="set_subscription_level_dispatch_rate")
    async def set_rate(
        tenant: str, namespace: str, topic: str, subscription: str, request: Request
    ) -> Response:
        name = resolve.policy_topic(tenant, namespace, topic)
        rate = parse_rate(policy, await request.body())
        store.update_subscription(name.full, subscription, policy, rate)
        return no_content()

    @router.delete(path, status_code=204, name="remove_subscription_level_dispatch_rate")
    async def remove_rate(tenant: str, namespace: str, topic: str, subscription: str) -> Response:
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_subscription(name.full, subscription, policy, None)
        return no_content()


def _add(router: APIRouter, service: BrokerService, policy: str) -> None:
    resolve = Resolver(service)
    store = service.policies

    @router.get(_NS + policy, name=f"get_namespace_{policy}")
    async def get_ns(tenant: str, namespace: str) -> Any:
        return store.namespace_value(resolve.namespace(tenant, namespace), policy)

    @router.post(_NS + policy, status_code=204, name=f"set_namespace_{policy}")
    async def set_ns(tenant: str, namespace: str, request: Request) -> Response:
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {policy: parse_rate(policy, await request.body())})
        return no_content()

    @router.delete(_NS + policy, status_code=204, name=f"remove_namespace_{policy}")
    async def remove_ns(tenant: str, namespace: str) -> Response:
        store.update_namespace(resolve.namespace(tenant, namespace), {policy: None})
        return no_content()

    @router.get(_TOPIC + policy, name=f"get_topic_{policy}")
    async def get_topic(
        tenant: str, namespace: str, topic: str, applied: bool = Query(False)
    ) -> Any:
        name = resolve.policy_topic(tenant, namespace, topic)
        if applied:
            return store.effective(name, policy)
        return store.topic_value(name.full, policy)

    @router.post(_TOPIC + policy, status_code=204, name=f"set_topic_{policy}")
    async def set_topic(tenant: str, namespace: str, topic: str, request: Request) -> Response:
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {policy: parse_rate(policy, await request.body())})
        return no_content()

    @router.delete(_TOPIC + policy, status_code=204, name=f"remove_topic_{policy}")
    async def remove_topic(tenant: str, namespace: str, topic: str) -> Response:
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {policy: None})
        return no_content()
