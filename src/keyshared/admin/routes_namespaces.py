"""Namespaces: ``/admin/v2/namespaces/{tenant}/{namespace}`` and the policies this broker honours.

Paths and bodies follow Pulsar's ``Namespaces`` resource: ``deduplication`` (body ``true`` /
``false``), ``retention`` (body ``RetentionPolicies``), ``messageTTL`` (body: seconds),
``clearBacklog``, ``unload``, ``topics``. A changed policy reaches loaded topics at once (each
topic resolves policies topic over namespace over broker setting); permissions are served by
``admin.permissions`` and the PIP-299 pause policy by ``admin.app``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from keyshared.admin.policy_models import (
    DEDUPLICATION,
    MESSAGE_TTL,
    RETENTION_SIZE,
    RETENTION_TIME,
    NamespacePolicies,
    RetentionPolicies,
    check_ttl,
    namespace_view,
    retention_of,
)
from keyshared.admin.rest import Resolver, RestError, check_name, no_content
from keyshared.admin.routes_quotas import check_retention_fits
from keyshared.admin.routes_replication import check_replication_clusters as check_clusters
from keyshared.admin.routes_tenants import delete_namespace_data
from keyshared.admin.topic_ops import unload_topic
from keyshared.broker.backlog_quota import POLICY_NAME as BACKLOG_QUOTAS
from keyshared.broker.service import BrokerService
from keyshared.broker.topic_name import TopicName

_NS = "/admin/v2/namespaces/{tenant}/{namespace}"


def namespace_routes(service: BrokerService) -> APIRouter:
    """The namespace routes of ``service``."""
    router = APIRouter(tags=["namespaces"])
    resolve = Resolver(service)
    store = service.policies

    @router.get("/admin/v2/namespaces/{tenant}")
    async def list_namespaces(tenant: str) -> list[str]:
        """The tenant's namespaces as ``tenant/namespace``."""
        return resolve.namespaces_of(resolve.tenant(tenant))

    @router.put(_NS, status_code=204)
    async def create_namespace(
        tenant: str,
        namespace: str,
        body: Annotated[Any, Body()] = None,
    ) -> Response:
        """Create a namespace with the ``Policies`` given, honoured whole (409 if it exists;
        501 naming a policy this broker does not implement)."""
        resolve.tenant(tenant)
        check_name("namespace", namespace)
        ns = f"{tenant}/{namespace}"
        if service.namespace_exists(ns):
            raise RestError(409, "Namespace already exists")
        policies = NamespacePolicies(body)
        record = policies.flat()
        clusters = policies.replication_clusters()
        if clusters:
            record["replication_clusters"] = check_clusters(service, tenant, clusters)
        auth = policies.auth_policies()
        if auth is not None:
            record["auth_policies"] = auth
        store.create_namespace(ns, record)
        return no_content()

    @router.get(_NS)
    async def get_policies(tenant: str, namespace: str) -> Any:
        """The namespace's ``Policies``."""
        ns = resolve.namespace(tenant, namespace)
        return namespace_view(
            store.namespace(ns) or {},
            service.namespace_permissions(ns),
            service.config.clusterName,
        )

    @router.delete(_NS, status_code=204)
    async def delete_namespace(tenant: str, namespace: str, force: bool = Query(False)) -> Response:
        """Delete a namespace; with topics only when forced (they are deleted too)."""
        ns = resolve.namespace(tenant, namespace)
        if not force and (service.list_topics(ns) or service.list_partitioned_topics(ns)):
            raise RestError(409, "Cannot delete non empty namespace")
        await delete_namespace_data(service, resolve, ns)
        return no_content()

    @router.get(_NS + "/topics")
    async def namespace_topics(tenant: str, namespace: str) -> list[str]:
        """Every topic of the namespace (partitions listed one by one)."""
        return resolve.topics_of(resolve.namespace(tenant, namespace))

    @router.post(_NS + "/clearBacklog", status_code=204)
    async def clear_namespace_backlog(tenant: str, namespace: str) -> Response:
        """Clear the backlog of every subscription of every topic in the namespace."""
        ns = resolve.namespace(tenant, namespace)
        for full in resolve.topics_of(ns):
            topic = resolve.topic(TopicName.parse(full))
            for sub in list(topic.subscriptions.values()):
                sub.clear_backlog()
        return no_content()

    @router.post(_NS + "/clearBacklog/{subscription}", status_code=204)
    async def clear_namespace_subscription_backlog(
        tenant: str, namespace: str, subscription: str
    ) -> Response:
        """Clear the backlog of ``subscription`` on every topic of the namespace."""
        ns = resolve.namespace(tenant, namespace)
        for full in resolve.topics_of(ns):
            sub = resolve.topic(TopicName.parse(full)).subscriptions.get(subscription)
            if sub is not None:
                sub.clear_backlog()
        return no_content()

    @router.put(_NS + "/unload", status_code=204)
    async def unload_namespace(tenant: str, namespace: str) -> Response:
        """Unload every loaded topic of the namespace (clients reconnect and reload them)."""
        ns = resolve.namespace(tenant, namespace)
        for topic in [t for t in service.topics.values() if t.name.namespace_name == ns]:
            await unload_topic(service, topic)
        return no_content()

    # --- policies ----------------------------------------------------------------------------
    @router.get(_NS + "/replication")
    async def get_replication_clusters(tenant: str, namespace: str) -> list[str]:
        """The clusters the namespace replicates to (the local one when none was set)."""
        record = store.namespace(resolve.namespace(tenant, namespace)) or {}
        return list(record.get("replication_clusters") or [service.clusters.local])

    @router.post(_NS + "/replication", status_code=204)
    async def set_replication_clusters(
        tenant: str, namespace: str, clusters: Annotated[list[str], Body()]
    ) -> Response:
        """Set the namespace's ``replication_clusters`` (each known and allowed by the tenant):
        its topics start replicating to the other clusters named (``broker/replication``)."""
        ns = resolve.namespace(tenant, namespace)
        if not clusters:
            raise RestError(412, "ClusterIds should not be null or empty")
        store.set_namespace(
            ns, "replication_clusters", check_clusters(service, tenant, sorted(set(clusters)))
        )
        return no_content()

    @router.get(_NS + "/deduplication")
    async def get_deduplication(tenant: str, namespace: str) -> bool | None:
        """The namespace's deduplication setting (null when not set)."""
        ns = resolve.namespace(tenant, namespace)
        value = store.namespace_value(ns, DEDUPLICATION)
        return None if value is None else bool(value)

    @router.post(_NS + "/deduplication", status_code=204)
    async def set_deduplication(
        tenant: str, namespace: str, enabled: Annotated[bool, Body()]
    ) -> Response:
        """Enable or disable deduplication for the namespace's topics."""
        store.update_namespace(resolve.namespace(tenant, namespace), {DEDUPLICATION: enabled})
        return no_content()

    @router.delete(_NS + "/deduplication", status_code=204)
    async def remove_deduplication(tenant: str, namespace: str) -> Response:
        """Fall back to the broker's ``brokerDeduplicationEnabled``."""
        store.update_namespace(resolve.namespace(tenant, namespace), {DEDUPLICATION: None})
        return no_content()

    @router.get(_NS + "/retention")
    async def get_retention(tenant: str, namespace: str) -> dict[str, int] | None:
        """The namespace's ``RetentionPolicies`` (null when not set)."""
        return retention_of(store.namespace(resolve.namespace(tenant, namespace)) or {})

    @router.post(_NS + "/retention", status_code=204)
    async def set_retention(
        tenant: str, namespace: str, retention: Annotated[RetentionPolicies, Body()]
    ) -> Response:
        """Set the namespace's retention (time in minutes, size in MB; -1 = unlimited)."""
        ns = resolve.namespace(tenant, namespace)
        retention.validate_pulsar()
        check_retention_fits(
            store.namespace_value(ns, BACKLOG_QUOTAS),
            retention.retentionTimeInMinutes,
            retention.retentionSizeInMB,
            "namespace",
        )
        store.update_namespace(
            ns,
            {
                RETENTION_TIME: retention.retentionTimeInMinutes,
                RETENTION_SIZE: retention.retentionSizeInMB,
            },
        )
        return no_content()

    @router.delete(_NS + "/retention", status_code=204)
    async def remove_retention(tenant: str, namespace: str) -> Response:
        """Fall back to the broker's ``defaultRetention*`` settings."""
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {RETENTION_TIME: None, RETENTION_SIZE: None})
        return no_content()

    @router.get(_NS + "/messageTTL")
    async def get_message_ttl(tenant: str, namespace: str) -> int | None:
        """The namespace's message TTL in seconds (null when not set)."""
        value = store.namespace_value(resolve.namespace(tenant, namespace), MESSAGE_TTL)
        return None if value is None else int(value)

    @router.post(_NS + "/messageTTL", status_code=204)
    async def set_message_ttl(
        tenant: str, namespace: str, ttl: Annotated[int, Body(ge=-(2**31), le=2**31 - 1)]
    ) -> Response:
        """Set the namespace's message TTL in seconds (0 = messages never expire)."""
        store.update_namespace(resolve.namespace(tenant, namespace), {MESSAGE_TTL: check_ttl(ttl)})
        return no_content()

    @router.delete(_NS + "/messageTTL", status_code=204)
    async def remove_message_ttl(tenant: str, namespace: str) -> Response:
        """Fall back to the broker's ``ttlDurationDefaultInSeconds``."""
        store.update_namespace(resolve.namespace(tenant, namespace), {MESSAGE_TTL: None})
        return no_content()

    return router
