"""Authentication, authorization and TLS set-up from the broker configuration."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING

from keyshared.config import BrokerConfig, ConfigError
from keyshared.server.authz import NamespaceAuthorizer, parse_roles
from keyshared.server.tls import TlsConfigError, server_ssl_context

if TYPE_CHECKING:
    from keyshared.server.auth_service import AuthenticationService
    from keyshared.server.auth_token import TokenAuthenticator
    from keyshared.server.authz import PermissionStore

_PROVIDER_PACKAGE = "org.apache.pulsar.broker.authentication."
TOKEN_PROVIDER = _PROVIDER_PACKAGE + "AuthenticationProviderToken"
BASIC_PROVIDER = _PROVIDER_PACKAGE + "AuthenticationProviderBasic"
TLS_PROVIDER = _PROVIDER_PACKAGE + "AuthenticationProviderTls"
# Provider class names (full or short) and the authentication method each serves.
_PROVIDERS = {
    **{n: "token" for n in (TOKEN_PROVIDER, "AuthenticationProviderToken", "token")},
    **{n: "basic" for n in (BASIC_PROVIDER, "AuthenticationProviderBasic", "basic")},
    **{n: "tls" for n in (TLS_PROVIDER, "AuthenticationProviderTls", "tls")},
}


def build_security(
    cfg: BrokerConfig, permissions: PermissionStore | None = None
) -> tuple[
    AuthenticationService | None,
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
    if cfg.tlsAllowInsecureConnection:
        raise ConfigError(
            "tlsAllowInsecureConnection=true is not supported: client certificates must chain "
            "to tlsTrustCertsFilePath"
        )
    if cfg.brokerServicePortTls or cfg.webServicePortTls:
        try:
            tls_ctx = server_ssl_context(
                cfg.tlsCertificateFilePath,
                cfg.tlsKeyFilePath,
                cfg.tlsTrustCertsFilePath,
                require_client_cert=cfg.tlsRequireTrustedClientCertOnConnect,
                protocols=cfg.tlsProtocols,
                ciphers=cfg.tlsCiphers,
            )
        except TlsConfigError as exc:
            raise ConfigError(str(exc)) from exc
    elif cfg.tlsProtocols or cfg.tlsCiphers:
        raise ConfigError("tlsProtocols/tlsCiphers need brokerServicePortTls or webServicePortTls")
    if authenticator is not None and authenticator.tls and tls_ctx is None:
        raise ConfigError(f"{TLS_PROVIDER} needs a TLS port (brokerServicePortTls)")
    if authenticator is not None and authenticator.tls and not cfg.tlsTrustCertsFilePath:
        raise ConfigError(
            f"{TLS_PROVIDER} needs tlsTrustCertsFilePath to verify client certificates"
        )
    return (
        authenticator,
        authorizer,
        tls_ctx if cfg.brokerServicePortTls else None,
        tls_ctx if cfg.webServicePortTls else None,
    )


def build_authenticator(cfg: BrokerConfig) -> AuthenticationService:
    """The providers named by ``authenticationProviders``, chained, with ``anonymousUserRole``."""
    from keyshared.server.auth_basic import BasicAuthenticator, BasicConfigError
    from keyshared.server.auth_service import AuthenticationService

    providers = [p.strip() for p in cfg.authenticationProviders.split(",") if p.strip()]
    unsupported = [p for p in providers if p not in _PROVIDERS]
    if unsupported:
        raise ConfigError(
            f"unsupported authenticationProviders {', '.join(unsupported)}; this broker has "
            f"{TOKEN_PROVIDER}, {BASIC_PROVIDER} and {TLS_PROVIDER}"
        )
    # No provider named: the token provider, as this broker has always read such a configuration.
    methods = {_PROVIDERS[p] for p in providers} if providers else {"token"}
    basic = None
    if "basic" in methods:
        try:
            basic = BasicAuthenticator.from_conf(cfg.basicAuthConf)
        except BasicConfigError as exc:
            raise ConfigError(str(exc)) from exc
    return AuthenticationService(
        token=build_token_authenticator(cfg) if "token" in methods else None,
        basic=basic,
        tls="tls" in methods,
        anonymous_role=cfg.anonymousUserRole,
    )


def build_token_authenticator(cfg: BrokerConfig) -> TokenAuthenticator:
    """The token provider from ``tokenSecretKey`` or ``tokenPublicKey`` and the claim settings."""
    # PyJWT and cryptography cost a good part of the start-up budget: only load them when used.
    from keyshared.server.auth_token import (
        KeyFormatError,
        TokenAuthenticator,
        load_public_key,
        read_key,
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
