"""Tenants: ``/admin/v2/tenants`` as in Pulsar.

A tenant is stored as Pulsar's ``TenantInfo`` (``adminRoles``, ``allowedClusters``) under
``tenants/<name>``; every allowed cluster must be known (``admin.routes_clusters``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from keyshared.admin.rest import Resolver, RestError, check_name, no_content
from keyshared.broker.service import TENANTS_PREFIX, BrokerService
from keyshared.broker.topic_name import TopicName

_TENANTS = "/admin/v2/tenants"


class TenantInfo(BaseModel):
    """Pulsar's ``TenantInfo``."""

    model_config = ConfigDict(extra="ignore")

    adminRoles: list[str] = []
    allowedClusters: list[str] = []


def tenant_routes(service: BrokerService) -> APIRouter:
    """The tenant routes of ``service``."""
    router = APIRouter(tags=["tenants"])
    resolve = Resolver(service)
    md = service.storage.metadata

    def checked(info: TenantInfo | None) -> dict[str, Any]:
        info = info or TenantInfo()
        unknown = sorted(c for c in set(info.allowedClusters) if not service.clusters.exists(c))
        if unknown:
            raise RestError(412, f"Clusters do not exist: {', '.join(unknown)}")
        return {
            "adminRoles": sorted(set(info.adminRoles)),
            "allowedClusters": sorted(set(info.allowedClusters)),
        }

    @router.get(_TENANTS)
    async def list_tenants() -> list[str]:
        """The names of every tenant."""
        return [k[len(TENANTS_PREFIX) :] for k in md.list_keys(TENANTS_PREFIX)]

    @router.get(_TENANTS + "/{tenant}")
    async def get_tenant(tenant: str) -> Any:
        """The tenant's ``TenantInfo``."""
        resolve.tenant(tenant)
        info = md.get_json(TENANTS_PREFIX + tenant)
        info = info if isinstance(info, dict) else {}
        return {
            "adminRoles": info.get("adminRoles", []),
            "allowedClusters": info.get("allowedClusters", []),
        }

    @router.put(_TENANTS + "/{tenant}", status_code=204)
    async def create_tenant(
        tenant: str, info: Annotated[TenantInfo | None, Body()] = None
    ) -> Response:
        """Create a tenant (409 if it exists)."""
        check_name("tenant", tenant)
        if resolve.tenant_exists(tenant):
            raise RestError(409, "Tenant already exists")
        md.put_json(TENANTS_PREFIX + tenant, checked(info))
        return no_content()

    @router.post(_TENANTS + "/{tenant}", status_code=204)
    async def update_tenant(
        tenant: str, info: Annotated[TenantInfo | None, Body()] = None
    ) -> Response:
        """Replace a tenant's admin roles and allowed clusters."""
        resolve.tenant(tenant)
        record = md.get_json(TENANTS_PREFIX + tenant)
        record = dict(record) if isinstance(record, dict) else {}
        record.update(checked(info))
        md.put_json(TENANTS_PREFIX + tenant, record)
        return no_content()

    @router.delete(_TENANTS + "/{tenant}", status_code=204)
    async def delete_tenant(tenant: str, force: bool = Query(False)) -> Response:
        """Delete a tenant; with namespaces only when forced (they are deleted too)."""
        resolve.tenant(tenant)
        namespaces = resolve.namespaces_of(tenant)
        if namespaces and not force:
            raise RestError(409, "The tenant still has active namespaces")
        for ns in namespaces:
            await delete_namespace_data(service, resolve, ns)
        md.delete(TENANTS_PREFIX + tenant)
        return no_content()

    return router


async def delete_namespace_data(service: BrokerService, resolve: Resolver, namespace: str) -> None:
    """Delete every topic of ``namespace`` (closing their clients), then the namespace."""
    for base in service.list_partitioned_topics(namespace):
        await service.delete_partitioned_topic(TopicName.parse(base), force=True)
    for full in service.list_topics(namespace):
        name = TopicName.parse(full)
        if service.topic_exists(name):
            await service.delete_topic(name, force=True)
    service.policies.delete_namespace(namespace)
