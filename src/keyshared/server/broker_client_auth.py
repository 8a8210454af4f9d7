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

from keyshared.broker.client_credentials import (
    ClientCredentials,
    CredentialsError,
    client_credentials,
)
from keyshared.broker.errors import BrokerError
from keyshared.config import BrokerConfig, ConfigError
from keyshared.server.auth_service import AuthenticationService


def broker_client_credentials(cfg: BrokerConfig) -> ClientCredentials:
    """The configured credentials; a ConfigError names a plugin or parameters it cannot use."""
    try:
        return client_credentials(
            cfg.brokerClientAuthenticationPlugin,
            cfg.brokerClientAuthenticationParameters,
            plugin_key="brokerClientAuthenticationPlugin",
            params_key="brokerClientAuthenticationParameters",
        )
    except CredentialsError as exc:
        raise ConfigError(str(exc)) from exc


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
