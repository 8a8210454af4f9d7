"""Server side of one connection as a sans-IO state machine: bytes in, frames out.

The only rule enforced here is the handshake: the first command must be CONNECT, and CONNECT
comes only once. Everything else (auth, PING/PONG, producers, consumers) is the server's job.
"""

from __future__ import annotations

import enum

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import Bytes
from keyshared.protocol.constants import DEFAULT_MAX_MESSAGE_SIZE, PROTOCOL_VERSION, max_frame_size
from keyshared.protocol.errors import ProtocolError, ProtocolViolation
from keyshared.protocol.framing import Frame, FrameDecoder


class ConnectionState(enum.Enum):
    """Where a server connection is in its life."""

    AWAITING_CONNECT = "awaiting_connect"
    CONNECTED = "connected"
    CLOSED = "closed"


class ServerProtocol:
    """Decodes a client's byte stream and checks the CONNECT handshake.

    ``receive_data`` returns the complete frames in ``data``; on any :class:`ProtocolError`
    (oversized or malformed frame, a command before CONNECT, a second CONNECT) the state becomes
    CLOSED and the error propagates: the server should answer if it can and close the socket.
    """

    __slots__ = ("_decoder", "client_protocol_version", "max_message_size", "state")

    def __init__(self, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        self.max_message_size = max_message_size
        self.state = ConnectionState.AWAITING_CONNECT
        self.client_protocol_version = 0
        """The protocol_version the client sent in CONNECT (0 until then)."""
        self._decoder = FrameDecoder(max_frame_size(max_message_size))

    @property
    def max_frame_size(self) -> int:
        """Largest accepted frame: ``max_message_size`` + 10 KiB padding, as Pulsar allows."""
        return self._decoder.max_frame_size

    @property
    def protocol_version(self) -> int:
        """Version to answer in CONNECTED: the lower of the client's and ours."""
        return min(self.client_protocol_version, PROTOCOL_VERSION)

    def receive_data(self, data: Bytes) -> list[Frame]:
        """Feed received bytes; return the frames they completed, in order."""
        if self.state is ConnectionState.CLOSED:
            return []
        try:
            self._decoder.feed(data)
            frames = list(self._decoder)
            for frame in frames:
                self._check(frame)
        except ProtocolError:
            self.state = ConnectionState.CLOSED
            raise
        return frames

    def close(self) -> None:
        """Mark the connection closed; later data is ignored."""
        self.state = ConnectionState.CLOSED

    def _check(self, frame: Frame) -> None:
        is_connect = frame.command.type == pb.BaseCommand.CONNECT
        if self.state is ConnectionState.AWAITING_CONNECT:
            if not is_connect:
                raise ProtocolViolation(
                    f"expected CONNECT first, got {pb.BaseCommand.Type.Name(frame.command.type)}"
                )
            self.client_protocol_version = frame.command.connect.protocol_version
            self.state = ConnectionState.CONNECTED
        elif is_connect:
            raise ProtocolViolation("CONNECT received twice on one connection")
