"""TLS towards a remote cluster, Pulsar's way (``BrokerService.getReplicationClient``).

The replicator speaks TLS to cluster ``c`` when ``c``'s ``ClusterData`` says
``brokerClientTlsEnabled`` (then with ``c``'s own ``tlsAllowInsecureConnection`` and
``brokerClientTrustCertsFilePath``), else when the broker's ``brokerClientTlsEnabled`` is set
(then with the broker's settings of the same names). It connects to ``brokerServiceUrlTls``
(``pulsar+ssl://``) and asks ``serviceUrlTls`` (``https://``) for the remote topic's shape;
the certificate is checked against the trust file (the system's CAs when none is given), the
host name only with ``tlsHostnameVerificationEnabled`` (off by default, as in Pulsar).
"""

from __future__ import annotations

import functools
import ssl
from dataclasses import dataclass
from typing import Any

from keyshared.broker.replication.client import RemoteError
from keyshared.config import BrokerConfig


@dataclass(frozen=True, slots=True)
class RemoteUrls:
    """Where the replicator connects to for one remote cluster, and how."""

    broker_url: str
    """``pulsar://`` or ``pulsar+ssl://``."""
    admin_url: str
    """``http://`` or ``https://`` (empty: not known, no remote topic creation)."""
    ssl: ssl.SSLContext | None
    """The TLS context, for both, when the cluster is reached over TLS."""


@functools.lru_cache(maxsize=32)
def client_context(trust_file: str, allow_insecure: bool, verify_hostname: bool) -> ssl.SSLContext:
    """A client TLS context trusting ``trust_file`` (or the system's CAs)."""
    ctx = ssl.create_default_context(cafile=trust_file or None)
    if allow_insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.check_hostname = verify_hostname
    return ctx


def remote_urls(name: str, data: dict[str, Any], config: BrokerConfig) -> RemoteUrls:
    """The URLs and TLS context for cluster ``name`` with ``ClusterData`` ``data``."""
    if data.get("brokerClientTlsEnabled"):
        trust = str(data.get("brokerClientTrustCertsFilePath") or "")
        insecure = bool(data.get("tlsAllowInsecureConnection"))
    elif config.brokerClientTlsEnabled:
        trust = config.brokerClientTrustCertsFilePath
        insecure = config.tlsAllowInsecureConnection
    else:
        url = str(data.get("brokerServiceUrl") or "")
        if not url:
            raise RemoteError(f"cluster {name} has no brokerServiceUrl")
        return RemoteUrls(url, str(data.get("serviceUrl") or ""), None)
    url = str(data.get("brokerServiceUrlTls") or "")
    if not url:
        raise RemoteError(f"cluster {name} has no brokerServiceUrlTls (TLS is enabled)")
    try:
        ctx = client_context(trust, insecure, config.tlsHostnameVerificationEnabled)
    except (OSError, ssl.SSLError) as exc:
        raise RemoteError(f"cluster {name}: trust certificates {trust!r}: {exc}") from exc
    return RemoteUrls(url, str(data.get("serviceUrlTls") or ""), ctx)
