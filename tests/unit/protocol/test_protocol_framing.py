"""FrameDecoder: layout, checksums, chunking, size limits and malformed input.

Frames here are assembled by hand from protobuf objects and struct, independently of the
encoders, so a shared mistake cannot hide.
"""

from __future__ import annotations

import struct
import time

import pytest

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import crc32c, verify
from keyshared.protocol.errors import FrameTooLarge, MalformedFrame, ProtocolError
from keyshared.protocol.framing import Frame, FrameDecoder

LIMIT = 5 * 1024 * 1024 + 10 * 1024

# The first frame pulsar-client 3.13.0 sends (research/pulsar-protocol.md §1).
CONNECT_HEX = (
    "00000029 00000025"
    " 0802"
    " 1221"
    " 0a11 50756c7361722d4350502d76342e322e30"
    " 2014"
    " 2a04 6e6f6e65"
    " 5204 08011001"
)


def simple(cmd: pb.BaseCommand) -> bytes:
    body = cmd.SerializeToString()
    return struct.pack(">II", len(body) + 4, len(body)) + body


def raw_simple(body: bytes) -> bytes:
    return struct.pack(">II", len(body) + 4, len(body)) + body


def with_payload(
    cmd: pb.BaseCommand,
    section: bytes,
    *,
    crc: int | bool | None = True,
    entry_metadata: bytes | None = None,
) -> bytes:
    """A payload frame; crc=True computes the CRC, an int forces one, None/False omits it."""
    body = cmd.SerializeToString()
    rest = b""
    if entry_metadata is not None:
        rest += struct.pack(">HI", 0x0E02, len(entry_metadata)) + entry_metadata
    if crc is True:
        rest += struct.pack(">HI", 0x0E01, crc32c(section))
    elif isinstance(crc, int) and crc is not False:
        rest += struct.pack(">HI", 0x0E01, crc)
    rest += section
    return struct.pack(">II", 4 + len(body) + len(rest), len(body)) + body + rest


def send_cmd(producer_id: int = 1, sequence_id: int = 0) -> pb.BaseCommand:
    return pb.BaseCommand(
        type=pb.BaseCommand.SEND,
        send=pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id),
    )


def section(payload: bytes = b"hello", key: str = "k") -> bytes:
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, partition_key=key
    ).SerializeToString()
    return struct.pack(">I", len(md)) + md + payload


def decode_all(data: bytes, limit: int = LIMIT) -> list[Frame]:
    decoder = FrameDecoder(limit)
    decoder.feed(data)
    frames = list(decoder)
    assert decoder.buffered == 0
    return frames


def test_crc32c_test_vector() -> None:
    assert crc32c(b"123456789") == 0xE3069283
    assert crc32c(memoryview(b"123456789")) == 0xE3069283
    assert crc32c(b"56789", crc32c(b"1234")) == 0xE3069283
    assert verify(bytearray(b"123456789"), 0xE3069283)
    assert not verify(b"123456780", 0xE3069283)


def test_decodes_the_connect_frame_observed_from_the_real_client() -> None:
    (frame,) = decode_all(bytes.fromhex(CONNECT_HEX.replace(" ", "")))
    assert frame.type == pb.BaseCommand.CONNECT
    connect = frame.command.connect
    assert connect.client_version == "Pulsar-CPP-v4.2.0"
    assert connect.protocol_version == 20
    assert connect.auth_method_name == "none"
    assert connect.feature_flags.supports_auth_refresh
    assert connect.feature_flags.supports_broker_entry_metadata
    assert not connect.HasField("auth_data")
    assert frame.payload is None and frame.checksum is None and frame.checksum_ok


def test_simple_frame() -> None:
    cmd = pb.BaseCommand(
        type=pb.BaseCommand.FLOW, flow=pb.CommandFlow(consumer_id=0, messagePermits=1000)
    )
    (frame,) = decode_all(simple(cmd))
    assert frame.command == cmd
    assert frame.command.flow.HasField("consumer_id")
    assert frame.payload is None


def test_payload_frame_with_checksum() -> None:
    sec = section()
    (frame,) = decode_all(with_payload(send_cmd(7, 3), sec))
    assert frame.command.send.producer_id == 7
    assert frame.payload == sec
    assert frame.checksum == crc32c(sec)
    assert frame.checksum_ok


def test_payload_frame_without_checksum() -> None:
    sec = section()
    (frame,) = decode_all(with_payload(send_cmd(), sec, crc=None))
    assert frame.payload == sec
    assert frame.checksum is None
    assert frame.checksum_ok


def test_bad_checksum_is_reported_not_raised_and_decoding_continues() -> None:
    sec = section()
    good = crc32c(sec)
    data = with_payload(send_cmd(sequence_id=1), sec, crc=good ^ 1) + with_payload(
        send_cmd(sequence_id=2), sec
    )
    bad_frame, good_frame = decode_all(data)
    assert bad_frame.checksum == good ^ 1
    assert not bad_frame.checksum_ok
    assert bad_frame.payload == sec
    assert good_frame.checksum_ok and good_frame.command.send.sequence_id == 2


def test_corrupted_payload_byte_fails_the_checksum() -> None:
    data = bytearray(with_payload(send_cmd(), section(b"x" * 100)))
    data[-50] ^= 0xFF
    (frame,) = decode_all(bytes(data))
    assert not frame.checksum_ok


@pytest.mark.parametrize("size", [0, 1, 4000, 4095, 4096, 4097, 300_000])
@pytest.mark.parametrize("crc", [True, None])
def test_payloads_of_every_size_come_out_whole_and_checked(size: int, crc: bool | None) -> None:
    """Small payloads are copied by slicing the buffer, large ones through a memoryview: the
    same bytes and checksum verdict either way, and the buffer still takes new bytes after
    (a memoryview left alive would make its next resize fail)."""
    sec = section(bytes(range(256)) * (size // 256) + b"z" * (size % 256))
    decoder = FrameDecoder(LIMIT)
    for sequence_id in range(4):
        decoder.feed(with_payload(send_cmd(sequence_id=sequence_id), sec, crc=crc))
        frame = decoder.next_frame() if sequence_id % 2 else decoder.next_frame_or_send()
        assert frame is not None
        assert frame.payload == sec
        assert frame.checksum_ok
        assert frame.checksum == (crc32c(sec) if crc else None)
    corrupt = bytearray(with_payload(send_cmd(), sec))
    corrupt[-1] ^= 0x01
    decoder.feed(bytes(corrupt))
    frame = decoder.next_frame_or_send()
    assert frame is not None and frame.payload == sec[:-1] + bytes([sec[-1] ^ 0x01])
    assert not frame.checksum_ok


@pytest.mark.parametrize("crc", [True, None])
def test_broker_entry_metadata_prefix_is_skipped(crc: bool | None) -> None:
    sec = section()
    bem = pb.BrokerEntryMetadata(broker_timestamp=123, index=9).SerializeToString()
    msg = pb.BaseCommand(
        type=pb.BaseCommand.MESSAGE,
        message=pb.CommandMessage(
            consumer_id=2, message_id=pb.MessageIdData(ledgerId=5, entryId=0)
        ),
    )
    (frame,) = decode_all(with_payload(msg, sec, crc=crc, entry_metadata=bem))
    assert frame.payload == sec
    assert frame.checksum_ok
    assert (frame.checksum is not None) == (crc is True)
    assert frame.command.message.message_id.entryId == 0


def test_ping_without_sub_message_is_accepted() -> None:
    (frame,) = decode_all(raw_simple(b"\x08\x12"))
    assert frame.type == pb.BaseCommand.PING


def test_frames_split_at_every_byte_boundary() -> None:
    frames = [
        bytes.fromhex(CONNECT_HEX.replace(" ", "")),
        with_payload(send_cmd(1, 0), section(b"a" * 40)),
        simple(pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing())),
        with_payload(send_cmd(1, 1), section(b"b"), crc=None),
    ]
    data = b"".join(frames)
    expected = [f.command for f in decode_all(data)]
    assert len(expected) == 4
    for cut in range(len(data) + 1):
        decoder = FrameDecoder(LIMIT)
        got: list[Frame] = []
        for part in (data[:cut], data[cut:]):
            decoder.feed(part)
            got.extend(decoder)
        assert [f.command for f in got] == expected, cut
    decoder = FrameDecoder(LIMIT)
    got = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        got.extend(decoder)
    assert [f.command for f in got] == expected
    assert all(f.checksum_ok for f in got)


def test_feed_accepts_bytearray_and_memoryview() -> None:
    data = with_payload(send_cmd(), section())
    decoder = FrameDecoder(LIMIT)
    decoder.feed(bytearray(data[:10]))
    decoder.feed(memoryview(data)[10:])
    (frame,) = list(decoder)
    assert frame.checksum_ok


def test_oversize_is_detected_from_the_header_alone() -> None:
    decoder = FrameDecoder(1000)
    decoder.feed(struct.pack(">I", 1001)[:3])
    assert decoder.next_frame() is None
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(struct.pack(">I", 1001)[3:])
    assert info.value.code == pb.NotAllowedError
    assert "1001" in str(info.value)
    # Unusable afterwards: every call raises again, nothing more is buffered.
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"\x00" * 10)
    with pytest.raises(FrameTooLarge):
        decoder.next_frame()


def test_frame_of_exactly_the_limit_is_accepted() -> None:
    body = send_cmd().SerializeToString()
    sec_len = 1000 - 4 - len(body) - 6
    payload = b"z" * (sec_len - len(section(b"")))
    data = with_payload(send_cmd(), section(payload))
    assert struct.unpack(">I", data[:4])[0] == 1000
    (frame,) = decode_all(data, limit=1000)
    assert frame.checksum_ok
    with pytest.raises(FrameTooLarge):
        decode_all(data, limit=999)


def test_big_frame_in_many_small_chunks_is_linear() -> None:
    payload = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    data = with_payload(send_cmd(), section(payload))
    decoder = FrameDecoder(LIMIT)
    start = time.perf_counter()
    frames: list[Frame] = []
    for i in range(0, len(data), 1024):
        decoder.feed(data[i : i + 1024])
        frames.extend(decoder)
    elapsed = time.perf_counter() - start
    assert len(frames) == 1 and frames[0].checksum_ok
    assert frames[0].payload is not None and frames[0].payload.endswith(payload)
    # Linear work is a few ms; re-copying the buffer per chunk would take many seconds.
    assert elapsed < 2.0


def test_buffer_is_reclaimed_after_many_frames() -> None:
    frame = with_payload(send_cmd(), section(b"p" * 500))
    decoder = FrameDecoder(LIMIT)
    for _ in range(2000):
        decoder.feed(frame + frame[:7])
        decoder.feed(frame[7:])
        assert len(list(decoder)) == 2
    assert decoder.buffered == 0
    assert len(decoder._buf) < 200 * 1024  # consumed bytes were dropped


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (struct.pack(">I", 3) + b"\x00\x00\x00", "no room"),
        (struct.pack(">II", 6, 9) + b"\x08\x12", "command size 9"),
        (raw_simple(b"\xff\xff\xff"), "unparseable"),
        (raw_simple(b""), "no type"),
        (raw_simple(b"\x08\x32"), "unknown command type 50"),
        (raw_simple(b"\x08\x06"), "without its send field"),
        (raw_simple(b"\x08\x06\x32\x02\x08\x01"), "send.sequence_id"),
        (raw_simple(b"\x08\x06\x32\x04\x08\x01\x10\x00"), "SEND without a payload"),
        (
            raw_simple(b"\x08\x05\x2a\x08\x0a\x02\xff\xfe\x10\x00\x18\x00"),
            "topic is not valid UTF-8",
        ),
    ],
    ids=[
        "total-too-small",
        "cmd-size-too-big",
        "garbage-command",
        "empty-command",
        "unknown-type",
        "missing-sub-message",
        "missing-required-field",
        "send-without-payload",
        "invalid-utf8",
    ],
)
def test_malformed_frames(data: bytes, needle: str) -> None:
    decoder = FrameDecoder(LIMIT)
    with pytest.raises(MalformedFrame) as info:
        decoder.feed(data)
        decoder.next_frame()
    assert needle in str(info.value)
    assert isinstance(info.value, ProtocolError)
    with pytest.raises(MalformedFrame):
        decoder.next_frame()


def test_truncated_checksum_and_entry_metadata_are_malformed() -> None:
    body = send_cmd().SerializeToString()
    for tail in (b"\x0e\x01\x00\x00", b"\x0e\x02\x00\x00\x00\x09\x00"):
        data = struct.pack(">II", 4 + len(body) + len(tail), len(body)) + body + tail
        decoder = FrameDecoder(LIMIT)
        decoder.feed(data)
        with pytest.raises(MalformedFrame):
            decoder.next_frame()


def test_decoder_error_codes() -> None:
    assert MalformedFrame("x").code == pb.UnknownError
    assert MalformedFrame("x", code=pb.ChecksumError).code == pb.ChecksumError
    assert FrameTooLarge("x").code == pb.NotAllowedError
