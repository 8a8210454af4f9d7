"""TLS towards a remote cluster, Pulsar's way (``BrokerService.getReplicationClient``).

The replicator speaks TLS to cluster ``c`` when ``c``'s ``ClusterData`` says
``brokerClientTlsEnabled`` (then with ``c``'s own ``tlsAllowInsecureConnection``,
``brokerClientTrustCertsFilePath`` and ``brokerClientCertificateFilePath`` /
``brokerClientKeyFilePath``), else when the broker's ``brokerClientTlsEnabled`` is set (then with
the broker's settings of the same names). It connects to ``brokerServiceUrlTls``
(``pulsar+ssl://``) and asks ``serviceUrlTls`` (``https://``) for the remote topic's shape;
the certificate is checked against the trust file (the system's CAs when none is given), the
host name only with ``tlsHostnameVerificationEnabled`` (off by default, as in Pulsar). With
``proxyServiceUrl`` and ``proxyProtocol`` ``SNI`` (PIP-60) every binary-protocol connection
goes to the proxy instead, the broker's host (``brokerServiceUrlTls``, or where a lookup
redirects) sent as the TLS SNI for the proxy to route by; the admin API is asked directly, as
Pulsar's cluster admin client does. A ``listenerName`` is asked for in each lookup (Pulsar's
``advertised_listener_name``), so the remote answers with that listener's URLs.

The client certificate presented in the handshake (the same for the binary protocol and the
admin API) is the authentication plugin's when it is ``AuthenticationTls`` (the cluster's
``authenticationPlugin`` or else the broker's ``brokerClientAuthenticationPlugin``, see :func:`remote_credentials`), else the certificate and key files above, else none: in
Pulsar too the plugin's TLS material wins over the file-based one. ``AuthenticationTls`` to a
cluster reached without TLS is refused by name rather than sent where it cannot prove anything.
"""

from __future__ import annotations

import functools
import os
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from keyshared.broker.client_credentials import (
    NO_CREDENTIALS,
    ClientCredentials,
    client_credentials,
)
from keyshared.broker.replication.client import RemoteError
from keyshared.config import BrokerConfig

DEFAULT_TLS_PORT = 6651
"""``pulsar+ssl://``'s port when a URL names none."""


@dataclass(frozen=True, slots=True)
class RemoteUrls:
    """Where the replicator connects to for one remote cluster, and how."""

    broker_url: str
    """``pulsar://`` or ``pulsar+ssl://``."""
    admin_url: str
    """``http://`` or ``https://`` (empty: not known, no remote topic creation)."""
    ssl: ssl.SSLContext | None
    """The TLS context, for both, when the cluster is reached over TLS."""
    proxy: tuple[str, int] | None = None
    """An SNI-routing proxy (``proxyServiceUrl`` with ``proxyProtocol`` SNI): the replicator's
    TCP connections go there, the broker's host name travels as the TLS SNI."""
    listener_name: str = ""
    """The cluster's ``listenerName``: the advertised listener its lookups are asked for."""


@dataclass(frozen=True, slots=True)
class _TlsSettings:
    trust: str
    insecure: bool
    cert: str
    key: str


@functools.lru_cache(maxsize=32)
def client_context(
    trust_file: str,
    allow_insecure: bool,
    verify_hostname: bool,
    cert_file: str = "",
    key_file: str = "",
    files_version: tuple[int, ...] = (),
) -> ssl.SSLContext:
    """A client TLS context trusting ``trust_file`` (or the system's CAs) and presenting
    ``cert_file`` with ``key_file`` when given. ``files_version`` (the files' modification
    times) is only part of the cache key: a certificate replaced on disk gets a new context."""
    del files_version
    ctx = ssl.create_default_context(cafile=trust_file or None)
    if allow_insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx.check_hostname = verify_hostname
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file or None)
    return ctx


def _settings(data: dict[str, Any], config: BrokerConfig) -> _TlsSettings | None:
    """The cluster's TLS settings when it enables TLS, else the broker's, else None."""
    if data.get("brokerClientTlsEnabled"):
        return _TlsSettings(
            str(data.get("brokerClientTrustCertsFilePath") or ""),
            bool(data.get("tlsAllowInsecureConnection")),
            str(data.get("brokerClientCertificateFilePath") or ""),
            str(data.get("brokerClientKeyFilePath") or ""),
        )
    if config.brokerClientTlsEnabled:
        return _TlsSettings(
            config.brokerClientTrustCertsFilePath,
            config.tlsAllowInsecureConnection,
            config.brokerClientCertificateFilePath,
            config.brokerClientKeyFilePath,
        )
    return None


def remote_credentials(name: str, data: dict[str, Any], config: BrokerConfig) -> ClientCredentials:
    """What the replicator presents to cluster ``name``: the cluster's ``authenticationPlugin``
    with its ``authenticationParameters``, else the broker's ``brokerClientAuthentication*``
    (raises :class:`~keyshared.broker.client_credentials.CredentialsError` naming a setting it
    cannot use)."""
    plugin = str(data.get("authenticationPlugin") or "")
    if plugin:
        return client_credentials(
            plugin,
            str(data.get("authenticationParameters") or ""),
            plugin_key=f"cluster {name} authenticationPlugin",
            params_key=f"cluster {name} authenticationParameters",
        )
    return client_credentials(
        config.brokerClientAuthenticationPlugin,
        config.brokerClientAuthenticationParameters,
        plugin_key="brokerClientAuthenticationPlugin",
        params_key="brokerClientAuthenticationParameters",
    )


def remote_urls(
    name: str,
    data: dict[str, Any],
    config: BrokerConfig,
    credentials: ClientCredentials = NO_CREDENTIALS,
) -> RemoteUrls:
    """The URLs and TLS context for cluster ``name`` with ``ClusterData`` ``data``, presenting
    ``credentials`` there (see the module docstring)."""
    settings = _settings(data, config)
    if settings is None:
        if data.get("proxyProtocol") == "SNI" and data.get("proxyServiceUrl"):
            # Pulsar's client then warns and connects around the proxy; a broker behind an
            # SNI proxy is seldom reachable that way, so say why instead.
            raise RemoteError(
                f"cluster {name}: proxyProtocol SNI needs TLS towards it (brokerClientTlsEnabled)"
            )
        if credentials.method == "tls":
            raise RemoteError(
                f"cluster {name}: AuthenticationTls needs TLS towards it "
                "(brokerClientTlsEnabled and brokerServiceUrlTls)"
            )
        url = str(data.get("brokerServiceUrl") or "")
        if not url:
            raise RemoteError(f"cluster {name} has no brokerServiceUrl")
        listener = str(data.get("listenerName") or "")
        return RemoteUrls(url, str(data.get("serviceUrl") or ""), None, None, listener)
    url = str(data.get("brokerServiceUrlTls") or "")
    if not url:
        raise RemoteError(f"cluster {name} has no brokerServiceUrlTls (TLS is enabled)")
    proxy = _sni_proxy(data)
    cert, key = settings.cert, settings.key
    if credentials.method == "tls":
        cert, key = credentials.cert_file, credentials.key_file
    elif bool(cert) != bool(key):
        missing = "brokerClientKeyFilePath" if cert else "brokerClientCertificateFilePath"
        raise RemoteError(f"cluster {name}: {missing} is not set (both or neither)")
    try:
        version = tuple(os.stat(f).st_mtime_ns for f in (settings.trust, cert, key) if f)
        ctx = client_context(
            settings.trust,
            settings.insecure,
            config.tlsHostnameVerificationEnabled,
            cert,
            key,
            version,
        )
    except (OSError, ssl.SSLError) as exc:
        files = ", ".join(repr(f) for f in (settings.trust, cert, key) if f)
        raise RemoteError(f"cluster {name}: TLS files {files}: {exc}") from exc
    listener = str(data.get("listenerName") or "")
    return RemoteUrls(url, str(data.get("serviceUrlTls") or ""), ctx, proxy, listener)


def _sni_proxy(data: dict[str, Any]) -> tuple[str, int] | None:
    """The SNI proxy's address, when the cluster names one (the admin API checked the
    combination; the binary protocol's port is the default one)."""
    url = str(data.get("proxyServiceUrl") or "")
    if data.get("proxyProtocol") != "SNI" or not url:
        return None
    parsed = urlparse(url)
    if not parsed.hostname:
        raise RemoteError(f"proxyServiceUrl {url!r} has no host")
    return parsed.hostname, parsed.port or DEFAULT_TLS_PORT
