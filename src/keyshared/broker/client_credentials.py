"""Client credentials from a Pulsar authentication plugin name and its parameters string.

The broker presents such credentials as a client in two places: its own client
(``brokerClientAuthenticationPlugin`` / ``...Parameters``, see ``server/broker_client_auth.py``)
and the geo-replicator, which uses a remote cluster's ``authenticationPlugin`` /
``authenticationParameters`` from its ``ClusterData`` (falling back to the broker's own).

Plugins understood, by Pulsar's class names (the short names ``token``, ``basic``, ``tls`` too):
``AuthenticationToken`` (``token:<jwt>``, ``file:///path``, ``data:`` URL, or JSON
``{"token": ...}``), ``AuthenticationBasic`` (JSON ``{"userId": ..., "password": ...}``) and
``AuthenticationTls`` (``tlsCertFile:<path>,tlsKeyFile:<path>``, or JSON; the role is the
certificate's CN). Any other plugin is refused by name.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

PLUGINS = {
    "org.apache.pulsar.client.impl.auth.AuthenticationToken": "token",
    "org.apache.pulsar.client.impl.auth.AuthenticationBasic": "basic",
    "org.apache.pulsar.client.impl.auth.AuthenticationTls": "tls",
    "token": "token",
    "basic": "basic",
    "tls": "tls",
}
"""Plugin names understood, to the method they authenticate with."""


class CredentialsError(ValueError):
    """A plugin that is not supported, or parameters it cannot use (the message names them)."""


@dataclass(frozen=True, slots=True)
class ClientCredentials:
    """What a client presents: a method name and its credential bytes."""

    method: str
    """``none``, ``token``, ``basic`` or ``tls``."""
    data: bytes
    """The token, ``user:password``, or the certificate's CN for ``tls``."""


NO_CREDENTIALS = ClientCredentials("none", b"")


def client_credentials(
    plugin: str, params: str, *, plugin_key: str, params_key: str
) -> ClientCredentials:
    """The credentials ``plugin`` with ``params`` stands for; a :class:`CredentialsError` names
    the setting (``plugin_key`` / ``params_key``) it cannot use."""
    plugin = plugin.strip()
    params = params.strip()
    if not plugin:
        return NO_CREDENTIALS
    kind = PLUGINS.get(plugin)
    if kind is None:
        raise CredentialsError(
            f"{plugin_key}={plugin} is not supported; use one of "
            + ", ".join(p for p in PLUGINS if "." in p)
        )
    try:
        if kind == "token":
            return ClientCredentials("token", _token(params).encode())
        if kind == "basic":
            fields = json.loads(params)
            user, password = str(fields["userId"]), str(fields["password"])
            return ClientCredentials("basic", f"{user}:{password}".encode())
        return ClientCredentials("tls", _certificate_cn(_tls_cert_path(params)).encode())
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise CredentialsError(f"{params_key} cannot be used with {plugin}: {exc}") from exc


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
