"""Admin REST API under ``/admin/v2`` with Pulsar's paths and JSON field names."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from keyshared import __version__
from keyshared.admin.permissions import add_permission_routes
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.service import BrokerService
from keyshared.broker.topic_name import TopicName

_HTTP_STATUS = {
    ServerError.TopicNotFound: 404,
    ServerError.SubscriptionNotFound: 404,
    ServerError.ConsumerNotFound: 404,
    ServerError.NotAllowedError: 409,
    ServerError.InvalidTopicName: 412,
    ServerError.AuthenticationError: 401,
    ServerError.AuthorizationError: 403,
    ServerError.ServiceNotReady: 503,
    ServerError.MetadataError: 500,
    ServerError.PersistenceError: 500,
}


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
        return ORJSONResponse({"reason": exc.message}, status_code=_HTTP_STATUS.get(exc.code, 500))

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

    # --- tenants and namespaces --------------------------------------------------------------
    @app.get("/admin/v2/tenants")
    async def list_tenants() -> list[str]:
        return [k.split("/", 1)[1] for k in service.storage.metadata.list_keys("tenants/")]

    @app.get("/admin/v2/namespaces/{tenant}")
    async def list_namespaces(tenant: str) -> list[str]:
        return [
            k.split("/", 1)[1] for k in service.storage.metadata.list_keys(f"namespaces/{tenant}/")
        ]

    # --- topics ------------------------------------------------------------------------------
    @app.get("/admin/v2/persistent/{tenant}/{namespace}")
    async def list_topics(tenant: str, namespace: str) -> list[str]:
        ns = f"{tenant}/{namespace}"
        if not service.namespace_exists(ns):
            raise BrokerError(ServerError.TopicNotFound, f"Namespace {ns} does not exist")
        return sorted(service.list_topics(ns))

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/partitioned")
    async def list_partitioned(tenant: str, namespace: str) -> list[str]:
        ns = f"{tenant}/{namespace}"
        if not service.namespace_exists(ns):
            raise BrokerError(ServerError.TopicNotFound, f"Namespace {ns} does not exist")
        return sorted(service.list_partitioned_topics(ns))

    @app.put("/admin/v2/persistent/{tenant}/{namespace}/{topic}", status_code=204)
    async def create_topic(tenant: str, namespace: str, topic: str) -> Response:
        service.create_topic(topic_name(tenant, namespace, topic))
        return Response(status_code=204)

    @app.delete("/admin/v2/persistent/{tenant}/{namespace}/{topic}", status_code=204)
    async def delete_topic(
        tenant: str, namespace: str, topic: str, force: bool = Query(False)
    ) -> Response:
        await service.delete_topic(topic_name(tenant, namespace, topic), force=force)
        return Response(status_code=204)

    @app.put("/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions", status_code=204)
    async def create_partitioned(
        tenant: str, namespace: str, topic: str, partitions: int = Body(...)
    ) -> Response:
        service.create_partitioned_topic(topic_name(tenant, namespace, topic), partitions)
        return Response(status_code=204)

    @app.post("/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions", status_code=204)
    async def update_partitioned(
        tenant: str, namespace: str, topic: str, partitions: int = Body(...)
    ) -> Response:
        service.update_partitioned_topic(topic_name(tenant, namespace, topic), partitions)
        return Response(status_code=204)

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions")
    async def get_partitions(tenant: str, namespace: str, topic: str) -> dict[str, int]:
        return {"partitions": service.partitions_of(topic_name(tenant, namespace, topic))}

    @app.delete("/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions", status_code=204)
    async def delete_partitioned(
        tenant: str, namespace: str, topic: str, force: bool = Query(False)
    ) -> Response:
        await service.delete_partitioned_topic(topic_name(tenant, namespace, topic), force=force)
        return Response(status_code=204)

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/stats")
    async def topic_stats(tenant: str, namespace: str, topic: str) -> Any:
        return existing_topic(tenant, namespace, topic).stats()

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/internalStats")
    async def topic_internal_stats(tenant: str, namespace: str, topic: str) -> Any:
        return existing_topic(tenant, namespace, topic).internal_stats()

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/subscriptions")
    async def topic_subscriptions(tenant: str, namespace: str, topic: str) -> list[str]:
        return sorted(existing_topic(tenant, namespace, topic).subscriptions)

    @app.get("/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitioned-stats")
    async def partitioned_stats(
        tenant: str, namespace: str, topic: str, perPartition: bool = Query(True)
    ) -> Any:
        name = topic_name(tenant, namespace, topic)
        n = service.partitions_of(name)
        if n == 0:
            raise BrokerError(ServerError.TopicNotFound, f"Partitioned topic {name} not found")
        parts: dict[str, Any] = {}
        for i in range(n):
            part = name.partition(i)
            parts[part.full] = service.get_topic(part, create=True).stats()
        return _aggregate_partitioned(n, parts, per_partition=perPartition)

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

    def policies_changed() -> None:
        for t in list(service.topics.values()):
            t.on_policies_changed()

    def policy_routes(key: str, path: str) -> None:
        """GET/POST/DELETE of one boolean policy on namespaces and on topics."""
        ns_path = f"/admin/v2/namespaces/{{tenant}}/{{namespace}}/{path}"
        topic_path = f"/admin/v2/persistent/{{tenant}}/{{namespace}}/{{topic}}/{path}"

        @app.get(ns_path, name=f"get_ns_{path}")
        async def get_ns(tenant: str, namespace: str) -> Any:
            return (service.policies.namespace(namespace_name(tenant, namespace)) or {}).get(key)

        @app.post(ns_path, status_code=204, name=f"set_ns_{path}")
        async def set_ns(tenant: str, namespace: str) -> Response:
            service.policies.set_namespace(namespace_name(tenant, namespace), key, True)
            policies_changed()
            return Response(status_code=204)

        @app.delete(ns_path, status_code=204, name=f"remove_ns_{path}")
        async def remove_ns(tenant: str, namespace: str) -> Response:
            service.policies.set_namespace(namespace_name(tenant, namespace), key, None)
            policies_changed()
            return Response(status_code=204)

        @app.get(topic_path, name=f"get_topic_{path}")
        async def get_topic(tenant: str, namespace: str, topic: str) -> Any:
            return service.policies.topic(topic_name(tenant, namespace, topic).full).get(key)

        @app.post(topic_path, status_code=204, name=f"set_topic_{path}")
        async def set_topic(
            tenant: str, namespace: str, topic: str, enabled: bool = Body(True)
        ) -> Response:
            service.policies.set_topic(topic_name(tenant, namespace, topic).full, key, enabled)
            policies_changed()
            return Response(status_code=204)

        @app.delete(topic_path, status_code=204, name=f"remove_topic_{path}")
        async def remove_topic(tenant: str, namespace: str, topic: str) -> Response:
            service.policies.set_topic(topic_name(tenant, namespace, topic).full, key, None)
            policies_changed()
            return Response(status_code=204)

    policy_routes(
        "dispatcherPauseOnAckStatePersistentEnabled", "dispatcherPauseOnAckStatePersistent"
    )

    add_permission_routes(app, service)

    @app.get("/admin/v2/brokers/health")
    async def health() -> Response:
        return Response("ok", media_type="text/plain")

    return app


_SUMMED = (
    "msgRateIn",
    "msgThroughputIn",
    "msgRateOut",
    "msgThroughputOut",
    "bytesInCounter",
    "msgInCounter",
    "bytesOutCounter",
    "msgOutCounter",
    "storageSize",
    "backlogSize",
)


def _aggregate_partitioned(n: int, parts: dict[str, Any], *, per_partition: bool) -> dict[str, Any]:
    """PartitionedTopicStats: sums over partitions, subscriptions merged by name."""
    out: dict[str, Any] = {k: 0 for k in _SUMMED}
    out["metadata"] = {"partitions": n}
    out["publishers"] = []
    subs: dict[str, Any] = {}
    for st in parts.values():
        for k in _SUMMED:
            out[k] += st[k]
        out["publishers"].extend(st["publishers"])
        for name, s in st["subscriptions"].items():
            agg = subs.setdefault(
                name,
                {
                    "msgBacklog": 0,
                    "unackedMessages": 0,
                    "msgOutCounter": 0,
                    "bytesOutCounter": 0,
                    "type": s["type"],
                    "consumers": [],
                },
            )
            for k in ("msgBacklog", "unackedMessages", "msgOutCounter", "bytesOutCounter"):
                agg[k] += s[k]
            agg["consumers"].extend(s["consumers"])
    out["subscriptions"] = subs
    out["averageMsgSize"] = (
        out["bytesInCounter"] / out["msgInCounter"] if out["msgInCounter"] else 0
    )
    out["partitions"] = parts if per_partition else {}
    return out
