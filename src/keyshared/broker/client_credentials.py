"""Client credentials from a Pulsar authentication plugin name and its parameters string.

The broker presents such credentials as a client in two places: its own client
(``brokerClientAuthenticationPlugin`` / ``...Parameters``, see ``server/broker_client_auth.py``)
and the geo-replicator, which uses a remote cluster's ``authenticationPlugin`` /
``authenticationParameters`` from its ``ClusterData`` (falling back to the broker's own).

Plugins understood, by Pulsar's class names (the short names ``token``, ``basic``, ``tls`` too):
``AuthenticationToken`` (``token:<jwt>``, ``file:///path``, ``data:`` URL, or JSON
``{"token": ...}``), ``AuthenticationBasic`` (JSON ``{"userId": ..., "password": ...}``) and
``AuthenticationTls`` (``tlsCertFile:<path>,tlsKeyFile:<path>``, or JSON; the role is the
certificate's CN, and the certificate is what the client presents in the TLS handshake, which
is why its paths travel with the credentials). Any other plugin is refused by name.
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
    cert_file: str = ""
    """``tls``: the client certificate (PEM) to present in the TLS handshake."""
    key_file: str = ""
    """``tls``: its private key (PEM)."""

    @property
    def command_data(self) -> bytes | None:
        """What goes in CONNECT's ``auth_data``: nothing for ``none`` and for ``tls`` (the
        certificate is the proof, as Pulsar's ``AuthenticationDataTls`` has no command data)."""
        return None if self.method in ("none", "tls") else self.data


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
        cert, key = _tls_paths(params)
        return ClientCredentials("tls", _certificate_cn(cert).encode(), cert, key)
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


def _tls_paths(params: str) -> tuple[str, str]:
    """``tlsCertFile`` and ``tlsKeyFile`` from ``key:value,...`` or JSON (Pulsar's forms)."""
    if params.startswith("{"):
        fields = {str(k): str(v) for k, v in json.loads(params).items()}
    else:
        fields = {}
        for item in params.split(","):
            key, _, value = item.partition(":")
            fields[key.strip()] = value.strip()
    for name in ("tlsCertFile", "tlsKeyFile"):
        if not fields.get(name):
            raise ValueError(f"no {name}")
    return fields["tlsCertFile"], fields["tlsKeyFile"]


def _certificate_cn(path: str) -> str:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not names:
        raise ValueError(f"{path} has no common name")
    return str(names[0].value)
