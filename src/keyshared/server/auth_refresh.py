"""Expiring credentials on a live connection: Pulsar's refreshAuthenticationCredentials.

Every ``authenticationRefreshCheckSeconds`` the connection looks at when its credentials (a
token's ``exp``) run out. Once they have, a client that announced ``supports_auth_refresh`` is
sent AUTH_CHALLENGE and must answer with fresh credentials (AUTH_RESPONSE) before the next
check; one that did not announce it, or did not answer in time, is disconnected, as Pulsar
does. Without this, a connection opened with a token would outlive the token forever.
"""

from __future__ import annotations

from collections.abc import Callable

REFRESH_AUTH_DATA = b"PulsarAuthRefresh"
"""What Pulsar's AUTH_CHALLENGE carries when it asks for a refresh."""


class AuthRefresh:
    """The refresh state of one connection; the connection calls :meth:`check` periodically."""

    __slots__ = ("_challenge", "_close", "expires_at", "pending", "supports_refresh")

    def __init__(
        self,
        *,
        supports_refresh: bool,
        challenge: Callable[[], None],
        close: Callable[[str], None],
    ) -> None:
        self.supports_refresh = supports_refresh
        self._challenge = challenge
        self._close = close
        self.expires_at: float | None = None
        self.pending = False

    def authenticated(self, expires_at: float | None) -> None:
        """Credentials were (re)proved; they run out at ``expires_at`` (epoch seconds)."""
        self.expires_at = expires_at
        self.pending = False

    def check(self, now: float) -> None:
        """Ask for fresh credentials once they expired; close if that cannot work."""
        if self.expires_at is None or now < self.expires_at:
            return
        if not self.supports_refresh:
            self._close("credentials expired and the client cannot refresh them")
        elif self.pending:
            self._close("credentials expired and were not refreshed in time")
        else:
            self.pending = True
            self._challenge()
