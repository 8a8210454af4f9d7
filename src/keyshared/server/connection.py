"""One client connection: protocol frames in, broker calls; broker output, frames out."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.nonpersistent_topic import NON_PERSISTENT, NonPersistentTopic
from keyshared.broker.producer_access import access_mode_of
from keyshared.broker.schema import version_bytes
from keyshared.broker.subscription import AckItem
from keyshared.broker.topic import Producer
from keyshared.protocol import (
    FrameDecoder,
    ProtocolError,
    commands,
    encode_command,
    encode_message_header,
    encode_send_receipt,
    pb,
)
from keyshared.protocol.constants import PROTOCOL_VERSION
from keyshared.server import schema_commands
from keyshared.server.auth_refresh import REFRESH_AUTH_DATA, AuthRefresh
from keyshared.server.keepalive import KeepAlive
from keyshared.server.publish import Publisher
from keyshared.storage.position import EARLIEST, LATEST, Position

if TYPE_CHECKING:
    from keyshared.server.listener import BrokerServer

log = logging.getLogger(__name__)

_U64 = 1 << 64
_INT64_MAX = (1 << 63) - 1
T = pb.BaseCommand


def signed64(v: int) -> int:
    """A uint64 wire value read as Pulsar's signed long (2**64-1 is -1)."""
    return v - _U64 if v >= 1 << 63 else v


def position_of(mid: pb.MessageIdData) -> Position:
    """The Position a MessageIdData names (ledger and entry read as signed)."""
    return Position(signed64(mid.ledgerId), signed64(mid.entryId))


def _wire_error(code: ServerError) -> pb.ServerError:
    """Our ServerError as the generated enum type (same numbers)."""
    return cast("pb.ServerError", int(code))


def _u64(v: int) -> int:
    return v & (_U64 - 1)


def _non_persistent(consumer: Consumer) -> bool:
    """A consumer of a non-persistent topic: its subscription has no cursor."""
    return consumer.subscription.topic.name.domain == NON_PERSISTENT


class ServerConnection(asyncio.Protocol):
    """Pulsar's ServerCnx for one TCP (or TLS) connection."""

    def __init__(self, server: BrokerServer, *, tls: bool = False) -> None:
        self.server = server
        self.service = server.service
        self.config = server.config
        self.tls = tls
        self.decoder = FrameDecoder(self.config.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.connected = False
        self.closed = False
        self.writable = True
        self._address = ""
        self._client_version = ""
        self.principal: str | None = None
        self.producers: dict[int, Producer] = {}
        self.publisher = Publisher(self)
        self.consumers: dict[int, Consumer] = {}
        self.last_received = time.monotonic()
        self._out: list[bytes] = []
        self._keepalive = KeepAlive(self, self.config.keepAliveIntervalSeconds)
        self._ip = ""
        self._auth_refresh: AuthRefresh | None = None
        self._auth_handle: asyncio.TimerHandle | None = None
        self._protocol_version = PROTOCOL_VERSION
        self._tasks: set[asyncio.Task[Any]] = set()
        # Producer ids the broker closed lately, each with the token of its latest close.
        self._recently_closed_producers: dict[int, object] = {}
        # Sends in flight, for the publish buffer and pending-send limits (publish_buffer.py).
        self._publishes = server.publish_throttle.attach(self)
        self._reading = True
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
                frame = decoder.next_frame()
                if frame is None:
                    break
                cmd = frame.command
                ctype = cmd.type
                if not self.connected and ctype != T.CONNECT:
                    self._fail(f"{T.Type.Name(ctype)} before CONNECT")
                    return
                if ctype == T.SEND:
                    self._on_send_frame(cmd, frame.payload, frame.checksum, frame.checksum_ok)
                    continue
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

    # --- output ------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        """Queue bytes for this connection; they go out together at the end of the turn.

        Receipts and messages are produced one by one while a batch of frames is handled;
        writing each on its own would cost a system call per message.
        """
        if self.transport is None or self.closed:
            return
        out = self._out
        out.append(data)
        if len(out) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def write_many(self, chunks: list[bytes]) -> None:
        """Queue several buffers (e.g. MESSAGE headers and stored payloads)."""
        if self.transport is None or self.closed or not chunks:
            return
        out = self._out
        scheduled = bool(out)
        out.extend(chunks)
        if not scheduled:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        out = self._out
        if not out:
            return
        self._out = []
        if self.transport is not None and not self.closed:
            self.transport.writelines(out)

    def send_command(self, cmd: pb.BaseCommand) -> None:
        """Encode and send one command."""
        self.write(encode_command(cmd))

    def _fail(self, reason: str) -> None:
        """Close this one connection after bad input; the broker goes on."""
        log.warning("closing connection %s: %s", self._address, reason)
        if self.transport is not None and not self.closed:
            self._flush()
            self.transport.close()
        self.closed = True

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _error(self, request_id: int, code: ServerError, message: str) -> None:
        self.send_command(
            T(
                type=T.ERROR,
                error=pb.CommandError(
                    request_id=request_id, error=_wire_error(code), message=message
                ),
            )
        )

    def _success(self, request_id: int) -> None:
        self.send_command(T(type=T.SUCCESS, success=pb.CommandSuccess(request_id=request_id)))

    def _unsupported(self, cmd: pb.BaseCommand) -> None:
        """A command we do not serve: answer with an error when it has a request id."""
        name = T.Type.Name(cmd.type) if cmd.type in T.Type.values() else str(cmd.type)
        sub_name = cmd.DESCRIPTOR.fields_by_number.get(cmd.type)
        request_id = None
        if sub_name is not None and cmd.HasField(sub_name.name):
            sub = getattr(cmd, sub_name.name)
            if "request_id" in sub.DESCRIPTOR.fields_by_name:
                request_id = sub.request_id
        if request_id is None:
            self._fail(f"unsupported command {name}")
            return
        self._error(request_id, ServerError.NotAllowedError, f"Command {name} is not supported")

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

    # --- discovery ---------------------------------------------------------------------------
    def _authorize(self, topic_name: str, action: str) -> None:
        authz = self.server.authorizer
        if authz is not None:
            authz.check(self.principal, topic_name, action)

    def _on_partitioned_metadata(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.partitionMetadata
        resp = pb.CommandPartitionedTopicMetadataResponse(request_id=r.request_id)
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "lookup")
            partitions = self.service.partitions_of(name)
            if (
                partitions == 0
                and not self.service.topic_exists(name)
                and not self.config.allowAutoTopicCreation
                and name.partition_index < 0
            ):
                raise BrokerError(ServerError.TopicNotFound, f"Topic {name} does not exist")
            resp.partitions = partitions
            resp.response = pb.CommandPartitionedTopicMetadataResponse.Success
        except BrokerError as exc:
            resp.response = pb.CommandPartitionedTopicMetadataResponse.Failed
            resp.error = _wire_error(exc.code)
            resp.message = exc.message
        self.send_command(T(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=resp))

    def _on_lookup(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.lookupTopic
        resp = pb.CommandLookupTopicResponse(request_id=r.request_id)
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "lookup")
            self.service.check_partition_name(name)
            resp.response = pb.CommandLookupTopicResponse.Connect
            resp.authoritative = True
            url, tls_url = self.server.lookup_urls(self.transport, r.advertised_listener_name)
            resp.brokerServiceUrl = url
            if tls_url:
                resp.brokerServiceUrlTls = tls_url
        except BrokerError as exc:
            resp.response = pb.CommandLookupTopicResponse.Failed
            resp.error = _wire_error(exc.code)
            resp.message = exc.message
        self.send_command(T(type=T.LOOKUP_RESPONSE, lookupTopicResponse=resp))

    def _on_get_topics_of_namespace(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getTopicsOfNamespace
        authz = self.server.authorizer
        if authz is not None:
            try:
                authz.check_namespace(self.principal, r.namespace, "lookup")
            except BrokerError as exc:
                self._error(r.request_id, exc.code, exc.message)
                return
        mode = r.mode if r.HasField("mode") else pb.CommandGetTopicsOfNamespace.PERSISTENT
        topics = []
        if mode != pb.CommandGetTopicsOfNamespace.NON_PERSISTENT:
            topics += self.service.list_topics(r.namespace)
        if mode != pb.CommandGetTopicsOfNamespace.PERSISTENT:
            topics += self.service.nonpersistent.names(r.namespace)
        self.send_command(
            T(
                type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                getTopicsOfNamespaceResponse=pb.CommandGetTopicsOfNamespaceResponse(
                    request_id=r.request_id, topics=topics
                ),
            )
        )

    def _on_get_schema(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getSchema
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "lookup")
        except BrokerError as exc:
            self.write(
                commands.get_schema_response(
                    request_id=r.request_id, error=exc.code, error_message=exc.message
                )
            )
            return
        self.send_command(schema_commands.get_schema(self.service.schemas, name, r))

    def _on_get_or_create_schema(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getOrCreateSchema
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "produce")
        except BrokerError as exc:
            resp = pb.CommandGetOrCreateSchemaResponse(
                request_id=r.request_id, error_code=_wire_error(exc.code), error_message=exc.message
            )
            self.send_command(
                T(type=T.GET_OR_CREATE_SCHEMA_RESPONSE, getOrCreateSchemaResponse=resp)
            )
            return
        self.send_command(schema_commands.get_or_create_schema(self.service.schemas, name, r))

    def _on_consumer_stats(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.consumerStats
        consumer = self.consumers.get(r.consumer_id)
        resp = pb.CommandConsumerStatsResponse(request_id=r.request_id)
        if consumer is None:
            resp.error_code = _wire_error(ServerError.ConsumerNotFound)
            resp.error_message = "Consumer not found"
        else:
            resp.consumerName = consumer.consumer_name
            resp.availablePermits = max(consumer.available_permits, 0)
            resp.unackedMessages = consumer.unacked_messages
            resp.blockedConsumerOnUnackedMsgs = consumer.blocked_on_unacked
            if not _non_persistent(consumer):
                resp.msgBacklog = consumer.subscription.cursor.number_of_entries_in_backlog
            resp.type = SubType(consumer.sub_type).name
        self.send_command(T(type=T.CONSUMER_STATS_RESPONSE, consumerStatsResponse=resp))

    # --- producers ---------------------------------------------------------------------------
    def _on_producer(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.producer
        request_id = r.request_id
        if r.producer_id in self.producers:
            existing = self.producers[r.producer_id]
            self._producer_success(request_id, existing, ready=existing.ready)
            return
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "produce")
            topic = self.service.get_any_topic(name, create=True)
            schema = self.service.schemas.for_producer(
                name, schema_commands.schema_tuple(r.schema) if r.HasField("schema") else None
            )
            producer_name = (
                r.producer_name if r.HasField("producer_name") and r.producer_name else None
            )
            if producer_name is None:
                producer_name = self.server.new_producer_name()
            producer = Producer(
                producer_id=r.producer_id,
                producer_name=producer_name,
                topic=topic,
                transport=self,
                user_provided_name=r.user_provided_producer_name,
                epoch=r.epoch,
                access_mode=access_mode_of(r.producer_access_mode),
                topic_epoch=r.topic_epoch if r.HasField("topic_epoch") else None,
                metadata={kv.key: kv.value for kv in r.metadata},
                schema_version=None if schema is None else version_bytes(schema.version),
            )
            admission = topic.add_producer(
                producer, functools.partial(self._producer_wait_done, request_id, producer)
            )
        except BrokerError as exc:
            self._error(request_id, exc.code, exc.message)
            return
        self.producers[r.producer_id] = producer
        if admission.queued:
            producer.ready = False
            self._producer_success(request_id, producer, ready=False)
            return
        ready = topic.ready
        if ready is not None and not ready.done():
            # The last sequence id is known only once deduplication state is recovered.
            self._spawn(self._producer_success_when_ready(ready, request_id, producer))
            return
        self._producer_success(request_id, producer)

    def _producer_wait_done(
        self, request_id: int, producer: Producer, _: int | None, error: BrokerError | None
    ) -> None:
        """A WaitForExclusive producer took the topic, or its wait ended with ``error``."""
        if self.closed or self.producers.get(producer.producer_id) is not producer:
            return
        if error is not None:
            del self.producers[producer.producer_id]
            self._error(request_id, error.code, error.message)
            return
        producer.ready = True
        self._producer_success(request_id, producer)

    async def _producer_success_when_ready(
        self, ready: asyncio.Future[None], request_id: int, producer: Producer
    ) -> None:
        try:
            await asyncio.shield(ready)
        except Exception as exc:
            self._error(request_id, ServerError.MetadataError, f"Topic not ready: {exc}")
            return
        self._producer_success(request_id, producer)

    def _producer_success(self, request_id: int, producer: Producer, *, ready: bool = True) -> None:
        success = pb.CommandProducerSuccess(
            request_id=request_id,
            producer_name=producer.producer_name,
            last_sequence_id=producer.topic.last_sequence_id(producer.producer_name),
            producer_ready=ready,
        )
        if producer.topic_epoch is not None:
            success.topic_epoch = producer.topic_epoch
        if producer.schema_version is not None:
            success.schema_version = producer.schema_version
        self.send_command(T(type=T.PRODUCER_SUCCESS, producer_success=success))

    def _on_send_frame(
        self, cmd: pb.BaseCommand, payload: bytes | None, checksum: int | None, checksum_ok: bool
    ) -> None:
        s = cmd.send
        producer = self.producers.get(s.producer_id)
        if producer is None:
            if s.producer_id in self._recently_closed_producers:
                # Written before the client saw our CLOSE_PRODUCER: it resends after
                # re-creating the producer (Pulsar's recentlyClosedProducers).
                return
            self._fail(f"SEND for unknown producer {s.producer_id}")
            return
        if not producer.ready:
            # As Pulsar: a producer still queued for exclusive access must not publish.
            self._fail(f"SEND for producer {s.producer_id} that is not ready")
            return
        if payload is None:
            self._fail("SEND without payload")
            return
        # Counted against the publish buffer and the connection's pending-send limit until
        # its topic has stored it or failed it (server/publish_buffer.py).
        size = len(payload)
        publishes = self._publishes
        publishes.started(size)
        self.service.rate_limits.on_publish(producer.topic.name, publishes, s.num_messages, size)
        self.publisher.on_send(
            producer, s, payload, checksum_ok, on_finished=lambda: publishes.finished(size)
        )

    def send_receipt(
        self, producer: Producer, sequence_id: int, highest_sequence_id: int, position: Position
    ) -> None:
        """Confirm a stored message to its producer."""
        if producer.closed:
            return
        self.write(
            encode_send_receipt(
                producer.producer_id,
                sequence_id,
                _u64(position.ledger_id),
                _u64(position.entry_id),
                highest_sequence_id,
            )
        )

    def send_error(
        self, producer: Producer, sequence_id: int, code: ServerError, message: str
    ) -> None:
        """Report a failed send to its producer (not to one the broker closed: its client
        resends what is pending once it has reconnected)."""
        if producer.closed:
            return
        self.send_command(
            T(
                type=T.SEND_ERROR,
                send_error=pb.CommandSendError(
                    producer_id=producer.producer_id,
                    sequence_id=sequence_id,
                    error=_wire_error(code),
                    message=message,
                ),
            )
        )

    def close_producer(self, producer: Producer) -> None:
        """Broker-initiated close: the client reconnects.

        SENDs already in flight for it are ignored for a keepalive interval, not taken as a
        protocol error that would close the connection and every producer and consumer on it.
        """
        pid = producer.producer_id
        self.producers.pop(pid, None)
        self.publisher.forget(pid)
        token = object()
        self._recently_closed_producers[pid] = token
        asyncio.get_running_loop().call_later(
            max(self.config.keepAliveIntervalSeconds, 1), self._forget_closed_producer, pid, token
        )
        self.send_command(
            T(
                type=T.CLOSE_PRODUCER,
                close_producer=pb.CommandCloseProducer(
                    producer_id=producer.producer_id, request_id=_U64 - 1
                ),
            )
        )

    def _forget_closed_producer(self, producer_id: int, token: object) -> None:
        if self._recently_closed_producers.get(producer_id) is token:
            del self._recently_closed_producers[producer_id]

    def _on_close_producer(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.close_producer
        producer = self.producers.pop(r.producer_id, None)
        self.publisher.forget(r.producer_id)
        if producer is not None:
            producer.topic.remove_producer(producer)
        self._success(r.request_id)

    # --- consumers ---------------------------------------------------------------------------
    def _on_subscribe(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.subscribe
        if not r.durable and r.start_message_rollback_duration_sec > 0:
            self._spawn(self._subscribe_rolled_back(r))
            return
        self._subscribe(r, None)

    async def _subscribe_rolled_back(self, r: pb.CommandSubscribe) -> None:
        """A reader starting ``start_message_rollback_duration_sec`` back: find where first."""
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "consume")
            topic = self.service.get_any_topic(name, create=r.force_topic_creation)
            since_ms = int(time.time() * 1000) - r.start_message_rollback_duration_sec * 1000
            rollback_to = (
                None
                if isinstance(topic, NonPersistentTopic)
                else await topic.find_position_by_time(since_ms)
            )
        except BrokerError as exc:
            self._error(r.request_id, exc.code, exc.message)
            return
        self._subscribe(r, rollback_to)

    def _subscribe(self, r: pb.CommandSubscribe, rollback_to: Position | None) -> None:
        request_id = r.request_id
        if r.consumer_id in self.consumers:
            # The client re-sent SUBSCRIBE (e.g. after a timeout): it already exists.
            self._success(request_id)
            return
        try:
            name = self.service.parse_topic(r.topic)
            self._authorize(name.full, "consume")
            if self.service.partitions_of(name) > 0:
                raise BrokerError(
                    ServerError.NotAllowedError, f"{name} is partitioned: subscribe to partitions"
                )
            topic = self.service.get_any_topic(name, create=r.force_topic_creation)
            if r.HasField("schema"):
                self.service.schemas.for_consumer(
                    name,
                    schema_commands.schema_tuple(r.schema),
                    idle=schema_commands.topic_is_idle(topic),
                )
            sub_type = SubType(r.subType)
            if r.read_compacted and sub_type not in (SubType.Exclusive, SubType.Failover):
                raise BrokerError(
                    ServerError.NotAllowedError,
                    "readCompacted only allowed on failover or exclusive subscriptions",
                )
            ksm = None
            if sub_type is SubType.Key_Shared:
                meta = r.keySharedMeta
                ksm = KeySharedMeta(
                    mode="STICKY" if meta.keySharedMode == pb.STICKY else "AUTO_SPLIT",
                    ranges=[(ir.start, ir.end) for ir in meta.hashRanges],
                    allow_out_of_order_delivery=meta.allowOutOfOrderDelivery,
                )
            start = None
            if r.HasField("start_message_id"):
                start = position_of(r.start_message_id)
                if start.ledger_id >= _INT64_MAX:
                    start = LATEST
                elif start.ledger_id < 0:
                    start = EARLIEST
            consumer_name = r.consumer_name
            durable = r.durable
            # Non-persistent consumers hold nothing unacked (Pulsar: maxUnackedMessages 0); the
            # subscription gives the others their maxUnackedMessagesPerConsumer.
            tracks = sub_type in (SubType.Shared, SubType.Key_Shared) and not isinstance(
                topic, NonPersistentTopic
            )

            def factory(sub: Any) -> Consumer:
                return Consumer(
                    consumer_id=r.consumer_id,
                    consumer_name=consumer_name,
                    subscription=sub,
                    sub_type=sub_type,
                    transport=self,
                    priority_level=r.priority_level,
                    metadata={kv.key: kv.value for kv in r.metadata},
                    key_shared_meta=ksm,
                    track_pending_acks=tracks,
                    read_compacted=r.read_compacted,
                )

            consumer = topic.subscribe(
                factory,
                subscription=r.subscription,
                sub_type=sub_type,
                durable=durable,
                initial_position_earliest=r.initialPosition == pb.CommandSubscribe.Earliest,
                start_message_id=start,
                rollback_to=rollback_to,
                **_replicated_state(r, topic),
            )
        except BrokerError as exc:
            self._error(request_id, exc.code, exc.message)
            return
        except ValueError as exc:
            self._error(request_id, ServerError.NotAllowedError, str(exc))
            return
        self.consumers[r.consumer_id] = consumer
        self._success(request_id)

    def _on_flow(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.flow
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            return
        if consumer.add_permits(r.messagePermits):
            disp = consumer.subscription.dispatcher
            if disp is not None:
                disp.consumer_flow(consumer, r.messagePermits)

    def _on_ack(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.ack
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            return
        items = [
            AckItem(position_of(mid), list(mid.ack_set) if len(mid.ack_set) else None)
            for mid in r.message_id
        ]
        consumer.subscription.acknowledge(consumer, r.ack_type == pb.CommandAck.Cumulative, items)
        if r.HasField("request_id"):
            self.send_command(
                T(
                    type=T.ACK_RESPONSE,
                    ackResponse=pb.CommandAckResponse(
                        consumer_id=r.consumer_id, request_id=r.request_id
                    ),
                )
            )

    def _on_redeliver(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.redeliverUnacknowledgedMessages
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            return
        positions = [position_of(mid) for mid in r.message_ids] if len(r.message_ids) else None
        consumer.subscription.redeliver_unacknowledged(consumer, positions)

    def _on_seek(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.seek
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            # Pulsar answers an unknown consumer id with MetadataError here (ServerCnx).
            self._error(r.request_id, ServerError.MetadataError, "Consumer not found")
            return
        self._spawn(self._seek(consumer, r))

    async def _seek(self, consumer: Consumer, r: pb.CommandSeek) -> None:
        if _non_persistent(consumer):
            # Pulsar's NonPersistentSubscription.resetCursor: nothing to move, success.
            self._success(r.request_id)
            return
        sub = consumer.subscription
        topic = sub.topic
        try:
            if r.HasField("message_id"):
                target = position_of(r.message_id)
                if target.ledger_id < 0:
                    target = topic.ledger.first_position or topic.ledger.next_position(
                        topic.ledger.last_add_confirmed
                    )
                elif target.ledger_id >= _INT64_MAX:
                    target = topic.ledger.next_position(topic.ledger.last_add_confirmed)
            elif r.HasField("message_publish_time"):
                target = await topic.find_position_by_time(r.message_publish_time)
            else:
                raise BrokerError(ServerError.NotAllowedError, "SEEK needs a message id or a time")
            sub.reset_cursor(target)
        except BrokerError as exc:
            self._error(r.request_id, exc.code, exc.message)
            return
        self._success(r.request_id)

    def _on_get_last_message_id(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.getLastMessageId
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            # Pulsar answers an unknown consumer id with MetadataError here (ServerCnx).
            self._error(r.request_id, ServerError.MetadataError, "Consumer not found")
            return
        self._spawn(self._get_last_message_id(consumer, r.request_id))

    async def _get_last_message_id(self, consumer: Consumer, request_id: int) -> None:
        if _non_persistent(consumer):
            self._error(
                request_id,
                ServerError.NotAllowedError,
                "GetLastMessageId is not supported on non-persistent topic",
            )
            return
        topic = consumer.subscription.topic
        try:
            compacted = None
            if consumer.read_compacted:
                compacted = await topic.compactor.last_message_id()
            last, batch_index = compacted or await topic.last_message_id()
        except Exception as exc:
            self._error(request_id, ServerError.PersistenceError, f"Read failed: {exc}")
            return
        partition = topic.name.partition_index
        mid = pb.MessageIdData(
            ledgerId=_u64(last.ledger_id), entryId=_u64(last.entry_id), partition=partition
        )
        if batch_index >= 0:
            mid.batch_index = batch_index
        mdp = consumer.subscription.cursor.mark_delete_position
        self.send_command(
            T(
                type=T.GET_LAST_MESSAGE_ID_RESPONSE,
                getLastMessageIdResponse=pb.CommandGetLastMessageIdResponse(
                    last_message_id=mid,
                    request_id=request_id,
                    consumer_mark_delete_position=pb.MessageIdData(
                        ledgerId=_u64(mdp.ledger_id), entryId=_u64(mdp.entry_id)
                    ),
                ),
            )
        )

    def _on_unsubscribe(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.unsubscribe
        consumer = self.consumers.get(r.consumer_id)
        if consumer is None:
            # Pulsar answers an unknown consumer id with MetadataError here (ServerCnx).
            self._error(r.request_id, ServerError.MetadataError, "Consumer not found")
            return
        sub = consumer.subscription
        try:
            sub.topic.unsubscribe(sub.name, consumer)
        except BrokerError as exc:
            self._error(r.request_id, exc.code, exc.message)
            return
        self.consumers.pop(r.consumer_id, None)
        self._success(r.request_id)

    def _on_close_consumer(self, cmd: pb.BaseCommand, _: Any) -> None:
        r = cmd.close_consumer
        consumer = self.consumers.pop(r.consumer_id, None)
        if consumer is not None:
            consumer.subscription.remove_consumer(consumer)
        self._success(r.request_id)

    # --- ConsumerTransport -------------------------------------------------------------------
    def send_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        """Write MESSAGE frames, all in one write."""
        if self.closed or self.transport is None:
            return
        cid = consumer.consumer_id
        partition = consumer.subscription.topic.name.partition_index
        # Header and stored payload go out as separate buffers: the payload is never copied.
        frames: list[bytes] = []
        append = frames.append
        for m in messages:
            entry = m.entry
            pos = entry.position
            data = entry.data
            append(
                encode_message_header(
                    cid,
                    _u64(pos.ledger_id),
                    _u64(pos.entry_id),
                    len(data),
                    entry.checksum,
                    redelivery_count=m.redelivery_count,
                    partition=partition,
                    ack_set=m.ack_set,
                )
            )
            append(data)
        self.write_many(frames)

    def close_consumer(self, consumer: Consumer) -> None:
        """Broker-initiated close: the client re-subscribes."""
        self.consumers.pop(consumer.consumer_id, None)
        self.send_command(
            T(
                type=T.CLOSE_CONSUMER,
                close_consumer=pb.CommandCloseConsumer(
                    consumer_id=consumer.consumer_id, request_id=_U64 - 1
                ),
            )
        )

    def active_consumer_change(self, consumer: Consumer, is_active: bool) -> None:
        """Tell a Failover consumer whether it is active."""
        self.send_command(
            T(
                type=T.ACTIVE_CONSUMER_CHANGE,
                active_consumer_change=pb.CommandActiveConsumerChange(
                    consumer_id=consumer.consumer_id, is_active=is_active
                ),
            )
        )

    def is_writable(self) -> bool:
        """False while our write buffer is above the high-water mark."""
        return self.writable and not self.closed

    @property
    def address(self) -> str:
        """The client's address."""
        return self._address

    @property
    def client_version(self) -> str:
        """The client's version string from CONNECT."""
        return self._client_version


def _replicated_state(r: pb.CommandSubscribe, topic: Any) -> dict[str, bool]:
    """``replicate_subscription_state`` for a persistent topic's durable subscription."""
    if isinstance(topic, NonPersistentTopic) or not (r.durable and r.replicate_subscription_state):
        return {}
    return {"replicate_subscription_state": True}
