"""The binary-protocol listeners (plain and TLS) and what connections share."""

from __future__ import annotations

import asyncio
import itertools
import ssl
from typing import Any, Protocol

from keyshared import __version__
from keyshared.broker.service import BrokerService
from keyshared.config import BrokerConfig
from keyshared.server.connection import ServerConnection
from keyshared.server.connection_limits import ConnectionLimits, ConnectionStats
from keyshared.server.listeners import listener_for, parse_listeners
from keyshared.server.publish_buffer import PublishThrottle


class Authenticator(Protocol):
    """Turns CONNECT credentials into a role, or raises BrokerError(AuthenticationError)."""

    def authenticate(self, method: str, data: bytes) -> str | None:
        """The role the credentials prove."""

    def authenticate_session(
        self, method: str, data: bytes, peercert: Any = None
    ) -> tuple[str, float | None]:
        """The role the credentials prove and when they expire (epoch seconds, or None);
        ``peercert`` is the verified client certificate on a TLS connection."""


class Authorizer(Protocol):
    """Checks that a role may do an action on a topic, or raises BrokerError."""

    def check(self, role: str | None, topic: str, action: str) -> None:
        """Raise BrokerError(AuthorizationError) if ``role`` may not ``action`` on ``topic``."""

    def check_namespace(self, role: str | None, namespace: str, action: str) -> None:
        """Raise BrokerError(AuthorizationError) if ``role`` may not ``action`` in ``namespace``."""


class BrokerServer:
    """Listens on the broker service ports and hands each connection to a ServerConnection."""

    def __init__(
        self,
        service: BrokerService,
        *,
        authenticator: Authenticator | None = None,
        authorizer: Authorizer | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.service = service
        self.config: BrokerConfig = service.config
        self.authenticator = authenticator
        self.authorizer = authorizer
        self.ssl_context = ssl_context
        self.listeners, self.internal_listener = parse_listeners(service.config)
        self.version = __version__
        self.connections: set[ServerConnection] = set()
        cfg = self.config
        self.publish_throttle = PublishThrottle(
            cfg.maxMessagePublishBufferSizeInMB * 1024 * 1024,
            cfg.maxPendingPublishRequestsPerConnection,
        )
        service.broker_gauges.append(self._publish_gauges)
        self.connection_limits = ConnectionLimits(
            cfg.brokerMaxConnections, cfg.brokerMaxConnectionsPerIp
        )
        self.connection_stats = ConnectionStats(self.connection_limits)
        service.broker_gauges.append(self.connection_stats.gauges)
        self._servers: list[asyncio.AbstractServer] = []
        self._names = itertools.count()
        self.port = 0
        self.tls_port = 0

    def _publish_gauges(self) -> list[tuple[str, float, str]]:
        t = self.publish_throttle
        return [
            (
                "pulsar_broker_publish_buffer_usage",
                t.usage,
                "Bytes of publishes received and not yet stored",
            ),
            (
                "pulsar_broker_publish_buffer_max_usage",
                t.max_usage,
                "Most bytes of publishes pending at once since the broker started",
            ),
            (
                "pulsar_broker_throttled_connections",
                t.throttled_connections,
                "Connections not read: maxPendingPublishRequestsPerConnection reached",
            ),
            (
                "pulsar_broker_throttled_connections_global_limit",
                t.throttled_connections_global_limit,
                "Connections not read: maxMessagePublishBufferSizeInMB reached",
            ),
            (
                "keyshared_publish_buffer_pauses_total",
                t.global_pauses,
                "Times reading from producers' connections was paused by the publish buffer",
            ),
            (
                "keyshared_asyncio_tasks",
                len(asyncio.all_tasks()),
                "asyncio tasks alive in the broker's loop (a soak test watches it for leaks)",
            ),
            (
                "keyshared_publish_connection_pauses_total",
                t.connection_pauses,
                "Times a connection was paused by maxPendingPublishRequestsPerConnection",
            ),
        ]

    def admit(self, conn: ServerConnection, ip: str, address: str) -> str | None:
        """Count a new connection from ``ip`` (on either listener); the refusal message
        instead when a connection limit is reached (server/connection_limits.py)."""
        refusal = self.connection_limits.admit(ip, address)
        if refusal is None:
            self.connections.add(conn)
            self.connection_stats.created += 1
        return refusal

    def release(self, conn: ServerConnection, ip: str) -> None:
        """An admitted connection closed (a refused one was never counted)."""
        if conn in self.connections:
            self.connections.discard(conn)
            self.connection_limits.release(ip)
            self.connection_stats.closed += 1

    def new_producer_name(self) -> str:
        """A broker-assigned producer name, unique for this broker's lifetime."""
        return f"{self.config.clusterName}-{id(self) & 0xFFFF:x}-{next(self._names)}"

    def lookup_urls(self, transport: Any, listener_name: str = "") -> tuple[str, str]:
        """(pulsar URL, pulsar+ssl URL or "") a lookup answers, for the listener asked for (or
        the internal one); BrokerError if the broker has no listener of that name."""
        listener = listener_for(self.listeners, self.internal_listener, listener_name)
        if listener is not None:
            return listener.url, listener.url_tls
        return self.service_url(transport, tls=False), self.service_url(transport, tls=True)

    def service_url(self, transport: Any, *, tls: bool) -> str:
        """The URL clients should use, on the address they reached us at."""
        port = self.tls_port if tls else self.port
        if not port:
            return ""
        host = self.config.advertisedAddress
        # As Pulsar: an advertisedAddress the user set is what lookups answer (so a certificate
        # for that name verifies); without one, the address the client reached us at.
        explicit = "advertisedAddress" in self.config.explicit_keys
        sock = transport.get_extra_info("sockname") if transport is not None else None
        if sock and not explicit:
            host = sock[0]
            if ":" in host:
                host = f"[{host}]"
        scheme = "pulsar+ssl" if tls else "pulsar"
        return f"{scheme}://{host}:{port}"

    async def start(self) -> None:
        """Bind the configured ports (0 picks a free one)."""
        loop = asyncio.get_running_loop()
        host = self.config.bindAddress
        server = await loop.create_server(
            lambda: ServerConnection(self), host, self.config.brokerServicePort, backlog=1024
        )
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        if self.ssl_context is not None and self.config.brokerServicePortTls:
            tls_server = await loop.create_server(
                lambda: ServerConnection(self, tls=True),
                host,
                self.config.brokerServicePortTls,
                ssl=self.ssl_context,
                backlog=1024,
            )
            self._servers.append(tls_server)
            self.tls_port = tls_server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting and close every connection."""
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for server in self._servers:
            await server.wait_closed()
        self._servers.clear()
