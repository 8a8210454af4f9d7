"""Compact binary encodings of cursor state: bulk unsigned varints and the cursor snapshot.

Varints are LEB128 as in protobuf: 7 bits a byte, least significant group first, the high bit
set on every byte but the last. Bulk encoding and decoding go through a packed ``repeated
uint64`` protobuf field, so the per-value work runs in upb's C code: a million values take a
few tens of milliseconds instead of the better part of a second in a Python loop. The bytes we
store are the bare varints, not a protobuf message, so the format owes protobuf nothing.

The snapshot format (version 1)::

    u8      version (1)
    varint  zigzag(mark_delete.ledger_id), zigzag(mark_delete.entry_id)
    varint  length of the range-set blob, then the blob (``RangeSet.to_bytes``)
    varint  length of the batch block, then the block: bare varints
            [count, then per entry: zigzag(ledger), zigzag(entry), word count, words as u64]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from keyshared.storage.position import Position

SNAPSHOT_VERSION = 1
_U64 = (1 << 64) - 1


class CursorCodecError(ValueError):
    """Stored cursor state could not be decoded."""


def _varint_message_class() -> Any:
    # A private descriptor pool, so our message can never clash with the protocol's.
    fdp = descriptor_pb2.FileDescriptorProto(
        name="keyshared_varints.proto", package="keyshared.varints", syntax="proto3"
    )
    msg = fdp.message_type.add(name="Varints")
    msg.field.add(
        name="v",
        number=1,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("keyshared.varints.Varints"))


_Varints = _varint_message_class()


def write_uvarint(out: bytearray, value: int) -> None:
    """Append one unsigned varint to ``out``."""
    if value < 0:
        raise ValueError(f"negative varint {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_uvarint(data: bytes | memoryview, offset: int) -> tuple[int, int]:
    """One unsigned varint at ``offset``: ``(value, offset after it)``."""
    value = 0
    shift = 0
    n = len(data)
    while True:
        if offset >= n:
            raise CursorCodecError("truncated varint")
        b = data[offset]
        offset += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, offset
        shift += 7
        if shift > 63:
            raise CursorCodecError("varint too long")


def zigzag(value: int) -> int:
    """Map a signed int64 to an unsigned one, small magnitudes to small numbers."""
    return (value << 1) ^ (value >> 63)


def unzigzag(value: int) -> int:
    """Inverse of :func:`zigzag`."""
    return (value >> 1) ^ -(value & 1)


def encode_uvarints(values: Iterable[int]) -> bytes:
    """Concatenated varints of ``values`` (each in ``[0, 2**64)``), encoded in C."""
    msg = _Varints()
    msg.v.extend(values)
    raw: bytes = msg.SerializeToString()
    if not raw:
        return b""
    # Drop the field tag (one byte) and the payload length that protobuf puts first.
    _, start = read_uvarint(raw, 1)
    return raw[start:]


def decode_uvarints(data: bytes | memoryview) -> list[int]:
    """The values of concatenated varints (inverse of :func:`encode_uvarints`)."""
    if not data:
        return []
    head = bytearray(b"\x0a")
    write_uvarint(head, len(data))
    head += data
    msg = _Varints()
    try:
        msg.ParseFromString(bytes(head))
    except Exception as exc:  # protobuf raises its own DecodeError
        raise CursorCodecError(f"corrupt varint block: {exc}") from exc
    return list(msg.v)


@dataclass(slots=True)
class CursorSnapshot:
    """What a durable cursor stores: its mark-delete position and (part of) its ack state.

    ``ranges`` is an opaque ``RangeSet.to_bytes`` blob; ``batch_indexes`` holds, for
    partially acked batch entries, the still-unacked bitset as signed int64 words.
    """

    mark_delete: Position
    ranges: bytes = b""
    batch_indexes: list[tuple[Position, list[int]]] = field(default_factory=list)


def encode_snapshot(snapshot: CursorSnapshot) -> bytes:
    """The stored form of ``snapshot`` (see the module docstring)."""
    out = bytearray((SNAPSHOT_VERSION,))
    mdp = snapshot.mark_delete
    write_uvarint(out, zigzag(mdp.ledger_id))
    write_uvarint(out, zigzag(mdp.entry_id))
    write_uvarint(out, len(snapshot.ranges))
    out += snapshot.ranges
    block = encode_uvarints(_batch_values(snapshot.batch_indexes))
    write_uvarint(out, len(block))
    out += block
    return bytes(out)


def _batch_values(items: Sequence[tuple[Position, list[int]]]) -> list[int]:
    values = [len(items)]
    for pos, words in items:
        values.append(zigzag(pos.ledger_id))
        values.append(zigzag(pos.entry_id))
        values.append(len(words))
        values.extend(w & _U64 for w in words)
    return values


def decode_snapshot(data: bytes) -> CursorSnapshot:
    """Inverse of :func:`encode_snapshot`; raises :class:`CursorCodecError` if corrupt."""
    if not data:
        raise CursorCodecError("empty cursor state")
    if data[0] != SNAPSHOT_VERSION:
        raise CursorCodecError(f"unknown cursor state version {data[0]}")
    view = memoryview(data)
    ledger, off = read_uvarint(view, 1)
    entry, off = read_uvarint(view, off)
    mdp = Position(unzigzag(ledger), unzigzag(entry))
    n, off = read_uvarint(view, off)
    if off + n > len(data):
        raise CursorCodecError("truncated range set")
    ranges = bytes(view[off : off + n])
    off += n
    n, off = read_uvarint(view, off)
    if off + n != len(data):
        raise CursorCodecError("batch block length does not match the data")
    values = decode_uvarints(view[off : off + n])
    return CursorSnapshot(mdp, ranges, _batch_items(values))


def _batch_items(values: list[int]) -> list[tuple[Position, list[int]]]:
    if not values:
        return []
    items: list[tuple[Position, list[int]]] = []
    count = values[0]
    i = 1
    try:
        for _ in range(count):
            pos = Position(unzigzag(values[i]), unzigzag(values[i + 1]))
            nwords = values[i + 2]
            i += 3
            words = [w - (1 << 64) if w >> 63 else w for w in values[i : i + nwords]]
            if len(words) != nwords:
                raise CursorCodecError("truncated batch bitset")
            i += nwords
            items.append((pos, words))
    except IndexError as exc:
        raise CursorCodecError("truncated batch block") from exc
    if i != len(values):
        raise CursorCodecError("trailing data in batch block")
    return items
