"""Topic compaction on Pulsar's ``PersistentTopics`` paths.

``PUT .../compaction`` starts a compaction (204; 409 while one runs; on a partitioned topic,
every partition); ``GET .../compaction`` answers Pulsar's ``LongRunningProcessStatus``,
``{"status": "NOT_RUN" | "RUNNING" | "SUCCESS" | "ERROR", "lastError": "..."}``. The
threshold policy ``compactionThreshold`` (bytes, 0 = off) is ``GET/POST/DELETE
.../compactionThreshold`` on topics and ``.../compactionThreshold`` on namespaces (stored as
Pulsar's ``compaction_threshold``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import Response

from keyshared.admin.rest import Resolver, RestError, no_content
from keyshared.broker.service import BrokerService

_TOPIC = "/admin/v2/persistent/{tenant}/{namespace}/{topic}"
_NS = "/admin/v2/namespaces/{tenant}/{namespace}"
_THRESHOLD = "compactionThreshold"


def compaction_routes(service: BrokerService) -> APIRouter:
    """The compaction routes of ``service``."""
    router = APIRouter(tags=["compaction"])
    resolve = Resolver(service)
    store = service.policies

    @router.put(_TOPIC + "/compaction", status_code=204)
    async def trigger(tenant: str, namespace: str, topic: str) -> Response:
        """Start compacting the topic (every partition of a partitioned topic)."""
        name = resolve.topic_name(tenant, namespace, topic)
        topics = resolve.topics_for(name)
        if any(t.compactor.is_running for t in topics):
            raise RestError(409, "Compaction already in progress")
        for t in topics:
            t.compactor.trigger()
        return no_content()

    @router.get(_TOPIC + "/compaction")
    async def status(tenant: str, namespace: str, topic: str) -> dict[str, str]:
        """The status of the last compaction of the topic."""
        name = resolve.topic_name(tenant, namespace, topic)
        resolve.not_partitioned(name, "Get compaction status")
        return resolve.topic(name).compactor.status_json()

    # --- threshold policies ----------------------------------------------------------------
    def check_threshold(value: int) -> int:
        if value < 0:
            raise RestError(412, "compactionThreshold must be 0 or more")
        return value

    @router.get(_TOPIC + "/compactionThreshold")
    async def get_topic_threshold(tenant: str, namespace: str, topic: str) -> Any:
        """The topic's own threshold (null when it has none)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        return store.topic_value(name.full, _THRESHOLD)

    @router.post(_TOPIC + "/compactionThreshold", status_code=204)
    async def set_topic_threshold(
        tenant: str, namespace: str, topic: str, value: Annotated[int, Body()]
    ) -> Response:
        """Set the topic's threshold in bytes."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {_THRESHOLD: check_threshold(value)})
        return no_content()

    @router.delete(_TOPIC + "/compactionThreshold", status_code=204)
    async def remove_topic_threshold(tenant: str, namespace: str, topic: str) -> Response:
        """Remove the topic's threshold (the namespace's or broker's applies)."""
        name = resolve.policy_topic(tenant, namespace, topic)
        store.update_topic(name.full, {_THRESHOLD: None})
        return no_content()

    @router.get(_NS + "/compactionThreshold")
    async def get_ns_threshold(tenant: str, namespace: str) -> Any:
        """The namespace's threshold (null when it has none)."""
        ns = resolve.namespace(tenant, namespace)
        return store.namespace_value(ns, _THRESHOLD)

    @router.put(_NS + "/compactionThreshold", status_code=204)
    async def set_ns_threshold(
        tenant: str, namespace: str, value: Annotated[int, Body()]
    ) -> Response:
        """Set the namespace's threshold in bytes."""
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {_THRESHOLD: check_threshold(value)})
        return no_content()

    @router.delete(_NS + "/compactionThreshold", status_code=204)
    async def remove_ns_threshold(tenant: str, namespace: str) -> Response:
        """Remove the namespace's threshold."""
        ns = resolve.namespace(tenant, namespace)
        store.update_namespace(ns, {_THRESHOLD: None})
        return no_content()

    return router
