"""Admin REST API under ``/admin/v2`` with Pulsar's paths and JSON field names."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from keyshared import __version__
from keyshared.admin.dashboard import add_dashboard_routes
from keyshared.admin.metrics import add_metrics_route
from keyshared.admin.permissions import add_permission_routes
from keyshared.admin.rest import Resolver, broker_error_status, install_rest_errors
from keyshared.admin.routes_clusters import cluster_routes
from keyshared.admin.routes_compaction import compaction_routes
from keyshared.admin.routes_limits import limit_routes
from keyshared.admin.routes_lookup import lookup_routes
from keyshared.admin.routes_namespaces import namespace_routes
from keyshared.admin.routes_nonpersistent import nonpersistent_routes
from keyshared.admin.routes_quotas import quota_routes
from keyshared.admin.routes_rates import rate_routes
from keyshared.admin.routes_replication import replication_routes
from keyshared.admin.routes_schemas import schema_routes
from keyshared.admin.routes_sub_types import sub_types_routes
from keyshared.admin.routes_subscriptions import subscription_routes
from keyshared.admin.routes_tenants import tenant_routes
from keyshared.admin.routes_topics import topic_routes
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.service import BrokerService
from keyshared.broker.topic_name import TopicName


class ORJSONResponse(JSONResponse):
    """JSON via orjson: stats can be large."""

    def render(self, content: Any) -> bytes:
        """Serialize ``content``."""
        return orjson.dumps(content)


def create_app(service: BrokerService) -> FastAPI:
    """The admin application bound to ``service``."""
    app = FastAPI(
        title="keyshared admin",
        version=__version__,
        default_response_class=ORJSONResponse,
    )

    @app.exception_handler(BrokerError)
    async def broker_error(_: Request, exc: BrokerError) -> Response:
        return ORJSONResponse({"reason": exc.message}, status_code=broker_error_status(exc.code))

    resolve = Resolver(service)

    def topic_name(tenant: str, namespace: str, topic: str) -> TopicName:
        name = service.parse_topic(f"persistent://{tenant}/{namespace}/{topic}")
        if not service.namespace_exists(name.namespace_name):
            raise BrokerError(
                ServerError.TopicNotFound, f"Namespace {name.namespace_name} does not exist"
            )
        return name

    def existing_topic(tenant: str, namespace: str, topic: str) -> Any:
        name = topic_name(tenant, namespace, topic)
        if not service.topic_exists(name):
            raise BrokerError(ServerError.TopicNotFound, f"Topic {name} not found")
        return service.get_topic(name, create=False)

    # Pulsar's resources, one module each; registered first so that their paths win.
    install_rest_errors(app)
    app.include_router(tenant_routes(service))
    app.include_router(cluster_routes(service))
    app.include_router(namespace_routes(service))
    app.include_router(topic_routes(service))
    app.include_router(replication_routes(service))
    app.include_router(subscription_routes(service))
    app.include_router(compaction_routes(service))
    app.include_router(sub_types_routes(service))
    app.include_router(limit_routes(service))
    app.include_router(quota_routes(service))
    app.include_router(rate_routes(service))
    app.include_router(nonpersistent_routes(service))
    app.include_router(lookup_routes(service))
    app.include_router(schema_routes(service))

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscription/{sub}/hashBlockers")
    async def hash_blockers(
        tenant: str,
        namespace: str,
        topic: str,
        sub: str,
        hash: int | None = Query(None, ge=0, le=65535),
        key: str | None = Query(None),
    ) -> Any:
        """What blocks a hash (or a key) of a Key_Shared subscription, and who holds it."""
        t = existing_topic(tenant, namespace, topic)
        s = t.subscriptions.get(sub)
        if s is None:
            raise BrokerError(ServerError.SubscriptionNotFound, f"Subscription {sub} not found")
        disp = s.dispatcher
        what_blocks = getattr(disp, "what_blocks", None)
        if what_blocks is None:
            raise BrokerError(
                ServerError.NotAllowedError, f"Subscription {sub} is not a Key_Shared subscription"
            )
        if (hash is None) == (key is None):
            raise BrokerError(ServerError.NotAllowedError, "Give exactly one of hash= or key=")
        slot = disp.slot_of_key(key.encode()) if key is not None else hash
        result: dict[str, Any] = what_blocks(slot)
        if key is not None:
            result["key"] = key
        return result

    # --- policies ----------------------------------------------------------------------------
    def namespace_name(tenant: str, namespace: str) -> str:
        ns = f"{tenant}/{namespace}"
        if not service.namespace_exists(ns):
            raise BrokerError(ServerError.TopicNotFound, f"Namespace {ns} does not exist")
        return ns

    def policy_routes(key: str, path: str) -> None:
        """GET/POST/DELETE of one boolean policy on namespaces and on topics."""
        ns_path = f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{path}"
        topic_path = f"/admin/v2/persistent/{{tenant}}/{{namespace}}/{{topic}}/{path}"

        @app.get(ns_path, name=f"get_ns_{path}")
        async def get_ns(tenant: str, namespace: str) -> Any:
            return service.policies.namespace_value(namespace_name(tenant, namespace), key)

        @app.post(ns_path, status_code=204, name=f"set_ns_{path}")
        async def set_ns(tenant: str, namespace: str) -> Response:
            service.policies.update_namespace(namespace_name(tenant, namespace), {key: True})
            return Response(status_code=204)

        @app.delete(ns_path, status_code=204, name=f"remove_ns_{path}")
        async def remove_ns(tenant: str, namespace: str) -> Response:
            service.policies.update_namespace(namespace_name(tenant, namespace), {key: None})
            return Response(status_code=204)

        @app.get(topic_path, name=f"get_topic_{path}")
        async def get_topic(tenant: str, namespace: str, topic: str) -> Any:
            return service.policies.topic_value(
                resolve.policy_topic(tenant, namespace, topic).full, key
            )

        @app.post(topic_path, status_code=204, name=f"set_topic_{path}")
        async def set_topic(
            tenant: str, namespace: str, topic: str, enabled: bool = Body(True)
        ) -> Response:
            name = resolve.policy_topic(tenant, namespace, topic)
            service.policies.update_topic(name.full, {key: enabled})
            return Response(status_code=204)

        @app.delete(topic_path, status_code=204, name=f"remove_topic_{path}")
        async def remove_topic(tenant: str, namespace: str, topic: str) -> Response:
            name = resolve.policy_topic(tenant, namespace, topic)
            service.policies.update_topic(name.full, {key: None})
            return Response(status_code=204)

    policy_routes(
        "dispatcherPauseOnAckStatePersistentEnabled", "dispatcherPauseOnAckStatePersistent"
    )

    add_permission_routes(app, service)
    add_metrics_route(app, service)
    add_dashboard_routes(app, service)

    @app.get("/admin/v2/brokers/health")
    async def health() -> Response:
        return Response("ok", media_type="text/plain")

    return app
