"""Clusters: ``/admin/v2/clusters`` and ``/admin/v2/clusters/{cluster}`` as Pulsar's ``Clusters``.

Bodies are Pulsar's ``ClusterData`` JSON. Status codes and reasons follow Pulsar's
``ClustersBase``: 409 "Cluster already exists" on PUT, 404 "Cluster does not exist", 412
"Cluster not empty" when deleting a cluster a tenant allows or a namespace replicates to, 412
"Cluster name is not valid", 400 for a bad URL. A field ``ClusterData`` does not have is refused
by name (400), never dropped, and so are key stores and custom SSL factories (the replicator
reads PEM files) and a proxy setting the replicator could not honour:
``proxyProtocol`` is ``SNI`` (Pulsar's only one) and goes with a ``proxyServiceUrl`` and the
other way round (Pulsar ignores either alone), SNI routing is a TLS extension (a
``pulsar+ssl://`` proxy, a ``brokerServiceUrlTls`` to reach) and carries host names only (RFC
6066: never an IP address).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any
from urllib.parse import urlparse

from fastapi import APIRouter, Body
from fastapi.responses import Response

from keyshared.admin.rest import RestError, no_content
from keyshared.broker.clusters import CLUSTER_DATA_FIELDS
from keyshared.broker.service import BrokerService

_CLUSTERS = "/admin/v2/clusters"
_NAME = re.compile(r"^[-=:.\w]+$")

# Pulsar's ClusterDataImpl.checkPropertiesIfPresent: the scheme each URL must have.
_URL_SCHEMES = {
    "serviceUrl": ("http", "Illegal service url, example: http://pulsar.example.com:8080"),
    "serviceUrlTls": (
        "https",
        "Illegal service tls url, example: https://pulsar.example.com:8443",
    ),
    "brokerServiceUrl": (
        "pulsar",
        "Illegal broker service url, example: pulsar://pulsar.example.com:6650",
    ),
    "brokerServiceUrlTls": (
        "pulsar+ssl",
        "Illegal broker service tls url, example: pulsar+ssl://pulsar.example.com:6651",
    ),
}
_PROXY_SCHEMES = ("pulsar://", "pulsar+ssl://")
_PROXY_URL_ERROR = (
    "Illegal proxy service url, example: pulsar+ssl://ats-proxy.example.com:4443 "
    "or pulsar://ats-proxy.example.com:4080"
)
DEFAULT_SSL_FACTORY = "org.apache.pulsar.common.util.DefaultPulsarSslFactory"
"""Pulsar's default ``brokerClientSslFactoryPlugin`` (what the replicator does anyway)."""
PROXY_PROTOCOLS = ("SNI",)
"""Pulsar's ``ProxyProtocol`` values."""
_BOOLEAN_FIELDS = frozenset(
    {"brokerClientTlsEnabled", "tlsAllowInsecureConnection", "brokerClientTlsEnabledWithKeyStore"}
)


def cluster_data(body: Any) -> dict[str, Any]:
    """A checked ``ClusterData`` body (400 naming what is wrong); null fields are dropped."""
    if not isinstance(body, dict):
        raise RestError(400, "cluster data is required")
    unknown = sorted(set(body) - CLUSTER_DATA_FIELDS)
    if unknown:
        raise RestError(400, f"Unknown ClusterData field(s): {', '.join(unknown)}")
    data: dict[str, Any] = {}
    for key, value in body.items():
        if value is None:
            continue
        if key in _BOOLEAN_FIELDS:
            if not isinstance(value, bool):
                raise RestError(400, f"ClusterData field {key} must be a boolean")
        elif key == "peerClusterNames":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RestError(400, "ClusterData field peerClusterNames must be a list of names")
            value = list(dict.fromkeys(value))
        elif not isinstance(value, str):
            raise RestError(400, f"ClusterData field {key} must be a string")
        scheme = _URL_SCHEMES.get(key)
        if scheme is not None and value and not value.startswith(scheme[0] + "://"):
            raise RestError(400, scheme[1])
        data[key] = value
    _check_proxy(data)
    _check_tls_material(data)
    return data


def _check_tls_material(data: dict[str, Any]) -> None:
    """Refuse (400, by name) TLS material the replicator cannot load (it reads PEM files)."""
    if data.get("brokerClientTlsEnabledWithKeyStore"):
        raise RestError(
            400,
            "brokerClientTlsEnabledWithKeyStore is not supported: key stores cannot be read "
            "here; use brokerClientTrustCertsFilePath, brokerClientCertificateFilePath and "
            "brokerClientKeyFilePath (PEM)",
        )
    plugin = data.get("brokerClientSslFactoryPlugin")
    if plugin and plugin != DEFAULT_SSL_FACTORY:
        raise RestError(
            400,
            f"brokerClientSslFactoryPlugin {plugin} is not supported "
            f"(only {DEFAULT_SSL_FACTORY}, the PEM files)",
        )


def _check_proxy(data: dict[str, Any]) -> None:
    """Refuse (400, by name) a proxy setting the replicator could not honour."""
    url = str(data.get("proxyServiceUrl") or "")
    protocol = data.get("proxyProtocol")
    if url and not url.startswith(_PROXY_SCHEMES):
        raise RestError(400, _PROXY_URL_ERROR)
    if protocol is None and not url:
        return
    if protocol is not None and protocol not in PROXY_PROTOCOLS:
        raise RestError(400, f"Illegal proxyProtocol {protocol}: the only proxy protocol is SNI")
    if not url:
        raise RestError(400, "proxyProtocol SNI needs a proxyServiceUrl to connect to")
    if protocol is None:
        raise RestError(400, "proxyServiceUrl needs a proxyProtocol (SNI)")
    if not url.startswith("pulsar+ssl://"):
        raise RestError(400, "proxyProtocol SNI routes TLS: proxyServiceUrl must be pulsar+ssl://")
    broker_tls = str(data.get("brokerServiceUrlTls") or "")
    if not broker_tls:
        raise RestError(400, "proxyProtocol SNI needs a brokerServiceUrlTls (the SNI host name)")
    host = urlparse(broker_tls).hostname or ""
    if _is_ip_address(host):
        raise RestError(
            400,
            "proxyProtocol SNI needs a host name in brokerServiceUrlTls: "
            f"SNI cannot carry the IP address {host}",
        )


def _is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def cluster_routes(service: BrokerService) -> APIRouter:
    """The cluster routes of ``service``."""
    router = APIRouter(tags=["clusters"])
    clusters = service.clusters

    def existing(cluster: str) -> dict[str, Any]:
        data = clusters.get(cluster)
        if data is None:
            raise RestError(404, "Cluster does not exist")
        return data

    @router.get(_CLUSTERS)
    async def list_clusters() -> list[str]:
        """Every known cluster's name (this broker's own one included)."""
        return clusters.names()

    @router.get(_CLUSTERS + "/{cluster}")
    async def get_cluster(cluster: str) -> dict[str, Any]:
        """The cluster's ``ClusterData`` (404 if unknown)."""
        return existing(cluster)

    @router.put(_CLUSTERS + "/{cluster}", status_code=204)
    async def create_cluster(cluster: str, body: Annotated[Any, Body()] = None) -> Response:
        """Create a cluster (409 if it exists, 412 for an invalid name)."""
        if not _NAME.match(cluster):
            raise RestError(412, "Cluster name is not valid")
        data = cluster_data(body)
        if clusters.exists(cluster):
            raise RestError(409, "Cluster already exists")
        clusters.put(cluster, data)
        return no_content()

    @router.post(_CLUSTERS + "/{cluster}", status_code=204)
    async def update_cluster(cluster: str, body: Annotated[Any, Body()] = None) -> Response:
        """Replace a cluster's ``ClusterData`` (404 if unknown)."""
        data = cluster_data(body)
        existing(cluster)
        clusters.put(cluster, data)
        return no_content()

    @router.delete(_CLUSTERS + "/{cluster}", status_code=204)
    async def delete_cluster(cluster: str) -> Response:
        """Delete a cluster no tenant or namespace uses (412 "Cluster not empty")."""
        existing(cluster)
        if cluster == clusters.local or clusters.users(cluster):
            raise RestError(412, "Cluster not empty")
        clusters.delete(cluster)
        return no_content()

    return router
