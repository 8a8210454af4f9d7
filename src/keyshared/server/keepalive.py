"""Keep-alive: find idle, half-open and stuck clients and close them (Pulsar's PulsarHandler).

Every ``keepAliveIntervalSeconds`` (default 30; 0 turns it off) a connection checks on its
client:

- no CONNECT yet: closed, as Pulsar closes a connection whose handshake did not complete within
  one interval;
- a PING was sent and nothing at all came back since: closed ("keep-alive timeout"), unless the
  broker itself stopped reading the connection (publish back-pressure, rate limits), since the
  answer may be sitting unread in the socket; Pulsar makes the same exception;
- nothing received for an interval: a PING is sent.

Pulsar pings every connection on every tick; here only the ones that were silent for a whole
interval, so a busy connection costs no pings. Any command counts as an answer, not only PONG,
as in Pulsar. A silent client is thus pinged after one interval of silence and closed after two.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class KeptAlive(Protocol):
    """What the keep-alive needs from a connection."""

    closed: bool
    connected: bool
    last_received: float

    def is_reading(self) -> bool:
        """Whether the broker is reading the connection (not paused by back-pressure)."""

    def send_ping(self) -> None:
        """Send a PING."""

    def keepalive_close(self, reason: str) -> None:
        """Close the connection; ``reason`` goes to the log."""


class KeepAlive:
    """The keep-alive timer of one connection."""

    __slots__ = ("_conn", "_handle", "_interval", "_ping_sent")

    def __init__(self, conn: KeptAlive, interval: float) -> None:
        self._conn = conn
        self._interval = interval
        self._handle: asyncio.TimerHandle | None = None
        self._ping_sent: float | None = None

    def start(self) -> None:
        """Start checking (a no-op when the interval is 0)."""
        self._schedule(self._interval)

    def stop(self) -> None:
        """The connection is gone."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, delay: float) -> None:
        if self._interval <= 0 or self._conn.closed:
            return
        self._handle = asyncio.get_running_loop().call_later(delay, self._tick)

    def _tick(self) -> None:
        self._handle = None
        conn = self._conn
        if conn.closed:
            return
        if not conn.connected:
            conn.keepalive_close("Pulsar Handshake was not completed within timeout")
            return
        now = time.monotonic()
        if self._ping_sent is not None:
            if conn.last_received >= self._ping_sent:
                self._ping_sent = None
            elif conn.is_reading():
                conn.keepalive_close("Forcing connection to close after keep-alive timeout")
                return
        silent = now - conn.last_received
        if self._ping_sent is None and silent >= self._interval:
            self._ping_sent = now
            conn.send_ping()
            self._schedule(self._interval)
            return
        if self._ping_sent is not None:
            # Paused by the broker: check again after another interval.
            self._schedule(self._interval)
            return
        self._schedule(self._interval - silent)
