"""What every part of a client connection shares: its state, its output, its errors.

:class:`ConnectionCore` is the base of :class:`keyshared.server.connection.ServerConnection`;
the commands are handled by the mix-ins built on it (``producer_commands``,
``consumer_commands``, ``lookup_commands``) and the protocol callbacks in ``connection``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, cast

from keyshared.broker.consumer import Consumer
from keyshared.broker.errors import ServerError
from keyshared.broker.nonpersistent_topic import NON_PERSISTENT
from keyshared.broker.topic import Producer
from keyshared.protocol import FrameDecoder, encode_command, pb
from keyshared.protocol.constants import PROTOCOL_VERSION
from keyshared.server.auth_refresh import AuthRefresh
from keyshared.server.keepalive import KeepAlive
from keyshared.server.publish import Publisher
from keyshared.server.publish_buffer import ConnectionPublishes
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.server.listener import BrokerServer

# The name it had before the connection was split into modules, for operators' log filters.
log = logging.getLogger("keyshared.server.connection")

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


class ConnectionCore(asyncio.Protocol):
    """Pulsar's ServerCnx for one TCP (or TLS) connection: state and output."""

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
        # Set by ServerConnection, which has the interfaces these need (ProducerTransport,
        # KeptAlive, Readable).
        self.publisher: Publisher
        self.consumers: dict[int, Consumer] = {}
        self.last_received = time.monotonic()
        self._out: list[bytes] = []
        self._keepalive: KeepAlive
        self._ip = ""
        self._auth_refresh: AuthRefresh | None = None
        self._auth_handle: asyncio.TimerHandle | None = None
        self._protocol_version = PROTOCOL_VERSION
        self._tasks: set[asyncio.Task[Any]] = set()
        # Producer ids the broker closed lately, each with the token of its latest close.
        self._recently_closed_producers: dict[int, object] = {}
        # Sends in flight, for the publish buffer and pending-send limits (publish_buffer.py).
        self._publishes: ConnectionPublishes
        self._reading = True

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

    # --- discovery ---------------------------------------------------------------------------
    def _authorize(self, topic_name: str, action: str) -> None:
        authz = self.server.authorizer
        if authz is not None:
            authz.check(self.principal, topic_name, action)

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
