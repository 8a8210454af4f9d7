"""Namespace permissions through the admin API, on Pulsar's paths.

``GET /admin/v2/namespaces/{tenant}/{namespace}/permissions`` answers ``{role: [actions]}``;
``POST .../permissions/{role}`` with a JSON array of actions grants them (replacing that role's
grant); ``DELETE .../permissions/{role}`` revokes. Who may call them is decided in front of the
application (admin.http_auth: the tenant's admins and super users).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from fastapi import Body, FastAPI
from fastapi.responses import Response

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.service import BrokerService

_PATH = "/admin/v2/namespaces/{tenant}/{namespace}/permissions"


class AuthAction(StrEnum):
    """Pulsar's ``AuthAction``; this broker enforces ``produce`` and ``consume``."""

    produce = "produce"
    consume = "consume"
    functions = "functions"
    sources = "sources"
    sinks = "sinks"
    packages = "packages"


def add_permission_routes(app: FastAPI, service: BrokerService) -> None:
    """Register the permission routes of ``service`` on ``app``."""

    def existing(tenant: str, namespace: str) -> str:
        ns = f"{tenant}/{namespace}"
        if not service.namespace_exists(ns):
            raise BrokerError(ServerError.TopicNotFound, f"Namespace {ns} does not exist")
        return ns

    @app.get(_PATH)
    async def get_permissions(tenant: str, namespace: str) -> dict[str, list[str]]:
        """The roles with permissions on the namespace and their actions."""
        return service.namespace_permissions(existing(tenant, namespace))

    @app.post(_PATH + "/{role}", status_code=204)
    async def grant_permission(
        tenant: str, namespace: str, role: str, actions: Annotated[list[AuthAction], Body()]
    ) -> Response:
        """Grant ``actions`` to ``role`` on the namespace."""
        ns = existing(tenant, namespace)
        service.set_namespace_permission(ns, role, [a.value for a in actions])
        return Response(status_code=204)

    @app.delete(_PATH + "/{role}", status_code=204)
    async def revoke_permission(tenant: str, namespace: str, role: str) -> Response:
        """Revoke every permission of ``role`` on the namespace."""
        service.set_namespace_permission(existing(tenant, namespace), role, None)
        return Response(status_code=204)
