"""Property tests: hostile bytes never escape as anything but ProtocolError, and chunking of a
valid stream never changes what is decoded."""

from __future__ import annotations

import struct

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keyshared.protocol import commands as c
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import crc32c
from keyshared.protocol.encode import encode_message
from keyshared.protocol.errors import ProtocolError
from keyshared.protocol.framing import Frame, FrameDecoder
from keyshared.protocol.metadata import (
    encode_payload_section,
    iter_batch,
    split_payload,
    sticky_key,
)

LIMIT = 64 * 1024
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _md() -> pb.MessageMetadata:
    return pb.MessageMetadata(
        producer_name="standalone-0-3", sequence_id=12, publish_time=1, partition_key="key-1"
    )


def _section() -> bytes:
    return encode_payload_section(_md(), b"payload-bytes")


def _message_with_entry_metadata() -> bytes:
    section = _section()
    bem = pb.BrokerEntryMetadata(broker_timestamp=5, index=3).SerializeToString()
    body = pb.BaseCommand(
        type=pb.BaseCommand.MESSAGE,
        message=pb.CommandMessage(
            consumer_id=1, message_id=pb.MessageIdData(ledgerId=1, entryId=2)
        ),
    ).SerializeToString()
    rest = (
        struct.pack(">HI", 0x0E02, len(bem))
        + bem
        + struct.pack(">HI", 0x0E01, crc32c(section))
        + section
    )
    return struct.pack(">II", 4 + len(body) + len(rest), len(body)) + body + rest


VALID_FRAMES: list[bytes] = [
    c.connect(),
    c.connect(auth_method_name="token", auth_data=b"jwt"),
    c.ping(),
    c.pong(),
    c.partitioned_metadata(topic="persistent://public/default/t", request_id=1),
    c.lookup(topic="persistent://public/default/t", request_id=2),
    c.producer(
        topic="persistent://public/default/t", producer_id=0, request_id=0, metadata={"a": "b"}
    ),
    c.send(producer_id=0, sequence_id=0, metadata=_md(), payload=b"hello"),
    c.send(producer_id=0, sequence_id=1, metadata=_md(), payload=b"x", with_checksum=False),
    c.subscribe(
        topic="persistent://public/default/t",
        subscription="s",
        sub_type=pb.CommandSubscribe.Key_Shared,
        consumer_id=0,
        request_id=3,
        consumer_name="c",
        key_shared=c.key_shared_meta(hash_ranges=[(0, 100)]),
    ),
    c.flow(consumer_id=0, permits=1000),
    c.ack(consumer_id=0, message_ids=[c.message_id(7, 0, ack_set=[5]), c.message_id(7, -1)]),
    c.redeliver(consumer_id=0, message_ids=[c.message_id(7, 1)]),
    c.seek(consumer_id=0, request_id=4, publish_time=123),
    c.get_last_message_id(consumer_id=0, request_id=5),
    c.close_consumer(consumer_id=0, request_id=6),
    c.error(request_id=7, error=pb.ServiceNotReady, message="later"),
    c.lookup_response(request_id=2, broker_service_url="pulsar://127.0.0.1:6650"),
    encode_message(1, 7, 0, _section(), crc32c(_section()), ack_set=[3]),
    _message_with_entry_metadata(),
]


def _assert_strings_are_str(message: Message) -> None:
    """Every set string field reads back as ``str`` (the decoder's UTF-8 promise)."""
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        for item in values:
            if field.type == FieldDescriptor.TYPE_STRING:
                assert isinstance(item, str), field.full_name
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                _assert_strings_are_str(item)


def _drain(data: bytes, chunks: list[int] | None = None) -> list[Frame]:
    """Decode ``data``; only ProtocolError may escape. Returns the frames decoded before it."""
    decoder = FrameDecoder(LIMIT)
    frames: list[Frame] = []
    pieces = [data] if chunks is None else _split(data, chunks)
    try:
        for piece in pieces:
            decoder.feed(piece)
            frames.extend(decoder)
    except ProtocolError:
        pass
    for frame in frames:
        # The promise covers the sub-message named by the type, the only one a server reads.
        command = frame.command
        field = command.DESCRIPTOR.fields_by_number[command.type].name
        _assert_strings_are_str(getattr(command, field))
        str(command)
        if frame.payload is not None and frame.command.type == pb.BaseCommand.SEND:
            _poke_payload(frame.payload)
    return frames


def _poke_payload(payload: bytes) -> None:
    """The broker's own reads of a payload section may only fail with ProtocolError."""
    try:
        meta, _ = split_payload(payload)
        sticky_key(meta)
        list(iter_batch(payload))
    except ProtocolError:
        pass


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    pieces, last = [], 0
    for point in points:
        pieces.append(data[last:point])
        last = point
    pieces.append(data[last:])
    return pieces


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_only_raise_protocol_errors(data: bytes) -> None:
    _drain(data)


@FUZZ
@given(
    body=st.binary(max_size=200),
    tail=st.binary(max_size=200),
    magic=st.sampled_from([b"", b"\x0e\x01", b"\x0e\x02"]),
)
def test_framed_random_commands_only_raise_protocol_errors(
    body: bytes, tail: bytes, magic: bytes
) -> None:
    # A valid frame header around random content reaches the protobuf parser and the payload
    # parsing far more often than raw random bytes do.
    rest = magic + tail
    _drain(struct.pack(">II", 4 + len(body) + len(rest), len(body)) + body + rest)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(VALID_FRAMES)))
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        pos = draw(st.integers(min_value=0, max_value=max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif kind == "set" and data:
            data[pos] = draw(st.integers(min_value=0, max_value=255))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(min_value=1, max_value=8))]
    return bytes(data)


@FUZZ
@given(mutated_frames(), st.lists(st.integers(min_value=0, max_value=10_000), max_size=6))
def test_mutated_valid_frames_only_raise_protocol_errors(data: bytes, cuts: list[int]) -> None:
    _drain(data, cuts)


def _commands(frames: list[Frame]) -> list[tuple[pb.BaseCommand, bytes | None, int | None, bool]]:
    return [(f.command, f.payload, f.checksum, f.checksum_ok) for f in frames]


@settings(max_examples=200, deadline=None)
@given(
    picks=st.lists(
        st.integers(min_value=0, max_value=len(VALID_FRAMES) - 1), min_size=1, max_size=12
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=100_000), max_size=30),
)
def test_any_chunking_decodes_to_the_same_frames(picks: list[int], cuts: list[int]) -> None:
    data = b"".join(VALID_FRAMES[i] for i in picks)
    whole = FrameDecoder(LIMIT)
    whole.feed(data)
    expected = _commands(list(whole))
    assert len(expected) == len(picks)
    decoder = FrameDecoder(LIMIT)
    got: list[Frame] = []
    for piece in _split(data, cuts):
        decoder.feed(piece)
        got.extend(decoder)
    assert _commands(got) == expected
    assert decoder.buffered == 0
