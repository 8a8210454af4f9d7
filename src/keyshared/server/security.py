"""Authentication, authorization and TLS set-up from the broker configuration."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from keyshared.config import BrokerConfig, ConfigError
from keyshared.server.authz import NamespaceAuthorizer, parse_roles
from keyshared.server.tls import TlsConfigError, server_ssl_context

if TYPE_CHECKING:
    from keyshared.server.auth_token import TokenAuthenticator
    from keyshared.server.authz import PermissionStore

TOKEN_PROVIDER = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
_TOKEN_PROVIDER_NAMES = {TOKEN_PROVIDER, "AuthenticationProviderToken", "token"}


def build_security(
    cfg: BrokerConfig, permissions: PermissionStore | None = None
) -> tuple[
    TokenAuthenticator | None,
    NamespaceAuthorizer | None,
    ssl.SSLContext | None,
    ssl.SSLContext | None,
]:
    """(authenticator, authorizer, broker TLS context, web TLS context) for ``cfg``.

    ``permissions`` (the broker service) is where the authorizer reads namespace grants and tenant
    admins; it is needed when ``authorizationEnabled``. Anything asked for that cannot be served
    exactly is a ConfigError: the broker refuses to start rather than serve in the clear or open.
    """
    authenticator = build_authenticator(cfg) if cfg.authenticationEnabled else None
    authorizer = None
    if cfg.authorizationEnabled:
        if authenticator is None:
            raise ConfigError("authorizationEnabled needs authenticationEnabled=true")
        if permissions is None:
            raise ConfigError("authorizationEnabled needs the broker service's permission store")
        authorizer = NamespaceAuthorizer(permissions, parse_roles(cfg.superUserRoles))
    tls_ctx = None
    if cfg.brokerServicePortTls or cfg.webServicePortTls:
        try:
            tls_ctx = server_ssl_context(
                cfg.tlsCertificateFilePath,
                cfg.tlsKeyFilePath,
                cfg.tlsTrustCertsFilePath,
                require_client_cert=cfg.tlsRequireTrustedClientCertOnConnect,
            )
        except TlsConfigError as exc:
            raise ConfigError(str(exc)) from exc
    return (
        authenticator,
        authorizer,
        tls_ctx if cfg.brokerServicePortTls else None,
        tls_ctx if cfg.webServicePortTls else None,
    )


def build_authenticator(cfg: BrokerConfig) -> TokenAuthenticator:
    """The token provider from ``tokenSecretKey`` or ``tokenPublicKey`` and the claim settings."""
    # PyJWT and cryptography cost a good part of the start-up budget: only load them when used.
    from keyshared.server.auth_token import (
        KeyFormatError,
        TokenAuthenticator,
        load_public_key,
        read_key,
    )

    providers = [p.strip() for p in cfg.authenticationProviders.split(",") if p.strip()]
    unsupported = [p for p in providers if p not in _TOKEN_PROVIDER_NAMES]
    if unsupported:
        raise ConfigError(
            f"unsupported authenticationProviders {', '.join(unsupported)}; "
            f"this broker has only {TOKEN_PROVIDER}"
        )
    if bool(cfg.tokenSecretKey) == bool(cfg.tokenPublicKey):
        raise ConfigError(
            "token authentication needs exactly one of tokenSecretKey, tokenPublicKey"
        )
    try:
        if cfg.tokenSecretKey:
            return TokenAuthenticator(
                secret_key=read_key(cfg.tokenSecretKey),
                auth_claim=cfg.tokenAuthClaim,
                audience_claim=cfg.tokenAudienceClaim,
                audience=cfg.tokenAudience,
                leeway=cfg.tokenAllowedClockSkewSeconds,
            )
        return TokenAuthenticator(
            public_key=load_public_key(read_key(cfg.tokenPublicKey)),
            public_alg=cfg.tokenPublicAlg,
            auth_claim=cfg.tokenAuthClaim,
            audience_claim=cfg.tokenAudienceClaim,
            audience=cfg.tokenAudience,
            leeway=cfg.tokenAllowedClockSkewSeconds,
        )
    except KeyFormatError as exc:
        which = "tokenSecretKey" if cfg.tokenSecretKey else "tokenPublicKey"
        raise ConfigError(f"{which}: {exc}") from exc
