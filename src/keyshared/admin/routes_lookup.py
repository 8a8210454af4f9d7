"""HTTP topic lookup: ``GET /lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}``.

What a client given an ``http://`` service URL asks first (Pulsar's v2 ``TopicLookup``): the
broker that serves the topic, as Pulsar's ``LookupData`` JSON. This single broker serves every
topic, so the answer is this cluster's own URLs, on the advertised address. A client that names
an advertised listener (the ``listenerName`` query parameter, else the ``X-Pulsar-ListenerName``
header, as Pulsar reads them) gets that listener's broker URLs; an unknown listener is refused
with Pulsar's message.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Query

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.service import BrokerService
from keyshared.server.listeners import listener_for, parse_listeners

_DOMAINS = ("persistent", "non-persistent")


def lookup_routes(service: BrokerService) -> APIRouter:
    """The lookup resource bound to ``service``."""
    router = APIRouter()
    listeners, internal = parse_listeners(service.config)

    @router.get("/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}")
    async def lookup_topic(
        domain: str,
        tenant: str,
        namespace: str,
        topic: str,
        listener_name: str = Query("", alias="listenerName"),
        listener_header: str = Header("", alias="X-Pulsar-ListenerName"),
    ) -> Any:
        """Where the topic is served (``brokerUrl``, ``brokerUrlTls``, ``httpUrl``, ...)."""
        if domain not in _DOMAINS:
            raise BrokerError(ServerError.InvalidTopicName, f"Invalid topic domain {domain}")
        name = service.parse_topic(f"{domain}://{tenant}/{namespace}/{topic}")
        if not service.namespace_exists(name.namespace_name):
            raise BrokerError(
                ServerError.TopicNotFound, f"Namespace {name.namespace_name} does not exist"
            )
        local = service.clusters.get(service.clusters.local) or {}
        listener = listener_for(listeners, internal, listener_name or listener_header)
        broker_url = local.get("brokerServiceUrl", "")
        broker_url_tls = local.get("brokerServiceUrlTls") or None
        if listener is not None:
            broker_url, broker_url_tls = listener.url, listener.url_tls or None
        # Every field of Pulsar's LookupData, null when unset: the C++ client refuses an answer
        # without ``brokerUrlTls`` ("malformed json!") even on a plain-text connection.
        return {
            "brokerUrl": broker_url,
            "brokerUrlTls": broker_url_tls,
            "httpUrl": local.get("serviceUrl", ""),
            "httpUrlTls": local.get("serviceUrlTls") or None,
            "nativeUrl": broker_url,
        }

    return router
