"""Clusters: Pulsar's ``ClusterData`` records, this broker's own cluster among them.

Stored in the metadata store under ``clusters/<name>`` as the ``ClusterData`` JSON Pulsar's admin
API takes and returns (``serviceUrl``, ``brokerServiceUrl``, ``authenticationPlugin``, ...), so
geo-replication can read a remote cluster's URLs and the client authentication to use from here.
The standalone's own cluster (``clusterName``) is created at start-up and its URLs refreshed from
the listeners in force, as Pulsar's standalone does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from keyshared.storage.metadata import MetadataStore

if TYPE_CHECKING:
    from keyshared.config import BrokerConfig

CLUSTERS_PREFIX = "clusters/"
TENANTS_PREFIX = "tenants/"
NAMESPACES_PREFIX = "namespaces/"

CLUSTER_DATA_FIELDS: frozenset[str] = frozenset(
    {
        "serviceUrl",
        "serviceUrlTls",
        "brokerServiceUrl",
        "brokerServiceUrlTls",
        "proxyServiceUrl",
        "proxyProtocol",
        "peerClusterNames",
        "authenticationPlugin",
        "authenticationParameters",
        "brokerClientTlsEnabled",
        "tlsAllowInsecureConnection",
        "brokerClientTlsEnabledWithKeyStore",
        "brokerClientTlsTrustStoreType",
        "brokerClientTlsTrustStore",
        "brokerClientTlsTrustStorePassword",
        "brokerClientTlsKeyStoreType",
        "brokerClientTlsKeyStore",
        "brokerClientTlsKeyStorePassword",
        "brokerClientTrustCertsFilePath",
        "brokerClientSslFactoryPlugin",
        "brokerClientSslFactoryPluginParams",
        "brokerClientKeyFilePath",
        "brokerClientCertificateFilePath",
        "listenerName",
    }
)
"""The fields of Pulsar's ``ClusterData`` this broker stores and returns."""


def local_cluster_urls(
    host: str, broker_port: int, broker_tls_port: int, web_port: int, web_tls_port: int
) -> dict[str, str]:
    """The URLs of this broker's own cluster, from its listeners (TLS ones when enabled)."""
    urls = {
        "serviceUrl": f"http://{host}:{web_port}",
        "brokerServiceUrl": f"pulsar://{host}:{broker_port}",
    }
    if web_tls_port:
        urls["serviceUrlTls"] = f"https://{host}:{web_tls_port}"
    if broker_tls_port:
        urls["brokerServiceUrlTls"] = f"pulsar+ssl://{host}:{broker_tls_port}"
    return urls


class ClusterRegistry:
    """Reads and writes ``ClusterData`` records; knows which clusters are in use."""

    def __init__(self, metadata: MetadataStore, config: BrokerConfig) -> None:
        self.metadata = metadata
        self.local = config.clusterName
        self.host = config.advertisedAddress
        self.set_local_ports(
            config.brokerServicePort,
            config.brokerServicePortTls,
            config.webServicePort,
            config.webServicePortTls,
        )

    def set_local_ports(
        self, broker_port: int, broker_tls_port: int, web_port: int, web_tls_port: int
    ) -> None:
        """Create this broker's own cluster, or refresh its URLs to the listeners in force (the
        ports bound, which differ from the configured ones when those are 0)."""
        record = self.get(self.local) or {}
        for key in ("serviceUrlTls", "brokerServiceUrlTls"):
            record.pop(key, None)
        record.update(
            local_cluster_urls(self.host, broker_port, broker_tls_port, web_port, web_tls_port)
        )
        self.metadata.put_json(CLUSTERS_PREFIX + self.local, record)

    def names(self) -> list[str]:
        """Every known cluster's name, sorted."""
        return sorted(k[len(CLUSTERS_PREFIX) :] for k in self.metadata.list_keys(CLUSTERS_PREFIX))

    def exists(self, name: str) -> bool:
        """True if cluster ``name`` is known."""
        return self.metadata.get(CLUSTERS_PREFIX + name) is not None

    def get(self, name: str) -> dict[str, Any] | None:
        """Cluster ``name``'s ``ClusterData``, or None if it is not known."""
        value = self.metadata.get_json(CLUSTERS_PREFIX + name)
        return dict(value) if isinstance(value, dict) else None

    def put(self, name: str, data: dict[str, Any]) -> None:
        """Store (create or replace) cluster ``name``'s ``ClusterData``."""
        self.metadata.put_json(CLUSTERS_PREFIX + name, data)

    def delete(self, name: str) -> None:
        """Forget cluster ``name``."""
        self.metadata.delete(CLUSTERS_PREFIX + name)

    def users(self, name: str) -> list[str]:
        """Tenants allowing cluster ``name`` and namespaces replicating to it (as
        ``tenant`` and ``tenant/namespace``): a cluster in use cannot be deleted."""
        found: list[str] = []
        for key, raw in self.metadata.items(TENANTS_PREFIX):
            info = _json_dict(raw)
            if name in (info.get("allowedClusters") or []):
                found.append(key[len(TENANTS_PREFIX) :])
        for key, raw in self.metadata.items(NAMESPACES_PREFIX):
            policies = _json_dict(raw)
            if name in (policies.get("replication_clusters") or []):
                found.append(key[len(NAMESPACES_PREFIX) :])
        return found


def _json_dict(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
