"""Several authentication providers at once, as Pulsar's ``AuthenticationService`` chains them.

``authenticationProviders`` names the providers (token, basic, TLS); the client's
``auth_method_name`` picks the one that checks its CONNECT. As in Pulsar's ``ServerCnx``, a client
naming no provider this broker has (``none``, or a method nobody serves) gets
``anonymousUserRole`` when one is set, and is refused otherwise. Over HTTP the ``Authorization``
header's scheme picks the provider (``Bearer`` a token, ``Basic`` a password); a request with no
credentials gets the anonymous role when one is set. Credentials that are present and wrong are
refused, never downgraded to anonymous.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.server.auth_basic import BASIC_METHOD, BasicAuthenticator

if TYPE_CHECKING:
    from keyshared.server.auth_token import TokenAuthenticator

TLS_METHOD = "tls"
TOKEN_METHOD = "token"


def certificate_common_name(peercert: Any) -> str | None:
    """The subject CN of a certificate as ``ssl.SSLSocket.getpeercert()`` gives it."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    return None


@dataclass
class AuthenticationService:
    """The configured providers, looked up by authentication method name."""

    token: TokenAuthenticator | None = None
    basic: BasicAuthenticator | None = None
    tls: bool = False
    anonymous_role: str = ""
    methods: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.methods = [
            m
            for m, on in (
                (TOKEN_METHOD, self.token is not None),
                (BASIC_METHOD, self.basic is not None),
                (TLS_METHOD, self.tls),
            )
            if on
        ]

    # --- binary protocol -------------------------------------------------------------------
    def authenticate(self, method: str, data: bytes) -> str:
        """The role proved by CONNECT credentials (no peer certificate)."""
        return self.authenticate_session(method, data)[0]

    def authenticate_session(
        self, method: str, data: bytes, peercert: Any = None
    ) -> tuple[str, float | None]:
        """The role and when its credentials expire (a token's ``exp``; None otherwise)."""
        if method == TOKEN_METHOD and self.token is not None:
            return self.token.authenticate_session(method, data)
        if method == BASIC_METHOD and self.basic is not None:
            return self.basic.authenticate_credentials(data), None
        if method == TLS_METHOD and self.tls:
            role = certificate_common_name(peercert)
            if role is None:
                raise BrokerError(
                    ServerError.AuthenticationError,
                    "Failed to authenticate: no trusted client certificate with a common name",
                )
            return role, None
        if self.anonymous_role:
            return self.anonymous_role, None
        raise BrokerError(
            ServerError.AuthenticationError,
            f"Unsupported authentication method: {method or 'none'} "
            "(No anonymous role, and no authentication provider configured)",
        )

    # --- HTTP --------------------------------------------------------------------------------
    def authenticate_http(
        self, authorization: str | None, client_cert_cn: str | None = None
    ) -> str:
        """The role proved by an ``Authorization`` header (Bearer or Basic), else by the
        verified client certificate of an HTTPS request (its CN, when the TLS provider is on)."""
        if authorization and authorization.strip():
            scheme = authorization.strip().partition(" ")[0].lower()
            if scheme == "bearer" and self.token is not None:
                return self.token.authenticate_http(authorization)
            if scheme == "basic" and self.basic is not None:
                return self.basic.authenticate_header(authorization)
            raise BrokerError(
                ServerError.AuthenticationError,
                f"Authentication required: no provider for {scheme or 'empty'} credentials",
            )
        if self.tls and client_cert_cn:
            return client_cert_cn
        if self.anonymous_role:
            return self.anonymous_role
        raise BrokerError(ServerError.AuthenticationError, "Authentication required")
