"""The broker's own client credentials: ``brokerClientAuthenticationPlugin`` / ``...Parameters``.

Pulsar's broker talks to itself and to other clusters through a client configured by these two
keys. The standalone uses that client to create the ``public`` tenant and ``public/default`` at
its first start, so with authentication on and no credentials (or credentials that are not a
super user's) Pulsar's standalone logs the failure and starts without them; scripts written for
Pulsar (Apache's client CI, for one) then create them with ``PUT``s that would answer 409 if
they were there, leaving the scripts' admin roles and grants unset. keyshared decides the same way, by authenticating the configured
credentials with its own providers.

Plugins understood, by Pulsar's class names (the short names ``token``, ``basic``, ``tls`` too):
``AuthenticationToken`` (``token:<jwt>``, ``file:///path``, or JSON ``{"token": ...}``),
``AuthenticationBasic`` (JSON ``{"userId": ..., "password": ...}``) and ``AuthenticationTls``
(``tlsCertFile:<path>,tlsKeyFile:<path>``, or JSON; the role is the certificate's CN). Any
other plugin is refused at start-up by name.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from keyshared.broker.errors import BrokerError
from keyshared.config import BrokerConfig, ConfigError
from keyshared.server.auth_service import AuthenticationService

_PLUGINS = {
    "org.apache.pulsar.client.impl.auth.AuthenticationToken": "token",
    "org.apache.pulsar.client.impl.auth.AuthenticationBasic": "basic",
    "org.apache.pulsar.client.impl.auth.AuthenticationTls": "tls",
    "token": "token",
    "basic": "basic",
    "tls": "tls",
}


@dataclass(frozen=True, slots=True)
class BrokerClientCredentials:
    """What the broker's own client presents: a method name and its credential bytes."""

    method: str
    """``none``, ``token``, ``basic`` or ``tls``."""
    data: bytes
    """The token, ``user:password``, or the certificate's CN for ``tls``."""


def broker_client_credentials(cfg: BrokerConfig) -> BrokerClientCredentials:
    """The configured credentials; a ConfigError names a plugin or parameters it cannot use."""
    plugin = cfg.brokerClientAuthenticationPlugin.strip()
    params = cfg.brokerClientAuthenticationParameters.strip()
    if not plugin:
        return BrokerClientCredentials("none", b"")
    kind = _PLUGINS.get(plugin)
    if kind is None:
        raise ConfigError(
            f"brokerClientAuthenticationPlugin={plugin} is not supported; use one of "
            + ", ".join(p for p in _PLUGINS if "." in p)
        )
    try:
        if kind == "token":
            return BrokerClientCredentials("token", _token(params).encode())
        if kind == "basic":
            fields = json.loads(params)
            user, password = str(fields["userId"]), str(fields["password"])
            return BrokerClientCredentials("basic", f"{user}:{password}".encode())
        return BrokerClientCredentials("tls", _certificate_cn(_tls_cert_path(params)).encode())
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise ConfigError(
            f"brokerClientAuthenticationParameters cannot be used with {plugin}: {exc}"
        ) from exc


def _token(params: str) -> str:
    if params.startswith("{"):
        return str(json.loads(params)["token"])
    if params.startswith("token:"):
        return params.removeprefix("token:").strip()
    if params.startswith("file:"):
        return Path(urlparse(params).path).read_text().strip()
    if params.startswith("data:"):
        _, _, payload = params.partition(",")
        return base64.b64decode(payload).decode().strip() if ";base64" in params else payload
    if not params:
        raise ValueError("no token")
    return params


def _tls_cert_path(params: str) -> str:
    if params.startswith("{"):
        return str(json.loads(params)["tlsCertFile"])
    for item in params.split(","):
        key, _, value = item.partition(":")
        if key.strip() == "tlsCertFile":
            return value.strip()
    raise ValueError("no tlsCertFile")


def _certificate_cn(path: str) -> str:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError(f"{path} has no common name")
    return str(names[0].value)


def broker_client_role(
    cfg: BrokerConfig, authenticator: AuthenticationService | None
) -> tuple[str | None, str]:
    """The role the broker's own client gets (None when refused), and why it was refused."""
    credentials = broker_client_credentials(cfg)
    if authenticator is None:
        return "", ""
    if credentials.method == "tls":
        if not authenticator.tls:
            return None, "AuthenticationProviderTls is not configured"
        return credentials.data.decode(), ""
    try:
        return authenticator.authenticate(credentials.method, credentials.data), ""
    except BrokerError as exc:
        return None, exc.message


def may_create_default_namespace(
    cfg: BrokerConfig, authenticator: AuthenticationService | None, super_users: set[str]
) -> tuple[bool, str]:
    """Whether the standalone's own client may create ``public/default``, and why not."""
    role, why = broker_client_role(cfg, authenticator)
    if role is None:
        return False, f"HTTP 401 Unauthorized: {why}"
    if cfg.authorizationEnabled and role not in super_users:
        return False, f"HTTP 401 Unauthorized: {role or 'the anonymous client'} is not a super user"
    return True, ""
