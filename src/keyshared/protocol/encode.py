"""Frame encoders: a protobuf command in, the bytes to write out.

:func:`encode_command` and :func:`encode_payload_command` frame any ``BaseCommand``. The two
commands the broker sends per message, MESSAGE and SEND_RECEIPT, are encoded by hand in
:func:`encode_message` / :func:`encode_message_header` and :func:`encode_send_receipt`: they build
the protobuf bytes directly instead of creating message objects, and unit tests check them against
the protobuf encoding.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from functools import lru_cache

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import Bytes, crc32c
from keyshared.protocol.constants import MAGIC_CRC32C, UINT64_MASK

_pack_sizes = struct.Struct(">II").pack
_pack_magic_crc = struct.Struct(">HI").pack

_INT64_SIGN = 1 << 63


def to_uint64(value: int) -> int:
    """The uint64 wire value of a signed 64-bit id: ``to_uint64(-1) == 2**64 - 1``."""
    return value & UINT64_MASK


def to_int64(value: int) -> int:
    """The signed value of a uint64 wire id: ``to_int64(2**64 - 1) == -1``."""
    value &= UINT64_MASK
    return value - (1 << 64) if value & _INT64_SIGN else value


def encode_command(command: pb.BaseCommand) -> bytes:
    """A simple frame: totalSize, cmdSize, the serialized command.

    Raises ``google.protobuf.message.EncodeError`` if a required field is unset.
    """
    body = command.SerializeToString()
    size = len(body)
    return _pack_sizes(size + 4, size) + body


def encode_payload_command(
    command: pb.BaseCommand,
    payload: Bytes,
    checksum: int | None = None,
    *,
    with_checksum: bool = True,
) -> bytes:
    """A payload frame with magic 0x0E01 and CRC32C in front of ``payload``.

    ``payload`` is the section metadataSize + MessageMetadata + payload; the checksum is computed
    over it unless given. ``with_checksum=False`` writes neither magic nor CRC (a frame form
    peers must also accept).
    """
    body = command.SerializeToString()
    size = len(body)
    if not with_checksum:
        return b"".join((_pack_sizes(size + 4 + len(payload), size), body, payload))
    if checksum is None:
        checksum = crc32c(payload)
    return b"".join(
        (
            _pack_sizes(size + 10 + len(payload), size),
            body,
            _pack_magic_crc(MAGIC_CRC32C, checksum),
            payload,
        )
    )


# One-byte varints are by far the most common (small ids, tags, lengths).
_SMALL_VARINTS = tuple(bytes((i,)) for i in range(128))


def _varint(value: int) -> bytes:
    """Protobuf varint of a non-negative int below 2**64 (callers mask negative values)."""
    if value < 0x80:
        return _SMALL_VARINTS[value]
    # Unrolled for the sizes ids and lengths usually have; the loop handles the rest.
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, (value >> 7) & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Consumer, producer and ledger ids repeat from message to message; entry ids do not.
_cached_varint = lru_cache(maxsize=4096)(_varint)


def _message_id(ledger_id: int, entry_id: int, partition: int = -1) -> bytes:
    body = b"".join(
        (b"\x08", _cached_varint(ledger_id & UINT64_MASK), b"\x10", _varint(entry_id & UINT64_MASK))
    )
    if partition >= 0:
        body += b"\x18" + _varint(partition & 0xFFFFFFFF)
    return body


def encode_message_header(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    payload_size: int,
    checksum: int,
    *,
    redelivery_count: int = 0,
    partition: int = -1,
    ack_set: Sequence[int] | None = None,
) -> bytes:
    """Everything of a MESSAGE frame up to and including the CRC, for a payload section of
    ``payload_size`` bytes that follows it on the wire.

    Lets the server write header and stored payload with ``transport.writelines`` without
    copying the payload. ``partition`` -1 (not partitioned) and ``redelivery_count`` 0 are left
    out, as a Pulsar broker does; ``ack_set`` holds the words of the still-unacked batch-index
    bitset.
    """
    mid = _message_id(ledger_id, entry_id, partition)
    cid = _cached_varint(consumer_id & UINT64_MASK)
    tail = b""
    if redelivery_count:
        tail = b"\x18" + _varint(redelivery_count & 0xFFFFFFFF)
    if ack_set:
        # proto2 repeated scalars are unpacked by default: one tag per word.
        tail += b"".join([b"\x20" + _varint(word & UINT64_MASK) for word in ack_set])
    # CommandMessage{1: consumer_id, 2: message_id, 3: redelivery_count, 4: ack_set}; a message
    # id is at most 28 bytes, so its length is one varint byte.
    msg_size = 3 + len(cid) + len(mid) + len(tail)
    msg_size_varint = _varint(msg_size)
    # BaseCommand{1: type MESSAGE (9), 9: message}
    cmd_size = 3 + len(msg_size_varint) + msg_size
    return b"".join(
        (
            _pack_sizes(cmd_size + 10 + payload_size, cmd_size),
            b"\x08\x09\x4a",
            msg_size_varint,
            b"\x08",
            cid,
            b"\x12",
            _SMALL_VARINTS[len(mid)],
            mid,
            tail,
            _pack_magic_crc(MAGIC_CRC32C, checksum),
        )
    )


def encode_message(
    consumer_id: int,
    ledger_id: int,
    entry_id: int,
    payload: Bytes,
    checksum: int,
    *,
    redelivery_count: int = 0,
    partition: int = -1,
    ack_set: Sequence[int] | None = None,
) -> bytes:
    """A full MESSAGE frame: command, magic, the given CRC32C and the stored payload section.

    ``payload`` is the section metadataSize + metadata + payload as received in SEND and
    ``checksum`` its CRC32C (kept from SEND, not recomputed).
    """
    return (
        encode_message_header(
            consumer_id,
            ledger_id,
            entry_id,
            len(payload),
            checksum,
            redelivery_count=redelivery_count,
            partition=partition,
            ack_set=ack_set,
        )
        + payload
    )


def encode_send_receipt(
    producer_id: int,
    sequence_id: int,
    ledger_id: int,
    entry_id: int,
    highest_sequence_id: int | None = None,
) -> bytes:
    """A SEND_RECEIPT frame for the entry ``(ledger_id, entry_id)``."""
    # One per published entry: built in one join, and the highest sequence id, usually the
    # sequence id itself, reuses its varint.
    lid = _cached_varint(ledger_id & UINT64_MASK)
    eid = _varint(entry_id & UINT64_MASK)
    pid = _cached_varint(producer_id & UINT64_MASK)
    seq = _varint(sequence_id & UINT64_MASK)
    # MessageIdData{1: ledgerId, 2: entryId}
    mid_size = 2 + len(lid) + len(eid)
    # CommandSendReceipt{1: producer_id, 2: sequence_id, 3: message_id, 4: highest_sequence_id}
    # BaseCommand{1: type SEND_RECEIPT (7), 7: send_receipt}; a receipt is under 128 bytes.
    if highest_sequence_id is None:
        highest = b""
    elif highest_sequence_id == sequence_id:
        highest = b"\x20" + seq
    else:
        highest = b"\x20" + _varint(highest_sequence_id & UINT64_MASK)
    receipt_size = 4 + len(pid) + len(seq) + mid_size + len(highest)
    cmd_size = 4 + receipt_size
    return b"".join(
        (
            _pack_sizes(cmd_size + 4, cmd_size),
            b"\x08\x07\x3a",
            _SMALL_VARINTS[receipt_size],
            b"\x08",
            pid,
            b"\x10",
            seq,
            b"\x1a",
            _SMALL_VARINTS[mid_size],
            b"\x08",
            lid,
            b"\x10",
            eid,
            highest,
        )
    )
