"""One client connection: protocol frames in, broker calls; broker output, frames out.

The commands are handled by mix-ins, each in its own module: ``producer_commands`` (PRODUCER,
SEND and receipts), ``consumer_commands`` (SUBSCRIBE, FLOW, ACK, ... and MESSAGE out),
``lookup_commands`` (lookups, schemas); ``connection_core`` holds the state and output they
share. This module holds the ``asyncio.Protocol`` callbacks, the frame loop, the handshake and
authentication, and keepalive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.protocol import Frame, ProtocolError, SendFrame, commands, pb
from keyshared.protocol.constants import PROTOCOL_VERSION
from keyshared.server.auth_refresh import REFRESH_AUTH_DATA, AuthRefresh
from keyshared.server.connection_core import _U64, T, position_of, signed64
from keyshared.server.consumer_commands import ConsumerCommands
from keyshared.server.keepalive import KeepAlive
from keyshared.server.lookup_commands import LookupCommands
from keyshared.server.producer_commands import ProducerCommands
from keyshared.server.publish import Publisher

if TYPE_CHECKING:
    from keyshared.server.listener import BrokerServer

log = logging.getLogger(__name__)

__all__ = ["ServerConnection", "position_of", "signed64"]


class ServerConnection(ProducerCommands, ConsumerCommands, LookupCommands):
    """Pulsar's ServerCnx for one TCP (or TLS) connection."""

    def __init__(self, server: BrokerServer, *, tls: bool = False) -> None:
        super().__init__(server, tls=tls)
        self.publisher = Publisher(self)
        self._keepalive = KeepAlive(self, self.config.keepAliveIntervalSeconds)
        self._publishes = server.publish_throttle.attach(self)
        self._handlers: dict[int, Callable[[pb.BaseCommand, Any], None]] = {
            T.CONNECT: self._on_connect,
            T.PING: self._on_ping,
            T.PONG: self._on_pong,
            T.PARTITIONED_METADATA: self._on_partitioned_metadata,
            T.LOOKUP: self._on_lookup,
            T.PRODUCER: self._on_producer,
            T.CLOSE_PRODUCER: self._on_close_producer,
            T.SUBSCRIBE: self._on_subscribe,
            T.FLOW: self._on_flow,
            T.ACK: self._on_ack,
            T.REDELIVER_UNACKNOWLEDGED_MESSAGES: self._on_redeliver,
            T.SEEK: self._on_seek,
            T.GET_LAST_MESSAGE_ID: self._on_get_last_message_id,
            T.UNSUBSCRIBE: self._on_unsubscribe,
            T.CLOSE_CONSUMER: self._on_close_consumer,
            T.GET_TOPICS_OF_NAMESPACE: self._on_get_topics_of_namespace,
            T.GET_SCHEMA: self._on_get_schema,
            T.GET_OR_CREATE_SCHEMA: self._on_get_or_create_schema,
            T.CONSUMER_STATS: self._on_consumer_stats,
            T.AUTH_RESPONSE: self._on_auth_response,
        }

    # --- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Start a session: no command is accepted before CONNECT."""
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)
        transport = self.transport
        peer = transport.get_extra_info("peername")
        self._address = f"/{peer[0]}:{peer[1]}" if peer else ""
        self._ip = str(peer[0]) if peer else ""
        refusal = self.server.admit(self, self._ip, self._address)
        if refusal is not None:
            # Pulsar's ConnectionController: refused before the client says anything.
            self.closed = True
            transport.write(
                commands.error(request_id=-1, error=ServerError.NotAllowedError, message=refusal)
            )
            transport.close()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=4 * 1024 * 1024, low=1024 * 1024)
        self._keepalive.start()

    def data_received(self, data: bytes) -> None:
        """Decode every complete frame and handle it."""
        self.last_received = time.monotonic()
        self._handle_frames(data)

    def _handle_frames(self, data: bytes = b"") -> None:
        # Stops as soon as reading is paused (a publish limit): the frames already received
        # wait in the decoder, so a limit holds from the very next send, not the next read.
        decoder = self.decoder
        try:
            if data:
                decoder.feed(data)
            while not self.closed and self._reading:
                frame = decoder.next_frame_or_send()
                if frame is None:
                    break
                if type(frame) is SendFrame:
                    if not self.connected:
                        self._fail("SEND before CONNECT")
                        return
                    self._on_send_frame(frame)
                    continue
                assert isinstance(frame, Frame)
                cmd = frame.command
                ctype = cmd.type
                if not self.connected and ctype != T.CONNECT:
                    self._fail(f"{T.Type.Name(ctype)} before CONNECT")
                    return
                handler = self._handlers.get(ctype)
                if handler is None:
                    self._unsupported(cmd)
                    continue
                handler(cmd, None)
        except ProtocolError as exc:
            self._fail(f"protocol error: {exc}")
        except Exception:
            log.exception("unexpected error on connection %s", self._address)
            self._fail("internal error")

    def connection_lost(self, exc: Exception | None) -> None:
        """Release every producer and consumer of this connection."""
        self.closed = True
        self.server.release(self, self._ip)
        self._publishes.close()
        self._keepalive.stop()
        if self._auth_handle is not None:
            self._auth_handle.cancel()
        for producer in list(self.producers.values()):
            producer.topic.remove_producer(producer)
        self.producers.clear()
        for consumer in list(self.consumers.values()):
            consumer.subscription.remove_consumer(consumer)
        self.consumers.clear()
        for task in list(self._tasks):
            task.cancel()

    def pause_writing(self) -> None:
        """The write buffer is full: dispatchers see no permits for our consumers."""
        self.writable = False

    def set_reading(self, reading: bool) -> None:
        """Pause or resume reading from the client (publish back-pressure)."""
        if reading == self._reading or self.transport is None or self.closed:
            return
        self._reading = reading
        if reading:
            # The client could not be heard while paused: idle time counts from now.
            self.last_received = time.monotonic()
            self.transport.resume_reading()
            asyncio.get_running_loop().call_soon(self._handle_frames)
        else:
            self.transport.pause_reading()

    def has_producers(self) -> bool:
        """Whether a producer is open on this connection."""
        return bool(self.producers)

    def resume_writing(self) -> None:
        """The write buffer drained: wake the dispatchers of our consumers."""
        self.writable = True
        for consumer in list(self.consumers.values()):
            disp = consumer.subscription.dispatcher
            if disp is not None:
                disp.on_writable()

    # --- keepalive (server/keepalive.py) -------------------------------------------------------
    def is_reading(self) -> bool:
        """Whether the client is being read (not paused by back-pressure or a rate limit)."""
        transport = self.transport
        return self._reading and transport is not None and transport.is_reading()

    def send_ping(self) -> None:
        """Ask the client for a PONG."""
        self.send_command(T(type=T.PING, ping=pb.CommandPing()))

    def keepalive_close(self, reason: str) -> None:
        """Close a client that did not answer in time."""
        self.server.connection_stats.keepalive_timeouts += 1
        self._fail(reason)

    # --- handshake ---------------------------------------------------------------------------
    def _on_connect(self, cmd: pb.BaseCommand, _: Any) -> None:
        if self.connected:
            self._fail("second CONNECT")
            return
        c = cmd.connect
        self._client_version = c.client_version
        auth = self.server.authenticator
        version = min(c.protocol_version or PROTOCOL_VERSION, PROTOCOL_VERSION)
        self._protocol_version = version
        if auth is not None:
            try:
                self.principal, expires = auth.authenticate_session(
                    c.auth_method_name,
                    bytes(c.auth_data),
                    self._peercert(),
                )
            except BrokerError as exc:
                self.server.connection_stats.create_fail += 1
                self._error(_U64 - 1, exc.code, exc.message)
                self._fail(f"authentication failed: {exc.message}")
                return
            self._auth_refresh = AuthRefresh(
                supports_refresh=c.feature_flags.supports_auth_refresh,
                challenge=self._send_auth_challenge,
                close=self._fail,
            )
            self._auth_refresh.authenticated(expires)
            self._schedule_auth_check()
        self.connected = True
        self.server.connection_stats.create_success += 1
        self.send_command(
            T(
                type=T.CONNECTED,
                connected=pb.CommandConnected(
                    server_version=f"keyshared-{self.server.version}",
                    protocol_version=version,
                    max_message_size=self.config.maxMessageSize,
                ),
            )
        )

    def _peercert(self) -> Any:
        """The verified client certificate of a TLS connection (for the TLS provider)."""
        if not self.tls or self.transport is None:
            return None
        return self.transport.get_extra_info("peercert")

    def _on_auth_response(self, cmd: pb.BaseCommand, _: Any) -> None:
        auth = self.server.authenticator
        if auth is None:
            return
        r = cmd.authResponse.response
        try:
            principal, expires = auth.authenticate_session(
                r.auth_method_name,
                bytes(r.auth_data),
                self._peercert(),
            )
        except BrokerError as exc:
            self._fail(f"re-authentication failed: {exc.message}")
            return
        if principal != self.principal:
            # As Pulsar: a refresh renews credentials, it never changes who the client is.
            self._fail("re-authentication changed the role")
            return
        if self._auth_refresh is not None:
            self._auth_refresh.authenticated(expires)

    def _schedule_auth_check(self) -> None:
        interval = self.config.authenticationRefreshCheckSeconds
        if interval <= 0 or self.closed:
            return
        self._auth_handle = asyncio.get_running_loop().call_later(interval, self._auth_check)

    def _auth_check(self) -> None:
        refresh = self._auth_refresh
        if refresh is None or self.closed:
            return
        refresh.check(time.time())
        self._schedule_auth_check()

    def _send_auth_challenge(self) -> None:
        self.write(
            commands.auth_challenge(
                auth_method_name="token",
                auth_data=REFRESH_AUTH_DATA,
                server_version=f"keyshared-{self.server.version}",
                protocol_version=self._protocol_version,
            )
        )

    def _on_ping(self, cmd: pb.BaseCommand, _: Any) -> None:
        self.send_command(T(type=T.PONG, pong=pb.CommandPong()))

    def _on_pong(self, cmd: pb.BaseCommand, _: Any) -> None:
        pass
