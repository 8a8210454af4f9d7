"""HTTP topic lookup: ``GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}``.

What a client given an ``http://`` service URL asks first (Pulsar's v2 ``TopicLookup``): the
broker that serves the topic, as Pulsar's ``LookupData`` JSON. This single broker serves every
topic, so the answer is this cluster's own URLs, on the advertised address.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.service import BrokerService

_DOMAINS = ("persistent", "non-persistent")


def lookup_routes(service: BrokerService) -> APIRouter:
    """The lookup resource bound to ``service``."""
    router = APIRouter()

    @router.get("/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}")
    async def lookup_topic(domain: str, tenant: str, namespace: str, topic: str) -> Any:
        """Where the topic is served (``brokerUrl``, ``brokerUrlTls``, ``httpUrl``, ...)."""
        if domain not in _DOMAINS:
            raise BrokerError(ServerError.InvalidTopicName, f"Invalid topic domain {domain}")
        name = service.parse_topic(f"{domain}://{tenant}/{namespace}/{topic}")
        if not service.namespace_exists(name.namespace_name):
            raise BrokerError(
                ServerError.TopicNotFound, f"Namespace {name.namespace_name} does not exist"
            )
        local = service.clusters.get(service.clusters.local) or {}
        # Every field of Pulsar's LookupData, null when unset: the C++ client refuses an answer
        # without ``brokerUrlTls`` ("malformed json!") even on a plain-text connection.
        return {
            "brokerUrl": local.get("brokerServiceUrl", ""),
            "brokerUrlTls": local.get("brokerServiceUrlTls") or None,
            "httpUrl": local.get("serviceUrl", ""),
            "httpUrlTls": local.get("serviceUrlTls") or None,
            "nativeUrl": local.get("brokerServiceUrl", ""),
        }

    return router
