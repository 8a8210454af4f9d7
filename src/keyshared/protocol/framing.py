"""Incremental frame decoder: feed it bytes as they arrive, take complete frames out.

Wire layout (all header integers big-endian)::

    totalSize:4  cmdSize:4  BaseCommand:cmdSize
    [ 0x0E02 brokerEntryMetadataSize:4 BrokerEntryMetadata ]   optional, broker to client only
    [ 0x0E01 crc32c:4 ]                                         optional
    metadataSize:4  MessageMetadata  payload                    payload commands only

``totalSize`` counts every byte after itself. A frame is a payload command when ``totalSize``
exceeds ``4 + cmdSize``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from google.protobuf.message import DecodeError

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import Bytes, crc32c
from keyshared.protocol.constants import MAGIC_BROKER_ENTRY_METADATA, MAGIC_CRC32C
from keyshared.protocol.errors import FrameTooLarge, MalformedFrame, ProtocolError
from keyshared.protocol.validate import has_string_fields, invalid_string_field

_U32 = struct.Struct(">I")
_MAGIC_U32 = struct.Struct(">HI")

# Compacting the buffer costs a memmove of what is left; doing it only once the consumed prefix
# is large keeps the cost linear in the bytes received.
_COMPACT_AT = 64 * 1024

_BaseCommand = pb.BaseCommand
_SEND = pb.BaseCommand.SEND
# NamedTuple construction without its generated __new__ (one SendFrame per SEND).
_new_tuple = tuple.__new__
_FIELD_BY_TYPE: dict[int, str] = {
    value.number: _BaseCommand.DESCRIPTOR.fields_by_number[value.number].name
    for value in _BaseCommand.DESCRIPTOR.enum_types_by_name["Type"].values
}
# PING and PONG carry an empty sub-message that a peer may leave out entirely.
_SUB_MESSAGE_OPTIONAL = frozenset({pb.BaseCommand.PING, pb.BaseCommand.PONG})
# Commands that are meaningless without a payload section.
_PAYLOAD_REQUIRED = frozenset({pb.BaseCommand.SEND, pb.BaseCommand.MESSAGE})
# Commands whose sub-message can carry strings, to be checked for valid UTF-8.
_HAS_STRINGS = frozenset(
    ctype for ctype, name in _FIELD_BY_TYPE.items() if has_string_fields(_BaseCommand(), name)
)


@dataclass(slots=True)
class Frame:
    """One decoded frame.

    ``payload`` is set for payload commands (SEND, MESSAGE): the bytes after the optional
    broker-entry-metadata and magic+checksum, i.e. metadataSize + MessageMetadata + payload,
    exactly the bytes the sender checksummed. ``checksum`` is the CRC32C found on the wire (None
    if the frame had none) and ``checksum_ok`` whether it matched; a frame without a checksum is
    ``checksum_ok``.

    The command has its required fields, its type's sub-message, and valid UTF-8 in that
    sub-message's strings. Other sub-messages a peer may have added are not checked; read only
    the one its type names.
    """

    command: pb.BaseCommand
    payload: bytes | None = None
    checksum: int | None = None
    checksum_ok: bool = True

    @property
    def type(self) -> int:
        """The command type (a ``pb.BaseCommand.Type`` value)."""
        return self.command.type


class SendFrame(NamedTuple):
    """A SEND, as :meth:`FrameDecoder.next_frame_or_send` gives it: the command's fields the
    broker reads, then ``payload``, ``checksum`` and ``checksum_ok`` as in :class:`Frame`."""

    producer_id: int
    sequence_id: int
    num_messages: int
    highest_sequence_id: int | None
    """None when the SEND does not carry it."""
    payload: bytes
    checksum: int | None
    checksum_ok: bool


class FrameDecoder:
    """Sans-IO decoder of a byte stream into :class:`Frame` objects.

    Call :meth:`feed` with whatever arrived, then :meth:`next_frame` until it returns None (or
    iterate the decoder). A frame whose header announces more than ``max_frame_size`` bytes raises
    :class:`FrameTooLarge` as soon as its 4-byte header is buffered, before the body is; other
    bad input raises :class:`MalformedFrame`. After either error the decoder is unusable: every
    later call raises the same error, and the connection should be closed. A wrong CRC32C is not
    an error here: the frame comes back with ``checksum_ok=False`` so the server can answer
    SEND_ERROR ChecksumError and keep the connection, as Pulsar does.
    """

    __slots__ = ("_buf", "_error", "_frame_len", "_pos", "max_frame_size")

    def __init__(self, max_frame_size: int) -> None:
        if max_frame_size < 8:
            raise ValueError("max_frame_size must leave room for a command")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        # totalSize of the frame at _pos once its header was read, else -1; cached so that a big
        # frame arriving in many small chunks costs O(chunk) per feed.
        self._frame_len = -1
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buf) - self._pos

    def feed(self, data: Bytes) -> None:
        """Append received bytes. Raises :class:`FrameTooLarge` early for an oversized header."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        if pos:
            if pos == len(buf):
                buf.clear()
                self._pos = 0
            elif pos >= _COMPACT_AT:
                del buf[:pos]
                self._pos = 0
        buf += data
        if self._frame_len < 0 and len(buf) - self._pos >= 4:
            self._read_header()

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None if more bytes are needed."""
        frame = self._next(False)
        assert not isinstance(frame, SendFrame)
        return frame

    def next_frame_or_send(self) -> Frame | SendFrame | None:
        """As :meth:`next_frame`, but a SEND comes back as a :class:`SendFrame`.

        For the broker, which reads only a few fields of each SEND: they are read once, here,
        and the ``BaseCommand`` is dropped (the frame is checked as by :meth:`next_frame`).
        """
        return self._next(True)

    def _next(self, sends: bool) -> Frame | SendFrame | None:
        if self._error is not None:
            raise self._error
        frame_len = self._frame_len
        if frame_len < 0:
            if len(self._buf) - self._pos < 4:
                return None
            frame_len = self._read_header()
        start = self._pos + 4
        end = start + frame_len
        if len(self._buf) < end:
            return None
        self._pos = end
        self._frame_len = -1
        try:
            return self._decode(start, end, sends)
        except ProtocolError as exc:
            self._error = exc
            raise

    def __iter__(self) -> Iterator[Frame]:
        """Yield every complete frame buffered so far."""
        while (frame := self.next_frame()) is not None:
            yield frame

    def _read_header(self) -> int:
        frame_len: int = _U32.unpack_from(self._buf, self._pos)[0]
        if frame_len > self.max_frame_size:
            self._error = FrameTooLarge(
                f"frame of {frame_len} bytes exceeds the limit of {self.max_frame_size}"
            )
            raise self._error
        if frame_len < 4:
            self._error = MalformedFrame(f"frame size {frame_len} leaves no room for cmdSize")
            raise self._error
        self._frame_len = frame_len
        return frame_len

    def _decode(self, start: int, end: int, sends: bool) -> Frame | SendFrame:
        buf = self._buf
        (cmd_size,) = _U32.unpack_from(buf, start)
        cmd_start = start + 4
        cmd_end = cmd_start + cmd_size
        if cmd_end > end:
            raise MalformedFrame(
                f"command size {cmd_size} exceeds the frame's {end - cmd_start} remaining bytes"
            )
        fields: tuple[int, int, int, int | None] | None = None
        if sends:
            fields = _plain_send(buf, cmd_start, cmd_end)
            if fields is not None:
                # The same checks and values as below: a SEND needs a payload.
                if cmd_end == end:
                    raise MalformedFrame("SEND without a payload")
                payload, checksum, checksum_ok = _payload_section(buf, cmd_end, end)
                return _new_tuple(SendFrame, (*fields, payload, checksum, checksum_ok))
        command = _BaseCommand()
        # Temporary memoryview slices die right after use, so the bytearray is never left with a
        # live export (which would make the next resize raise BufferError).
        with memoryview(buf) as view:
            try:
                # upb parses any buffer; the stub only admits bytes.
                command.ParseFromString(view[cmd_start:cmd_end])  # type: ignore[arg-type]
            except DecodeError as exc:
                raise MalformedFrame(f"unparseable command: {exc}") from None
            _check_command(command, buf, cmd_start, cmd_end)
            if sends and command.type == _SEND:
                send = command.send
                fields = (
                    send.producer_id,
                    send.sequence_id,
                    send.num_messages,
                    send.highest_sequence_id if send.HasField("highest_sequence_id") else None,
                )
            if cmd_end == end:
                if command.type in _PAYLOAD_REQUIRED:
                    raise MalformedFrame(f"{_type_name(command.type)} without a payload")
                return Frame(command)
        payload, checksum, checksum_ok = _payload_section(buf, cmd_end, end)
        if fields is not None:
            return _new_tuple(SendFrame, (*fields, payload, checksum, checksum_ok))
        return Frame(command, payload, checksum, checksum_ok)


# Payloads from this size are copied out through a memoryview (one copy), smaller ones by
# slicing the buffer (see _payload_section).
_VIEW_COPY_AT = 4096


def _payload_section(buf: bytearray, pos: int, end: int) -> tuple[bytes, int | None, bool]:
    """What follows a command that has a payload: a broker entry metadata section, skipped; the
    checksum, verified; the payload, copied out. Returns (payload, checksum, checksum_ok)."""
    if end - pos >= 2 and (buf[pos] << 8 | buf[pos + 1]) == MAGIC_BROKER_ENTRY_METADATA:
        if end - pos < 6:
            raise MalformedFrame("truncated broker entry metadata header")
        (_, bem_size) = _MAGIC_U32.unpack_from(buf, pos)
        pos += 6 + bem_size
        if pos > end:
            raise MalformedFrame("broker entry metadata runs past the end of the frame")
    checksum: int | None = None
    if end - pos >= 2 and (buf[pos] << 8 | buf[pos + 1]) == MAGIC_CRC32C:
        if end - pos < 6:
            raise MalformedFrame("truncated checksum")
        (_, checksum) = _MAGIC_U32.unpack_from(buf, pos)
        pos += 6
    # Copied by slicing the bytearray (a temporary bytearray, then bytes: two copies, but half
    # the instructions of making and slicing a memoryview, which only pays for itself on larger
    # payloads), and checksummed from the copy.
    if end - pos < _VIEW_COPY_AT:
        payload = bytes(buf[pos:end])
    else:
        # Released before returning, so the bytearray can be resized again.
        with memoryview(buf) as view:
            payload = bytes(view[pos:end])
    return payload, checksum, checksum is None or crc32c(payload) == checksum


_U64_LIMIT = 1 << 64
_I32_LIMIT = 1 << 31


def _plain_send(buf: bytearray, start: int, end: int) -> tuple[int, int, int, int | None] | None:
    """The fields of a SEND command in its common shape, read straight from the bytes.

    Every SEND passes here, so the usual one is read without building a ``BaseCommand`` (the
    upb parse, the required-field check and the field reads were a fifth of the loop's time per
    unbatched message). The shape: ``BaseCommand`` holding only ``type = SEND`` then ``send``
    (field 6, under 128 bytes), whose fields are only ``producer_id``, ``sequence_id``,
    ``num_messages`` and ``highest_sequence_id``, with both required ones present, each a
    plain varint in range. Anything else (other fields, a transaction, a chunk, a marker, a
    message id, odd encodings) returns None, and the full parse decides, so what is accepted
    and what is refused is exactly as before; a field given twice takes the last value, as
    protobuf does.
    """
    # 0x08 0x06: field 1 (type) = 6 (SEND); 0x32: field 6 (send), length-delimited.
    if end - start < 8 or buf[start] != 0x08 or buf[start + 1] != 0x06 or buf[start + 2] != 0x32:
        return None
    size = buf[start + 3]
    if size & 0x80 or start + 4 + size != end:
        return None
    pos = start + 4
    producer_id: int | None = None
    sequence_id: int | None = None
    highest: int | None = None
    num_messages = 1
    while pos < end:
        if pos + 1 >= end:
            return None
        tag = buf[pos]
        value = buf[pos + 1]
        pos += 2
        if value & 0x80:
            value &= 0x7F
            shift = 7
            while True:
                if pos >= end or shift > 63:
                    return None
                byte = buf[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                if not byte & 0x80:
                    break
                shift += 7
            if value >= _U64_LIMIT:
                return None
        if tag == 0x08:
            producer_id = value
        elif tag == 0x10:
            sequence_id = value
        elif tag == 0x18:
            if value >= _I32_LIMIT:  # a negative int32: let protobuf say what it is
                return None
            num_messages = value
        elif tag == 0x30:
            highest = value
        else:
            return None
    if producer_id is None or sequence_id is None:
        return None
    return (producer_id, sequence_id, num_messages, highest)


def _check_command(command: pb.BaseCommand, buf: bytearray, start: int, end: int) -> None:
    if not command.IsInitialized():
        missing: list[str] = command.FindInitializationErrors()  # type: ignore[attr-defined]
        if "type" in missing:
            raw = _peek_type(buf, start, end)
            if raw is None:
                raise MalformedFrame("command has no type")
            raise MalformedFrame(f"unknown command type {raw}")
        raise MalformedFrame(
            f"{_type_name(command.type)} is missing required fields: {', '.join(missing)}"
        )
    ctype = command.type
    field = _FIELD_BY_TYPE[ctype]
    if ctype not in _SUB_MESSAGE_OPTIONAL and not command.HasField(field):
        raise MalformedFrame(f"{_type_name(ctype)} without its {field} field")
    if ctype in _HAS_STRINGS:
        bad = invalid_string_field(getattr(command, field))
        if bad is not None:
            raise MalformedFrame(f"{_type_name(ctype)} field {bad} is not valid UTF-8")


def _peek_type(buf: bytearray, start: int, end: int) -> int | None:
    """The raw varint of field 1 if the command starts with it (for error messages only)."""
    if start >= end or buf[start] != 0x08:
        return None
    value = shift = 0
    for pos in range(start + 1, min(end, start + 11)):
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
    return None


def _type_name(ctype: int) -> str:
    try:
        return pb.BaseCommand.Type.Name(ctype)
    except ValueError:
        return f"command type {ctype}"
