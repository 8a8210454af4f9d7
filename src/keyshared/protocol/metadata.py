"""The payload section of SEND/MESSAGE: metadataSize, MessageMetadata, then the payload.

The broker stores the section opaquely and reads only a few metadata fields: the sticky key
(Key_Shared routing), the number of messages in a batch (permits, last message id), publish time
(seek by time) and deliver_at_time (delayed delivery). These helpers do that, and also take batch
bodies apart for tools and tests.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, cast

from google.protobuf.message import DecodeError

from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import Bytes
from keyshared.protocol.constants import NONE_KEY
from keyshared.protocol.errors import MalformedFrame, UnsupportedCompression

_U32 = struct.Struct(">I")


def _metadata_end(section: Bytes) -> int:
    """Where the metadata of a payload section ends (after its 4-byte size and itself)."""
    if len(section) < 4:
        raise MalformedFrame(f"payload section of {len(section)} bytes has no metadata size")
    size: int = _U32.unpack_from(section, 0)[0]
    end = 4 + size
    if end > len(section):
        raise MalformedFrame(
            f"metadata size {size} exceeds the payload section's {len(section) - 4} bytes"
        )
    return end


def split_payload(section: Bytes) -> tuple[pb.MessageMetadata, memoryview]:
    """Parse the metadata of a payload section and return it with a view of the payload after it.

    Raises :class:`MalformedFrame` if the section is truncated or the metadata unparseable,
    missing required fields, or has a ``producer_name`` or ``partition_key`` that is not UTF-8.
    Other string fields are not checked (the broker does not read them); use
    :func:`keyshared.protocol.validate.invalid_string_field` before trusting them.
    """
    view = memoryview(section)
    end = _metadata_end(view)
    metadata = pb.MessageMetadata()
    try:
        metadata.ParseFromString(cast(bytes, view[4:end]))
    except DecodeError as exc:
        raise MalformedFrame(f"unparseable message metadata: {exc}") from None
    if not metadata.IsInitialized():
        missing: list[str] = metadata.FindInitializationErrors()  # type: ignore[attr-defined]
        raise MalformedFrame(f"message metadata is missing required fields: {', '.join(missing)}")
    # proto2 leaves invalid UTF-8 in place (as bytes); check the strings the broker reads.
    if isinstance(metadata.producer_name, bytes) or (
        metadata.HasField("partition_key") and isinstance(metadata.partition_key, bytes)
    ):
        raise MalformedFrame("message metadata has a key or producer name that is not UTF-8")
    return metadata, view[end:]


_MessageMetadata = pb.MessageMetadata


def broker_fields(section: bytes) -> tuple[int, bytes, int, int, int, int]:
    """What the broker reads of every entry it stores, in one pass: ``(num_messages,
    sticky_key, publish_time, deliver_at_time or 0, event_time, marker_type)``.

    The same values and the same errors as :func:`split_payload` followed by
    :func:`num_messages` and :func:`sticky_key`, without their layers: on the publish path this
    runs once per SEND (``bench/results/profiles/publish-before.md``). The metadata is parsed
    from a ``bytes`` copy of its few bytes, which upb reads faster than a memoryview.
    """
    end = _metadata_end(section)
    try:
        md = _MessageMetadata.FromString(section[4:end])
    except DecodeError as exc:
        raise MalformedFrame(f"unparseable message metadata: {exc}") from None
    has = md.HasField
    producer_name = md.producer_name
    sequence_id = md.sequence_id
    publish_time = md.publish_time
    # IsInitialized only where a nested message could lack a required field, or one of the
    # three required fields of MessageMetadata may be missing (a set field with a value other
    # than the default is present: HasField, as dear as a parse, only for a default value).
    if (
        md.properties
        or md.encryption_keys
        or not (producer_name or has("producer_name"))
        or not (sequence_id or has("sequence_id"))
        or not (publish_time or has("publish_time"))
    ) and not md.IsInitialized():
        missing: list[str] = md.FindInitializationErrors()  # type: ignore[attr-defined]
        raise MalformedFrame(f"message metadata is missing required fields: {', '.join(missing)}")
    # proto2 leaves invalid UTF-8 in place (as bytes); check the strings the broker reads. An
    # unset string reads as "" (a str).
    partition_key = md.partition_key
    if isinstance(producer_name, bytes) or isinstance(partition_key, bytes):
        raise MalformedFrame("message metadata has a key or producer name that is not UTF-8")
    if has("ordering_key"):
        key: bytes = md.ordering_key
    elif partition_key or has("partition_key"):
        key = _b64decode(partition_key) if md.partition_key_b64_encoded else partition_key.encode()
    else:
        key = f"{producer_name}-{sequence_id}".encode()
    # num_messages_in_batch defaults to 1 and deliver_at_time to 0: what an unset field reads.
    return (
        md.num_messages_in_batch,
        key,
        publish_time,
        md.deliver_at_time,
        md.event_time,
        md.marker_type,
    )


def parse_metadata(section: Bytes) -> pb.MessageMetadata:
    """The ``MessageMetadata`` at the start of a payload section (see :func:`split_payload`)."""
    return split_payload(section)[0]


def encode_payload_section(metadata: pb.MessageMetadata, payload: Bytes = b"") -> bytes:
    """metadataSize + serialized ``metadata`` + ``payload``, as a producer sends it."""
    body = metadata.SerializeToString()
    return b"".join((_U32.pack(len(body)), body, payload))


def sticky_key(metadata: pb.MessageMetadata) -> bytes:
    """The bytes Key_Shared hashes for an entry, by Pulsar's ``Commands.resolveStickyKey`` rule.

    In order: ``ordering_key``; else ``partition_key`` (base64-decoded when
    ``partition_key_b64_encoded``); else ``producer_name + "-" + sequence_id`` so that un-keyed
    messages spread over consumers while chunks of one message stay together; else ``NONE_KEY``.
    A batch is routed by its outer metadata, which carries the first message's keys.
    """
    if metadata.HasField("ordering_key"):
        return metadata.ordering_key
    if metadata.HasField("partition_key"):
        key = metadata.partition_key
        if metadata.partition_key_b64_encoded:
            return _b64decode(key)
        return key.encode()
    if metadata.HasField("producer_name") and metadata.HasField("sequence_id"):
        return f"{metadata.producer_name}-{metadata.sequence_id}".encode()
    return NONE_KEY


def _b64decode(key: str) -> bytes:
    # Java's decoder, which Pulsar uses, does not insist on padding; an undecodable key falls back
    # to NONE_KEY as Pulsar's peekStickyKey does when it fails.
    try:
        return base64.b64decode(key + "=" * (-len(key) % 4), validate=True)
    except (binascii.Error, ValueError):
        return NONE_KEY


def num_messages(metadata: pb.MessageMetadata) -> int:
    """Messages in the entry: ``num_messages_in_batch`` for a batch, else 1."""
    if metadata.HasField("num_messages_in_batch"):
        return metadata.num_messages_in_batch
    return 1


def is_batch(metadata: pb.MessageMetadata) -> bool:
    """Whether the entry uses the batch format (presence of ``num_messages_in_batch``)."""
    return metadata.HasField("num_messages_in_batch")


def decompress(metadata: pb.MessageMetadata, payload: Bytes) -> bytes:
    """The uncompressed payload of an entry.

    ZLIB uses the standard library; LZ4, ZSTD and SNAPPY need their optional modules (``lz4``,
    ``zstandard``, ``snappy``) and raise :class:`UnsupportedCompression` without them. Corrupt
    data raises :class:`MalformedFrame`.
    """
    codec = metadata.compression
    if codec == pb.NONE:
        return bytes(payload)
    size = metadata.uncompressed_size
    try:
        if codec == pb.ZLIB:
            data = zlib.decompress(payload)
        elif codec == pb.LZ4:
            lz4_block = _codec_module("lz4.block", "LZ4")
            data = lz4_block.decompress(bytes(payload), uncompressed_size=size)
        elif codec == pb.ZSTD:
            zstandard = _codec_module("zstandard", "ZSTD")
            data = zstandard.ZstdDecompressor().decompress(bytes(payload), max_output_size=size)
        elif codec == pb.SNAPPY:
            snappy = _codec_module("snappy", "SNAPPY")
            data = snappy.uncompress(bytes(payload))
        else:
            raise UnsupportedCompression(f"unknown compression type {codec}")
    except UnsupportedCompression:
        raise
    except Exception as exc:  # codec libraries raise their own error types on corrupt input
        raise MalformedFrame(f"cannot decompress {pb.CompressionType.Name(codec)}: {exc}") from None
    result = bytes(data)
    if metadata.HasField("uncompressed_size") and len(result) != size:
        raise MalformedFrame(
            f"uncompressed size {len(result)} differs from the announced {size} bytes"
        )
    return result


def _codec_module(module: str, codec: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UnsupportedCompression(
            f"{codec} payloads need the optional Python module {module!r}"
        ) from None


def iter_batch(section: Bytes) -> Iterator[tuple[pb.SingleMessageMetadata, bytes]]:
    """The messages of an entry's payload section, decompressing the batch body first.

    A non-batched entry yields one message whose ``SingleMessageMetadata`` is built from the
    outer metadata's keys, properties and event time. Raises :class:`MalformedFrame` for a body
    that does not hold ``num_messages_in_batch`` well-formed messages.
    """
    metadata, payload = split_payload(section)
    body = decompress(metadata, payload)
    if not is_batch(metadata):
        yield _single_from_outer(metadata, len(body)), body
        return
    view = memoryview(body)
    pos = 0
    for index in range(metadata.num_messages_in_batch):
        if len(view) - pos < 4:
            raise MalformedFrame(f"batch body ends before message {index}")
        size: int = _U32.unpack_from(view, pos)[0]
        pos += 4
        if size > len(view) - pos:
            raise MalformedFrame(f"metadata of batch message {index} runs past the body")
        single = pb.SingleMessageMetadata()
        try:
            single.ParseFromString(cast(bytes, view[pos : pos + size]))
        except DecodeError as exc:
            raise MalformedFrame(f"unparseable metadata of batch message {index}: {exc}") from None
        if not single.IsInitialized():
            raise MalformedFrame(f"batch message {index} has no payload_size")
        pos += size
        payload_size = single.payload_size
        if payload_size < 0 or payload_size > len(view) - pos:
            raise MalformedFrame(f"payload of batch message {index} runs past the body")
        yield single, bytes(view[pos : pos + payload_size])
        pos += payload_size


def _single_from_outer(metadata: pb.MessageMetadata, size: int) -> pb.SingleMessageMetadata:
    single = pb.SingleMessageMetadata(payload_size=size)
    single.properties.extend(metadata.properties)
    if metadata.HasField("partition_key"):
        single.partition_key = metadata.partition_key
        single.partition_key_b64_encoded = metadata.partition_key_b64_encoded
    if metadata.HasField("ordering_key"):
        single.ordering_key = metadata.ordering_key
    if metadata.HasField("event_time"):
        single.event_time = metadata.event_time
    if metadata.HasField("null_value"):
        single.null_value = metadata.null_value
    single.sequence_id = metadata.sequence_id
    return single


def encode_batch(messages: Iterable[tuple[pb.SingleMessageMetadata, Bytes]]) -> bytes:
    """An uncompressed batch body; each message's ``payload_size`` is set from its payload."""
    parts: list[Bytes] = []
    for single, payload in messages:
        single.payload_size = len(payload)
        body = single.SerializeToString()
        parts += (_U32.pack(len(body)), body, payload)
    return b"".join(parts)
