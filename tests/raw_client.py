"""A raw-socket Pulsar client for tests that must send bad bytes to a live broker.

It speaks the wire protocol through :mod:`keyshared.protocol.commands` and decodes what the broker
answers with a :class:`keyshared.protocol.FrameDecoder`, so a test can send anything (a wrong CRC,
half a frame, garbage) and then assert exactly what came back: which frames, and whether the broker
closed the connection.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from keyshared.protocol import Frame, FrameDecoder, ProtocolError, commands, pb

_T = pb.BaseCommand

# The broker may send big MESSAGE frames; we only read what it sends, so no real limit here.
_CLIENT_FRAME_LIMIT = 256 * 1024 * 1024


class ConnectionClosed(Exception):
    """The broker closed (or reset) the connection."""


def metadata(
    *, producer_name: str, sequence_id: int, publish_time: int | None = None
) -> pb.MessageMetadata:
    """The MessageMetadata of one non-batched message, with its required fields."""
    return pb.MessageMetadata(
        producer_name=producer_name,
        sequence_id=sequence_id,
        publish_time=publish_time if publish_time is not None else int(time.time() * 1000),
    )


def frame_with_size(body: bytes, total_size: int | None = None) -> bytes:
    """``totalSize`` + ``body``: a frame header announcing ``total_size`` (default: the truth)."""
    return struct.pack(">I", len(body) if total_size is None else total_size) + body


def raw_command(command_bytes: bytes) -> bytes:
    """A simple frame around already-serialized BaseCommand bytes (which may be anything)."""
    return struct.pack(">II", len(command_bytes) + 4, len(command_bytes)) + command_bytes


@dataclass
class RawClient:
    """One TCP connection to a broker, driven frame by frame."""

    host: str
    port: int
    timeout: float = 5.0
    # The local address to connect from (another loopback address, for per-IP limits).
    source_ip: str | None = None
    sock: socket.socket = field(init=False)
    decoder: FrameDecoder = field(init=False)
    received: list[Frame] = field(init=False, default_factory=list)
    closed_by_peer: bool = field(init=False, default=False)
    _request_id: int = field(init=False, default=0)
    _next_id: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        source = (self.source_ip, 0) if self.source_ip is not None else None
        self.sock = socket.create_connection(
            (self.host, self.port), timeout=self.timeout, source_address=source
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.decoder = FrameDecoder(_CLIENT_FRAME_LIMIT)

    @classmethod
    def to(cls, service_url: str, timeout: float = 5.0) -> RawClient:
        """Connect to ``pulsar://host:port``."""
        host, _, port = service_url.removeprefix("pulsar://").rpartition(":")
        return cls(host, int(port), timeout)

    # --- ids ----------------------------------------------------------------------------------
    def request_id(self) -> int:
        """A fresh request id."""
        self._request_id += 1
        return self._request_id

    def new_id(self) -> int:
        """A fresh producer/consumer id."""
        self._next_id += 1
        return self._next_id

    # --- bytes ------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        """Write ``data``; raises :class:`ConnectionClosed` if the broker has closed on us."""
        try:
            self.sock.sendall(data)
        except OSError as exc:
            self.closed_by_peer = True
            raise ConnectionClosed(str(exc)) from exc

    def _fill(self, deadline: float) -> bool:
        """Read once into the decoder; False on timeout. Raises ConnectionClosed on EOF/reset."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(1 << 16)
        except TimeoutError:
            return False
        except OSError as exc:
            self.closed_by_peer = True
            raise ConnectionClosed(str(exc)) from exc
        if not data:
            self.closed_by_peer = True
            raise ConnectionClosed("EOF")
        self.decoder.feed(data)
        return True

    def frames(self, timeout: float | None = None) -> Iterator[Frame]:
        """Every frame the broker sends within ``timeout``, answering its PINGs."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            while (frame := self.decoder.next_frame()) is not None:
                self.received.append(frame)
                if frame.type == _T.PING:
                    self.send(commands.pong())
                    continue
                yield frame
            if not self._fill(deadline):
                return

    def recv(self, timeout: float | None = None) -> Frame:
        """The next frame (not a PING); AssertionError on timeout, ConnectionClosed on close."""
        for frame in self.frames(timeout):
            return frame
        raise AssertionError(f"no frame from the broker within {timeout or self.timeout}s")

    def expect(self, ctype: int, timeout: float | None = None) -> pb.BaseCommand:
        """The next command, which must be of type ``ctype``."""
        frame = self.recv(timeout)
        assert frame.type == ctype, (
            f"expected {_T.Type.Name(ctype)}, got {_T.Type.Name(frame.type)}: {frame.command}"
        )
        return frame.command

    def wait_closed(self, timeout: float = 5.0) -> list[Frame]:
        """Wait for the broker to close the connection; returns the frames it sent meanwhile.

        Raises AssertionError if the connection is still open after ``timeout``.
        """
        got: list[Frame] = []
        try:
            got.extend(self.frames(timeout))
        except ConnectionClosed:
            return got
        except ProtocolError as exc:  # pragma: no cover - the broker sent bad bytes
            raise AssertionError(f"broker sent an undecodable frame: {exc}") from exc
        raise AssertionError(f"connection still open after {timeout}s; received {got}")

    def wait_closed_silently(self, timeout: float = 5.0) -> None:
        """Wait for the broker to close the connection while we answer nothing, not even PINGs:
        a client that has gone quiet. AssertionError if it is still open after ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            while self._fill(deadline):
                pass
        except ConnectionClosed:
            return
        raise AssertionError(f"connection still open after {timeout}s of silence")

    def ping_pong(self, timeout: float | None = None) -> list[Frame]:
        """Send PING and wait for PONG: proves the connection is alive and everything sent before
        was handled. Returns the other frames that arrived before the PONG."""
        self.send(commands.ping())
        before: list[Frame] = []
        for frame in self.frames(timeout):
            if frame.type == _T.PONG:
                return before
            before.append(frame)
        raise AssertionError(f"no PONG within {timeout or self.timeout}s; received {before}")

    # --- protocol steps ----------------------------------------------------------------------
    def handshake(self) -> pb.CommandConnected:
        """CONNECT and wait for CONNECTED."""
        self.send(commands.connect())
        return self.expect(_T.CONNECTED).connected

    def create_producer(self, topic: str, producer_name: str | None = None) -> tuple[int, str]:
        """PRODUCER and wait for PRODUCER_SUCCESS; returns (producer id, producer name)."""
        producer_id = self.new_id()
        rid = self.request_id()
        self.send(
            commands.producer(
                topic=topic, producer_id=producer_id, request_id=rid, producer_name=producer_name
            )
        )
        ok = self.expect(_T.PRODUCER_SUCCESS).producer_success
        assert ok.request_id == rid
        return producer_id, ok.producer_name

    def subscribe(
        self,
        topic: str,
        subscription: str,
        sub_type: int = pb.CommandSubscribe.Shared,
        *,
        earliest: bool = True,
        priority_level: int = 0,
    ) -> int:
        """SUBSCRIBE and wait for SUCCESS; returns the consumer id."""
        consumer_id = self.new_id()
        rid = self.request_id()
        self.send(
            commands.subscribe(
                topic=topic,
                subscription=subscription,
                sub_type=sub_type,
                consumer_id=consumer_id,
                request_id=rid,
                initial_position=pb.CommandSubscribe.Earliest
                if earliest
                else pb.CommandSubscribe.Latest,
                priority_level=priority_level,
            )
        )
        ok = self.expect(_T.SUCCESS).success
        assert ok.request_id == rid
        return consumer_id

    def send_frame(
        self,
        producer_id: int,
        producer_name: str,
        sequence_id: int,
        payload: bytes,
        *,
        checksum: int | None = None,
    ) -> bytes:
        """The bytes of a SEND of one message (``checksum`` overrides the CRC32C)."""
        return commands.send(
            producer_id=producer_id,
            sequence_id=sequence_id,
            metadata=metadata(producer_name=producer_name, sequence_id=sequence_id),
            payload=payload,
            checksum=checksum,
        )

    def publish(
        self, producer_id: int, producer_name: str, sequence_id: int, payload: bytes
    ) -> pb.CommandSendReceipt:
        """SEND one message and wait for its SEND_RECEIPT."""
        self.send(self.send_frame(producer_id, producer_name, sequence_id, payload))
        receipt = self.expect(_T.SEND_RECEIPT).send_receipt
        assert receipt.producer_id == producer_id
        assert receipt.sequence_id == sequence_id
        return receipt

    # --- endings -------------------------------------------------------------------------------
    def half_close(self) -> None:
        """Shut our sending side (the broker sees EOF)."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def abort(self) -> None:
        """Vanish: close with an RST instead of a FIN, as a crashed client's kernel does."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        """Close normally."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
