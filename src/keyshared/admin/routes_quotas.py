"""Backlog quotas and inactive-topic policies on Pulsar's namespace and topic admin paths.

Backlog quotas (``broker/backlog_quota.py``), per quota type (``?backlogQuotaType=``
``destination_storage``, the default, or ``message_age``):

- ``POST .../backlogQuota`` with a ``BacklogQuota`` body (``limitSize``, ``limitTime``,
  ``policy``); ``DELETE .../backlogQuota`` falls back to the level above;
- ``GET .../backlogQuotaMap``: the level's own quotas by type (``{}`` when none); on a topic,
  ``?applied=true`` gives the quotas in force (topic, else namespace, else broker).

An unknown quota type is 404, as Pulsar's REST layer answers a query parameter it cannot
convert; a bad body is 400 (not an object) or 412 naming the field; a size or time quota at or
above the level's retention is 412, as Pulsar refuses it (and the retention routes refuse a
retention at or under the size quota: :func:`check_retention_fits`).

Inactive-topic policies (``broker/inactive_topics.py``): ``GET/POST/DELETE
.../inactiveTopicPolicies`` with an ``InactiveTopicPolicies`` body (``inactiveTopicDeleteMode``,
``maxInactiveDurationSeconds``, ``deleteWhileInactive``); ``GET`` answers null when the level
sets none, and on a topic ``?applied=true`` the policies in force.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from keyshared.admin.rest import Resolver, RestError, no_content
from keyshared.broker import backlog_quota as bq
from keyshared.broker import inactive_topics as it
from keyshared.broker.service import BrokerService

_NS = "/admin/v2/namespaces/{tenant}/{namespace}/"
_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/"
_RETENTION_TIME = "retentionTimeInMinutes"
_RETENTION_SIZE = "retentionSizeInMB"

QuotaTypeQuery = Annotated[str | None, Query(alias="backlogQuotaType")]
AppliedQuery = Annotated[bool, Query(alias="applied")]
JsonBody = Annotated[Any, Body()]


def quota_type(value: str | None) -> str:
    """The ``backlogQuotaType`` asked for; 404 naming it when Pulsar has no such type."""
    try:
        return bq.check_quota_type(value)
    except bq.QuotaError as exc:
        raise RestError(404, str(exc)) from None


def parse_quota(body: Any) -> bq.BacklogQuota:
    """A ``BacklogQuota`` body; 400 when it is not an object, 412 naming a bad field."""
    if not isinstance(body, dict):
        raise RestError(400, "The backlog quota must be a JSON object (BacklogQuota)")
    try:
        return bq.BacklogQuota.from_json(body)
    except bq.QuotaError as exc:
        raise RestError(412, str(exc)) from None


def parse_inactive(body: Any) -> it.InactiveTopicPolicies:
    """An ``InactiveTopicPolicies`` body; 400 when it is not an object, 412 naming a bad field."""
    if not isinstance(body, dict):
        raise RestError(400, "The inactive topic policies must be a JSON object")
    try:
        return it.InactiveTopicPolicies.from_json(body)
    except it.InactivePolicyError as exc:
        raise RestError(412, str(exc)) from None


def check_retention(quota: bq.BacklogQuota, time_min: Any, size_mb: Any, level: str) -> None:
    """412 when ``quota`` reaches the level's retention (Pulsar's ``checkBacklogQuota``)."""
    if bq.conflicts_with_retention(quota, time_min, size_mb):
        raise RestError(
            412,
            f"Backlog Quota exceeds configured retention quota for {level}."
            " Please increase retention quota and retry",
        )


def check_retention_fits(quotas: Any, time_min: int, size_mb: int, level: str) -> None:
    """412 when a new retention (``time_min`` minutes, ``size_mb`` MB) would not exceed the
    level's size quota (``quotas``: its ``backlogQuotaMap``), as Pulsar refuses it."""
    entry = quotas.get(bq.DESTINATION_STORAGE) if isinstance(quotas, dict) else None
    if entry is None:
        return
    if bq.conflicts_with_retention(bq.BacklogQuota.from_json(entry), time_min, size_mb):
        reason = f"Retention Quota must exceed configured backlog quota for {level}."
        if level == "topic":
            reason += " Please increase retention quota and retry"
        raise RestError(412, reason)


def quota_routes(service: BrokerService) -> APIRouter:
    """The backlog-quota and inactive-topic-policy routes of ``service``."""
    router = APIRouter(tags=["policies"])
    resolve = Resolver(service)
    store = service.policies

    # --- backlog quotas: namespaces ---------------------------------------------------------
    @router.get(_NS + "backlogQuotaMap")
    async def get_namespace_quotas(tenant: str, namespace: str) -> dict[str, Any]:
        """The namespace's own quotas by type."""
        ns = resolve.namespace(tenant, namespace)
        return dict(store.namespace_value(ns, bq.POLICY_NAME) or {})

    @router.post(_NS + "backlogQuota", status_code=204)
    async def set_namespace_quota(
        tenant: str, namespace: str, body: JsonBody = None, kind: QuotaTypeQuery = None
    ) -> Response:
        """Set the namespace's quota of one type."""
        ns = resolve.namespace(tenant, namespace)
        qtype = quota_type(kind)
        quota = parse_quota(body)
        if qtype == bq.DESTINATION_STORAGE:
            time_min = store.namespace_value(ns, _RETENTION_TIME)
            size_mb = store.namespace_value(ns, _RETENTION_SIZE)
            check_retention(quota, time_min, size_mb, "namespace")
        quotas = dict(store.namespace_value(ns, bq.POLICY_NAME) or {})
        quotas[qtype] = quota.to_json()
        store.update_namespace(ns, {bq.POLICY_NAME: quotas})
        return no_content()

    @router.delete(_NS + "backlogQuota", status_code=204)
    async def remove_namespace_quota(
        tenant: str, namespace: str, kind: QuotaTypeQuery = None
    ) -> Response:
        """Remove the namespace's quota of one type (the broker's applies)."""
        ns = resolve.namespace(tenant, namespace)
        qtype = quota_type(kind)
        quotas = dict(store.namespace_value(ns, bq.POLICY_NAME) or {})
        quotas.pop(qtype, None)
        store.update_namespace(ns, {bq.POLICY_NAME: quotas or None})
        return no_content()

    # --- backlog quotas: topics -------------------------------------------------------------
    @router.get(_TOPIC + "backlogQuotaMap")
    async def get_topic_quotas(
        tenant: str, namespace: str, topic: str, applied: AppliedQuery = False
    ) -> dict[str, Any]:
        """The topic's own quotas by type (with ``applied``: those in force)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        if applied:
            return bq.applied_quota_map(store, name)
        return dict(store.topic_value(name.full, bq.POLICY_NAME) or {})

    @router.post(_TOPIC + "backlogQuota", status_code=204)
    async def set_topic_quota(
        tenant: str, namespace: str, topic: str, body: JsonBody = None, kind: QuotaTypeQuery = None
    ) -> Response:
        """Set the topic's quota of one type."""
        name = resolve.policy_topic(tenant, namespace, topic)
        qtype = quota_type(kind)
        quota = parse_quota(body)
        if qtype == bq.DESTINATION_STORAGE:
            time_min = store.topic_value(name.full, _RETENTION_TIME)
            size_mb = store.topic_value(name.full, _RETENTION_SIZE)
            check_retention(quota, time_min, size_mb, "topic")
        quotas = dict(store.topic_value(name.full, bq.POLICY_NAME) or {})
        quotas[qtype] = quota.to_json()
        store.update_topic(name.full, {bq.POLICY_NAME: quotas})
        return no_content()

    @router.delete(_TOPIC + "backlogQuota", status_code=204)
    async def remove_topic_quota(
        tenant: str, namespace: str, topic: str, kind: QuotaTypeQuery = None
    ) -> Response:
        """Remove the topic's quota of one type (the namespace's, else the broker's, applies)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        qtype = quota_type(kind)
        quotas = dict(store.topic_value(name.full, bq.POLICY_NAME) or {})
        quotas.pop(qtype, None)
        store.update_topic(name.full, {bq.POLICY_NAME: quotas or None})
        return no_content()

    # --- inactive topic policies ------------------------------------------------------------
    @router.get(_NS + "inactiveTopicPolicies")
    async def get_namespace_inactive(tenant: str, namespace: str) -> dict[str, Any] | None:
        """The namespace's ``InactiveTopicPolicies`` (null when not set)."""
        ns = resolve.namespace(tenant, namespace)
        value = store.namespace_value(ns, it.POLICY_NAME)
        return dict(value) if value is not None else None

    @router.post(_NS + "inactiveTopicPolicies", status_code=204)
    async def set_namespace_inactive(
        tenant: str, namespace: str, body: JsonBody = None
    ) -> Response:
        """Set the namespace's ``InactiveTopicPolicies``."""
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {it.POLICY_NAME: parse_inactive(body).to_json()})
        return no_content()

    @router.delete(_NS + "inactiveTopicPolicies", status_code=204)
    async def remove_namespace_inactive(tenant: str, namespace: str) -> Response:
        """Remove the namespace's ``InactiveTopicPolicies`` (the broker's apply)."""
        store.update_namespace(resolve.namespace(tenant, namespace), {it.POLICY_NAME: None})
        return no_content()

    @router.get(_TOPIC + "inactiveTopicPolicies")
    async def get_topic_inactive(
        tenant: str, namespace: str, topic: str, applied: AppliedQuery = False
    ) -> dict[str, Any] | None:
        """The topic's own ``InactiveTopicPolicies`` (with ``applied``: those in force)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        if applied:
            return it.policies_in_force(store, name).to_json()
        value = store.topic_value(name.full, it.POLICY_NAME)
        return dict(value) if value is not None else None

    @router.post(_TOPIC + "inactiveTopicPolicies", status_code=204)
    async def set_topic_inactive(
        tenant: str, namespace: str, topic: str, body: JsonBody = None
    ) -> Response:
        """Set the topic's ``InactiveTopicPolicies``."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {it.POLICY_NAME: parse_inactive(body).to_json()})
        return no_content()

    @router.delete(_TOPIC + "inactiveTopicPolicies", status_code=204)
    async def remove_topic_inactive(tenant: str, namespace: str, topic: str) -> Response:
        """Remove the topic's ``InactiveTopicPolicies``."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {it.POLICY_NAME: None})
        return no_content()

    return router
