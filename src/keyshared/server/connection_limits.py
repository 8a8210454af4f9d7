"""Connection admission and the connection counters: Pulsar's ConnectionController and stats.

Two broker.conf limits, both 0 (unlimited) by default, checked when a connection is accepted on
the plain or the TLS listener (one count for both, as Pulsar keeps one per broker):

- ``brokerMaxConnections``: connections open on the broker;
- ``brokerMaxConnectionsPerIp``: connections open from one client address.

A connection over a limit is answered at once, before it sends anything, with Pulsar's
``ERROR`` (request id -1, ``NotAllowedError``, "Reached the maximum number of connections" or
"Reached the maximum number of connections on address/IP:PORT", Pulsar's text verbatim) and
closed. The official client reads that ERROR where it expects CONNECTED, closes the connection
and retries it with back-off until its operation timeout: the user sees the create or subscribe
fail with a timeout (or a connection error), never a half-open session. Pulsar counts only IPv4
clients (its controller matches the address against an IPv4 pattern); every address counts here.

The counters are Pulsar's (``pulsar_connection_created_total_count`` and the rest, see
:meth:`ConnectionStats.gauges`): a connection refused by a limit is not "created" (as in Pulsar,
where the refusal returns before the connection is recorded), and is counted apart.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

MAX_CONNECTIONS_MESSAGE = "Reached the maximum number of connections"
"""Pulsar's message for a connection refused by ``brokerMaxConnections``."""

MAX_CONNECTIONS_PER_IP_MESSAGE = "Reached the maximum number of connections on address"
"""Pulsar's message for ``brokerMaxConnectionsPerIp``, followed (no space, as Pulsar) by the
client's address as Java prints it: ``/127.0.0.1:54321``."""


class ConnectionLimits:
    """Open connections, in total and per client IP, against the configured limits."""

    def __init__(self, max_connections: int, max_per_ip: int) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.active = 0
        self._per_ip: dict[str, int] = {}
        self.rejected_max_connections = 0
        self.rejected_per_ip = 0

    def admit(self, ip: str, address: str) -> str | None:
        """Count a new connection from ``ip``; the refusal message instead when it is over a
        limit (then nothing is counted). ``address`` is how the message names the client."""
        if self.max_connections > 0 and self.active >= self.max_connections:
            self.rejected_max_connections += 1
            log.info(
                "Reject connect request from %s, because reached the maximum number of "
                "connections %d",
                address,
                self.active,
            )
            return MAX_CONNECTIONS_MESSAGE
        count = self._per_ip.get(ip, 0)
        if self.max_per_ip > 0 and count >= self.max_per_ip:
            self.rejected_per_ip += 1
            log.info(
                "Reject connect request from %s, because reached the maximum number of "
                "connections per Ip %d",
                address,
                count,
            )
            return MAX_CONNECTIONS_PER_IP_MESSAGE + address
        self.active += 1
        self._per_ip[ip] = count + 1
        return None

    def release(self, ip: str) -> None:
        """An admitted connection from ``ip`` closed."""
        self.active -= 1
        left = self._per_ip.get(ip, 0) - 1
        if left > 0:
            self._per_ip[ip] = left
        else:
            self._per_ip.pop(ip, None)

    def connections_from(self, ip: str) -> int:
        """Connections open from ``ip``."""
        return self._per_ip.get(ip, 0)


class ConnectionStats:
    """Pulsar's broker connection counters, and ours for refusals and keep-alive closes."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.created = 0
        self.closed = 0
        self.create_success = 0
        self.create_fail = 0
        self.keepalive_timeouts = 0

    def gauges(self) -> list[tuple[str, float, str]]:
        """The counters as (metric name, value, help) for the broker's /metrics."""
        lim = self.limits
        return [
            ("pulsar_active_connections", lim.active, "Connections open on the broker"),
            (
                "pulsar_connection_created_total_count",
                self.created,
                "Connections accepted since the broker started",
            ),
            (
                "pulsar_connection_closed_total_count",
                self.closed,
                "Accepted connections closed since the broker started",
            ),
            (
                "pulsar_connection_create_success_count",
                self.create_success,
                "Connections whose CONNECT succeeded",
            ),
            (
                "pulsar_connection_create_fail_count",
                self.create_fail,
                "Connections whose CONNECT failed (authentication)",
            ),
            (
                "keyshared_connections_rejected_max_connections_total",
                lim.rejected_max_connections,
                "Connections refused at accept: brokerMaxConnections reached",
            ),
            (
                "keyshared_connections_rejected_per_ip_total",
                lim.rejected_per_ip,
                "Connections refused at accept: brokerMaxConnectionsPerIp reached",
            ),
            (
                "keyshared_keepalive_timeouts_total",
                self.keepalive_timeouts,
                "Connections closed for not answering a PING (or no CONNECT) in time",
            ),
        ]
