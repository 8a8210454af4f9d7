"""Topic-level geo-replication policy: ``/admin/v2/persistent/{t}/{ns}/{topic}/replication``.

As Pulsar's ``TopicPolicies.replicationClusters``: ``POST`` a JSON list of clusters (each known,
412 otherwise, and allowed by the tenant, 403), ``GET`` the topic's own list (null when not set;
``?applied=true`` gives the one in force, the namespace's ``replication_clusters`` otherwise),
``DELETE`` falls back to the namespace's. Set on a partitioned topic, it applies to every
partition. The namespace-level calls are in ``admin.routes_namespaces``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from keyshared.admin.rest import Resolver, RestError, no_content
from keyshared.broker.replication import TOPIC_REPLICATION_FIELD, effective_replication_clusters
from keyshared.broker.service import BrokerService

_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}/replication"


def check_replication_clusters(
    service: BrokerService, tenant: str, clusters: list[str]
) -> list[str]:
    """Pulsar's checks: every cluster known (412) and allowed by the tenant (403)."""
    unknown = [c for c in clusters if not service.clusters.exists(c)]
    if unknown:
        raise RestError(412, f"Clusters do not exist: {', '.join(unknown)}")
    allowed = service.tenant_allowed_clusters(tenant)
    for c in clusters:
        if allowed and c not in allowed:
            raise RestError(
                403,
                f"Cluster {c} is not in the list of allowed clusters list for tenant [{tenant}]",
            )
    return clusters


def replication_routes(service: BrokerService) -> APIRouter:
    """The topic-level replication routes of ``service``."""
    router = APIRouter(tags=["persistent topic"])
    resolve = Resolver(service)
    store = service.policies

    @router.get(_TOPIC)
    async def get_topic_replication(
        tenant: str, namespace: str, topic: str, applied: bool = Query(False)
    ) -> list[str] | None:
        """The topic's replication clusters (with ``applied``: the ones in force)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        if applied:
            return effective_replication_clusters(service, name)
        value = store.topic(name.full).get(TOPIC_REPLICATION_FIELD)
        return list(value) if value else None

    @router.post(_TOPIC, status_code=204)
    async def set_topic_replication(
        tenant: str, namespace: str, topic: str, clusters: Annotated[list[str], Body()]
    ) -> Response:
        """Replicate the topic to ``clusters`` (over the namespace's setting)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        if not clusters:
            raise RestError(412, "ClusterIds should not be null or empty")
        checked = check_replication_clusters(service, tenant, sorted(set(clusters)))
        store.set_topic(name.full, TOPIC_REPLICATION_FIELD, checked)
        return no_content()

    @router.delete(_TOPIC, status_code=204)
    async def remove_topic_replication(tenant: str, namespace: str, topic: str) -> Response:
        """Fall back to the namespace's replication clusters."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.set_topic(name.full, TOPIC_REPLICATION_FIELD, None)
        return no_content()

    return router
