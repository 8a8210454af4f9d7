"""The SEND fast path of ``FrameDecoder.next_frame_or_send`` (commands read straight from the
bytes) gives exactly what the full protobuf parse gives: the same fields, the same payload and
checksum verdict, and the same errors, for well-formed SENDs of every shape and for mutated
bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import crc32c
from keyshared.protocol.errors import ProtocolError
from keyshared.protocol.framing import Frame, FrameDecoder, SendFrame, _plain_send
from keyshared.protocol.metadata import encode_payload_section

LIMIT = 64 * 1024
PROPS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
U64 = st.integers(min_value=0, max_value=2**64 - 1)


def _frame(command: bytes, section: bytes, checksum: bool) -> bytes:
    tail = section
    if checksum:
        tail = struct.pack(">HI", 0x0E01, crc32c(section)) + section
    body = struct.pack(">I", len(command)) + command + tail
    return struct.pack(">I", len(body)) + body


def _section() -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, partition_key="k")
    return encode_payload_section(md, b"payload")


def _outcome(decoder_call: str, data: bytes) -> object:
    decoder = FrameDecoder(LIMIT)
    try:
        decoder.feed(data)
        got = getattr(decoder, decoder_call)()
    except ProtocolError as exc:
        return (type(exc), str(exc))
    if got is None:
        return None
    if isinstance(got, SendFrame):
        return ("send", tuple(got))
    assert isinstance(got, Frame)
    if got.command.type != pb.BaseCommand.SEND:
        return ("other", got.command.type)
    send = got.command.send
    highest = send.highest_sequence_id if send.HasField("highest_sequence_id") else None
    fields = (send.producer_id, send.sequence_id, send.num_messages, highest)
    return ("send", (*fields, got.payload, got.checksum, got.checksum_ok))


def _same_as_full_parse(data: bytes) -> None:
    # next_frame() always takes the full parse; next_frame_or_send() may take the fast path.
    assert _outcome("next_frame_or_send", data) == _outcome("next_frame", data)


@st.composite
def send_commands(draw: st.DrawFn) -> bytes:
    send = pb.CommandSend(producer_id=draw(U64), sequence_id=draw(U64))
    if draw(st.booleans()):
        send.num_messages = draw(st.integers(min_value=-(2**31), max_value=2**31 - 1))
    if draw(st.booleans()):
        send.highest_sequence_id = draw(U64)
    if draw(st.integers(0, 5)) == 0:
        send.txnid_least_bits = draw(U64)
    if draw(st.integers(0, 5)) == 0:
        send.is_chunk = draw(st.booleans())
    if draw(st.integers(0, 5)) == 0:
        send.marker = draw(st.booleans())
    if draw(st.integers(0, 5)) == 0:
        send.message_id.CopyFrom(pb.MessageIdData(ledgerId=draw(U64), entryId=draw(U64)))
    return pb.BaseCommand(type=pb.BaseCommand.SEND, send=send).SerializeToString()


@PROPS
@given(command=send_commands(), checksum=st.booleans(), bad_crc=st.booleans())
def test_well_formed_sends_decode_as_the_full_parse(
    command: bytes, checksum: bool, bad_crc: bool
) -> None:
    data = bytearray(_frame(command, _section(), checksum))
    if checksum and bad_crc:
        data[-1] ^= 0xFF  # the payload no longer matches its CRC
    _same_as_full_parse(bytes(data))


@PROPS
@given(
    command=send_commands(),
    flips=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 255)), max_size=4),
    cut=st.integers(0, 6),
)
def test_mutated_send_commands_decode_as_the_full_parse(
    command: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    raw = bytearray(command)
    for at, value in flips:
        if at < len(raw):
            raw[at] = value
    if cut:
        raw = raw[: max(0, len(raw) - cut)]
    _same_as_full_parse(_frame(bytes(raw), _section(), True))


def test_the_common_shapes_take_the_fast_path() -> None:
    """What the official client sends (producer and sequence ids, a message count, the highest
    sequence id of a batch) is read without protobuf; a transaction is not."""
    plain = pb.BaseCommand(
        type=pb.BaseCommand.SEND,
        send=pb.CommandSend(producer_id=3, sequence_id=2**40, num_messages=1000),
    ).SerializeToString()
    assert _plain_send(bytearray(plain), 0, len(plain)) == (3, 2**40, 1000, None)
    batch = pb.BaseCommand(
        type=pb.BaseCommand.SEND,
        send=pb.CommandSend(producer_id=0, sequence_id=5, highest_sequence_id=9),
    ).SerializeToString()
    assert _plain_send(bytearray(batch), 0, len(batch)) == (0, 5, 1, 9)
    txn = pb.BaseCommand(
        type=pb.BaseCommand.SEND,
        send=pb.CommandSend(producer_id=0, sequence_id=5, txnid_least_bits=1),
    ).SerializeToString()
    assert _plain_send(bytearray(txn), 0, len(txn)) is None


@pytest.mark.parametrize(
    "command",
    [
        bytes.fromhex("0806320208 01"),  # no sequence id: required
        bytes.fromhex("08063204 0801 1001 00"),  # a byte past the sub-message
        bytes.fromhex("08063204 0801 10ff"),  # a varint running past the end
        bytes.fromhex("08063200"),  # an empty CommandSend
    ],
    ids=["missing-required", "trailing", "truncated-varint", "empty"],
)
def test_malformed_sends_fail_as_the_full_parse(command: bytes) -> None:
    data = _frame(command, _section(), True)
    _same_as_full_parse(data)
    error = _outcome("next_frame_or_send", data)
    assert isinstance(error, tuple) and isinstance(error[0], type)
    assert issubclass(error[0], ProtocolError)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.mark.parametrize("count", [2**31 - 1, 2**31, 2**32 + 5, 2**33, 2**63, 2**64 - 1])
def test_out_of_range_message_counts_decode_as_the_full_parse(count: int) -> None:
    """An int32 given a wider varint: protobuf decides what it means, not the fast path."""
    inner = b"\x08\x01\x10\x02\x18" + _varint(count)
    command = b"\x08\x06\x32" + bytes([len(inner)]) + inner
    _same_as_full_parse(_frame(command, _section(), True))
