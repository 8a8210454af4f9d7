"""Payload sections: metadata parsing, sticky keys, batch counts and batch bodies."""

from __future__ import annotations

import base64
import struct
import zlib

import pytest

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.constants import NONE_KEY
from keyshared.protocol.errors import MalformedFrame, ProtocolError, UnsupportedCompression
from keyshared.protocol.metadata import (
    decompress,
    encode_batch,
    encode_payload_section,
    is_batch,
    iter_batch,
    num_messages,
    parse_metadata,
    split_payload,
    sticky_key,
)
from keyshared.protocol.validate import invalid_string_field


def md(**fields: object) -> pb.MessageMetadata:
    meta = pb.MessageMetadata(producer_name="prod", sequence_id=7, publish_time=1_700_000_000_000)
    for name, value in fields.items():
        setattr(meta, name, value)
    return meta


def test_parse_metadata_round_trip() -> None:
    meta = md(
        partition_key="k",
        ordering_key=b"o",
        deliver_at_time=1_700_000_005_000,
        null_value=True,
        uuid="u",
        chunk_id=1,
        num_chunks_from_msg=3,
        total_chunk_msg_size=10,
        highest_sequence_id=9,
        compression=pb.NONE,
        event_time=5,
    )
    meta.properties.add(key="a", value="b")
    section = encode_payload_section(meta, b"payload")
    assert parse_metadata(section) == meta
    parsed, rest = split_payload(memoryview(section))
    assert parsed == meta and bytes(rest) == b"payload"
    assert parse_metadata(bytearray(section)).deliver_at_time == 1_700_000_005_000


@pytest.mark.parametrize(
    "section",
    [
        b"",
        b"\x00\x00",
        struct.pack(">I", 100) + b"\x0a",
        struct.pack(">I", 3) + b"\xff\xff\xff",
        # valid protobuf, but producer_name/sequence_id/publish_time missing
        struct.pack(">I", 2) + b"\x18\x01",
        # producer_name that is not UTF-8
        struct.pack(">I", 8) + b"\x0a\x02\xff\xfe\x10\x00\x18\x00",
    ],
    ids=["empty", "short", "size-past-end", "garbage", "missing-required", "bad-utf8"],
)
def test_parse_metadata_rejects_garbage(section: bytes) -> None:
    with pytest.raises(MalformedFrame):
        parse_metadata(section)


def test_sticky_key_priority() -> None:
    assert sticky_key(md(ordering_key=b"ord", partition_key="pk")) == b"ord"
    assert sticky_key(md(ordering_key=b"", partition_key="pk")) == b""
    assert sticky_key(md(partition_key="pk")) == b"pk"
    assert sticky_key(md(partition_key="ключ")) == "ключ".encode()
    assert sticky_key(md(partition_key="")) == b""
    raw = b"\x00\xffbin"
    encoded = base64.b64encode(raw).decode()
    assert sticky_key(md(partition_key=encoded, partition_key_b64_encoded=True)) == raw
    assert sticky_key(md(partition_key=encoded.rstrip("="), partition_key_b64_encoded=True)) == raw
    assert sticky_key(md(partition_key="!!", partition_key_b64_encoded=True)) == NONE_KEY
    # No key: producer name and sequence id, so un-keyed messages spread over consumers.
    assert sticky_key(md()) == b"prod-7"
    assert sticky_key(pb.MessageMetadata()) == NONE_KEY
    assert NONE_KEY == b"NONE_KEY"


def test_num_messages_and_batch_flag() -> None:
    assert num_messages(md()) == 1 and not is_batch(md())
    assert num_messages(md(num_messages_in_batch=1)) == 1
    assert is_batch(md(num_messages_in_batch=1))
    assert num_messages(md(num_messages_in_batch=25)) == 25


def batch_messages() -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    first = pb.SingleMessageMetadata(partition_key="k1", sequence_id=0)
    first.properties.add(key="p", value="v")
    second = pb.SingleMessageMetadata(ordering_key=b"o2", sequence_id=1, null_value=True)
    third = pb.SingleMessageMetadata(sequence_id=2, event_time=99)
    return [(first, b"one"), (second, b""), (third, b"three" * 50)]


def test_iter_batch_uncompressed() -> None:
    messages = batch_messages()
    body = encode_batch(messages)
    section = encode_payload_section(md(num_messages_in_batch=3), body)
    got = list(iter_batch(section))
    assert [p for _, p in got] == [b"one", b"", b"three" * 50]
    assert [m for m, _ in got] == [m for m, _ in messages]
    assert got[0][0].payload_size == 3


def test_iter_batch_zlib() -> None:
    body = encode_batch(batch_messages())
    meta = md(num_messages_in_batch=3, compression=pb.ZLIB, uncompressed_size=len(body))
    section = encode_payload_section(meta, zlib.compress(body))
    assert [p for _, p in iter_batch(section)] == [b"one", b"", b"three" * 50]
    assert decompress(meta, zlib.compress(body)) == body


def test_iter_batch_of_a_non_batched_entry_yields_one_message() -> None:
    meta = md(partition_key="k", event_time=3)
    meta.properties.add(key="a", value="b")
    ((single, payload),) = list(iter_batch(encode_payload_section(meta, b"solo")))
    assert payload == b"solo"
    assert single.partition_key == "k" and single.event_time == 3
    assert single.payload_size == 4 and single.sequence_id == 7
    assert [(kv.key, kv.value) for kv in single.properties] == [("a", "b")]


@pytest.mark.parametrize("codec", [pb.LZ4, pb.ZSTD, pb.SNAPPY])
def test_optional_codecs_without_their_module(codec: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def refuse(name: str, package: str | None = None) -> object:
        if name in ("lz4.block", "zstandard", "snappy"):
            raise ImportError(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", refuse)
    meta = md(num_messages_in_batch=1, compression=codec, uncompressed_size=10)
    section = encode_payload_section(meta, b"\x00" * 8)
    with pytest.raises(UnsupportedCompression, match="optional Python module"):
        list(iter_batch(section))


def test_decompression_errors_are_malformed() -> None:
    meta = md(num_messages_in_batch=1, compression=pb.ZLIB, uncompressed_size=5)
    with pytest.raises(MalformedFrame, match="decompress"):
        list(iter_batch(encode_payload_section(meta, b"not zlib")))
    meta = md(num_messages_in_batch=1, compression=pb.ZLIB, uncompressed_size=999)
    with pytest.raises(MalformedFrame, match="uncompressed size"):
        list(iter_batch(encode_payload_section(meta, zlib.compress(b"abc"))))


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00",
        struct.pack(">I", 50) + b"\x18",
        struct.pack(">I", 2) + b"\x18\x05" + b"ab",
        struct.pack(">I", 1) + b"\xff",
        struct.pack(">I", 2) + b"\x10\x01",
    ],
    ids=["empty", "short-size", "meta-past-end", "payload-past-end", "garbage", "no-payload-size"],
)
def test_iter_batch_rejects_broken_bodies(body: bytes) -> None:
    section = encode_payload_section(md(num_messages_in_batch=1), body)
    with pytest.raises(ProtocolError):
        list(iter_batch(section))


def test_invalid_string_field_finds_nested_bad_utf8() -> None:
    meta = md(partition_key="ok")
    meta.properties.add(key="k", value="v")
    assert invalid_string_field(meta) is None
    # A property value that is not UTF-8 (protobuf keeps it as bytes).
    kv = b"\x0a\x01k\x12\x02\xff\xfe"
    raw = meta.SerializeToString() + b"\x22" + bytes([len(kv)]) + kv
    parsed = pb.MessageMetadata.FromString(raw)
    assert invalid_string_field(parsed) == "properties.value"
