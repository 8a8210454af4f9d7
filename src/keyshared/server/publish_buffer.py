"""Publish back-pressure: stop reading from producers' connections while too much is unstored.

Pulsar's two limits (broker.conf):

- ``maxMessagePublishBufferSizeInMB``: bytes of publishes received and not yet stored (synced
  under the sync policy), all connections together. Above it the broker stops reading from every
  connection that has a producer (Netty's auto-read off; here the transport's
  ``pause_reading``), and reads again once the total has drained below half of it. Pulsar's
  default is half of the JVM's direct memory; a Python broker has no such pool, so ours is a
  fixed 64 MB: a disk that syncs in milliseconds never gets near it (the group commit takes
  whatever accumulated during the last sync, a few MB at most), while a disk that stalls for
  seconds holds the broker's memory to tens of MB instead of everything the producers can send
  meanwhile (each producer may have up to ``maxPendingMessages`` of its own in flight, 1000 by
  default, times as many producers as connect).
- ``maxPendingPublishRequestsPerConnection`` (1000): sends in flight on one connection; at the
  limit that connection alone stops being read, until half of them are answered.

The accounting is event-driven, as Pulsar 3.x's ServerCnx pending-bytes counters (older Pulsar
polled every ``maxMessagePublishBufferCheckIntervalInMillis``): a send counts when its frame is
handled and stops counting when its topic has stored or failed it. Pulsar divides the limit
among its IO threads and pauses every connection of the thread that crossed it; one event loop
here, so one limit, and only connections with a producer are paused (a consumer-only
connection's acks are what lets retention and the dispatchers move on). Reading paused on a
producer's connection also holds back its consumers' flow permits and acks, as in Pulsar.

Metrics (Pulsar's names): ``pulsar_broker_publish_buffer_usage`` and
``pulsar_broker_publish_buffer_max_usage`` (PIP-410, in bytes),
``pulsar_broker_throttled_connections`` (paused by their own pending-send limit) and
``pulsar_broker_throttled_connections_global_limit`` (paused by the buffer limit).

Publish rate limits (``publishRate``, ``brokerPublisherThrottlingMaxMessageRate``; see
broker/throttle.py) hold a connection through :meth:`ConnectionPublishes.throttle` and
:meth:`~ConnectionPublishes.unthrottle`: reading is paused while any of the three holds it.
"""

from __future__ import annotations

import logging
from typing import Protocol

log = logging.getLogger(__name__)


class Readable(Protocol):
    """What the throttle needs from a connection."""

    def set_reading(self, reading: bool) -> None:
        """Resume (True) or pause (False) reading from the client."""

    def has_producers(self) -> bool:
        """Whether a producer is open on the connection (only those are paused globally)."""


class ConnectionPublishes:
    """One connection's sends in flight, as the throttle sees them."""

    __slots__ = (
        "_throttle",
        "bytes",
        "closed",
        "conn",
        "paused_global",
        "paused_own",
        "rate_limited",
        "sends",
    )

    def __init__(self, throttle: PublishThrottle, conn: Readable) -> None:
        self._throttle = throttle
        self.conn = conn
        self.sends = 0
        self.bytes = 0
        self.paused_own = False
        self.paused_global = False
        # Publish rate limits holding this connection (broker/throttle.py), counted.
        self.rate_limited = 0
        self.closed = False

    def started(self, nbytes: int) -> None:
        """A send of ``nbytes`` was received and handed to the topic."""
        self.sends += 1
        self.bytes += nbytes
        self._throttle.started(self, nbytes)

    def finished(self, nbytes: int) -> None:
        """A send's receipt or error was written (or it was dropped)."""
        self.sends -= 1
        self.bytes -= nbytes
        self._throttle.finished(self, nbytes)

    def close(self) -> None:
        """The connection is gone; its sends still in flight count until they complete."""
        self.closed = True
        self._throttle.detach(self)

    def throttle(self) -> None:
        """A publish rate limit holds the connection (one more hold)."""
        self.rate_limited += 1
        if self.rate_limited == 1:
            self.apply()

    def unthrottle(self) -> None:
        """A publish rate limit lets go (reading resumes when none holds it)."""
        self.rate_limited -= 1
        if self.rate_limited == 0:
            self.apply()

    def apply(self) -> None:
        """Pause or resume the connection as the limits say."""
        if not self.closed:
            paused = self.paused_own or self.paused_global or self.rate_limited > 0
            self.conn.set_reading(not paused)


class PublishThrottle:
    """The broker-wide publish buffer and the per-connection pending-send limit."""

    def __init__(self, max_buffer_bytes: int, max_pending_per_connection: int) -> None:
        # 0 (or less) disables a limit.
        self.max_bytes = max(max_buffer_bytes, 0)
        self.resume_bytes = self.max_bytes // 2
        self.max_pending = max(max_pending_per_connection, 0)
        self.resume_pending = self.max_pending // 2
        self.usage = 0
        self.max_usage = 0
        self.paused = False
        self._conns: set[ConnectionPublishes] = set()
        # Counters for stats and tests.
        self.global_pauses = 0
        self.connection_pauses = 0

    def attach(self, conn: Readable) -> ConnectionPublishes:
        """Start accounting for a new connection."""
        state = ConnectionPublishes(self, conn)
        self._conns.add(state)
        return state

    def detach(self, state: ConnectionPublishes) -> None:
        """Forget a closed connection (its in-flight bytes still drain through finished)."""
        self._conns.discard(state)

    @property
    def throttled_connections(self) -> int:
        """Connections paused by their own pending-send limit."""
        return sum(1 for s in self._conns if s.paused_own)

    @property
    def throttled_connections_global_limit(self) -> int:
        """Connections paused by the publish buffer limit."""
        return sum(1 for s in self._conns if s.paused_global)

    def started(self, state: ConnectionPublishes, nbytes: int) -> None:
        """Count a send; pause what the limits say to pause."""
        self.usage += nbytes
        if self.usage > self.max_usage:
            self.max_usage = self.usage
        if self.max_pending and state.sends >= self.max_pending and not state.paused_own:
            state.paused_own = True
            self.connection_pauses += 1
            state.apply()
        if self.max_bytes and self.usage > self.max_bytes and not self.paused:
            self._pause_all()
        elif self.paused and not state.paused_global:
            # A producer that connected while paused.
            state.paused_global = True
            state.apply()

    def finished(self, state: ConnectionPublishes, nbytes: int) -> None:
        """Uncount a send; resume what drained below the resume thresholds."""
        self.usage -= nbytes
        if state.paused_own and state.sends <= self.resume_pending:
            state.paused_own = False
            state.apply()
        if self.paused and self.usage <= self.resume_bytes:
            self._resume_all()

    def _pause_all(self) -> None:
        self.paused = True
        self.global_pauses += 1
        log.debug(
            "publish buffer at %d bytes, above maxMessagePublishBufferSizeInMB (%d bytes):"
            " pausing reads from producers' connections",
            self.usage,
            self.max_bytes,
        )
        for state in self._conns:
            if not state.paused_global and state.conn.has_producers():
                state.paused_global = True
                state.apply()

    def _resume_all(self) -> None:
        self.paused = False
        for state in self._conns:
            if state.paused_global:
                state.paused_global = False
                state.apply()

    def stats(self) -> dict[str, int | bool]:
        """Figures for the metrics."""
        return {
            "publishBufferUsage": self.usage,
            "publishBufferMaxUsage": self.max_usage,
            "publishBufferLimit": self.max_bytes,
            "paused": self.paused,
            "throttledConnections": self.throttled_connections,
            "throttledConnectionsGlobalLimit": self.throttled_connections_global_limit,
            "globalPauses": self.global_pauses,
            "connectionPauses": self.connection_pauses,
        }
