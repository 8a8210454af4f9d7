"""Authentication, authorization and TLS set-up from the broker configuration."""

from __future__ import annotations

import ssl
from typing import Any

from keyshared.config import BrokerConfig, ConfigError


def build_security(
    cfg: BrokerConfig,
) -> tuple[Any, Any, ssl.SSLContext | None, ssl.SSLContext | None]:
    """(authenticator, authorizer, broker TLS context, web TLS context) for ``cfg``.

    Authentication, authorization and TLS are the operator-surface issue's work; until then a
    configuration that asks for them is refused rather than silently served in the clear.
    """
    if cfg.authenticationEnabled or cfg.authorizationEnabled:
        raise ConfigError("authenticationEnabled/authorizationEnabled are not supported yet")
    if cfg.brokerServicePortTls or cfg.webServicePortTls:
        raise ConfigError("TLS ports are not supported yet")
    return None, None, None, None
