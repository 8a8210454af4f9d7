"""Sans-IO codec for Apache Pulsar's binary protocol: bytes in, frames out; commands in, bytes out.

No sockets and no asyncio here (the model is h11): feed received bytes to a
:class:`FrameDecoder` (or a :class:`ServerProtocol`, which adds the CONNECT handshake check) and
take :class:`Frame` objects out; build outgoing frames with the builders in
:mod:`keyshared.protocol.commands` and the hand-encoded hot paths :func:`encode_message` and
:func:`encode_send_receipt`.

``pb`` is the generated protobuf module of keyshared's own ``pulsar_api.proto`` (Pulsar's field
numbers, proto2 presence).
"""

from keyshared.protocol import commands
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.checksum import crc32c
from keyshared.protocol.connection import ConnectionState, ServerProtocol
from keyshared.protocol.constants import (
    DEFAULT_MAX_MESSAGE_SIZE,
    FRAME_PADDING,
    NONE_KEY,
    PROTOCOL_VERSION,
    max_frame_size,
)
from keyshared.protocol.encode import (
    encode_command,
    encode_message,
    encode_message_header,
    encode_payload_command,
    encode_send_receipt,
    to_int64,
    to_uint64,
)
from keyshared.protocol.errors import (
    FrameTooLarge,
    MalformedFrame,
    ProtocolError,
    ProtocolViolation,
    UnsupportedCompression,
)
from keyshared.protocol.framing import Frame, FrameDecoder, SendFrame
from keyshared.protocol.hashing import (
    DEFAULT_RANGE_SIZE,
    STICKY_KEY_HASH_NOT_SET,
    consistent_slot,
    murmur3_32,
    range_slot,
    slot_of_hash,
    sticky_key_hash,
)
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

__all__ = [
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_RANGE_SIZE",
    "FRAME_PADDING",
    "NONE_KEY",
    "PROTOCOL_VERSION",
    "STICKY_KEY_HASH_NOT_SET",
    "ConnectionState",
    "Frame",
    "FrameDecoder",
    "FrameTooLarge",
    "MalformedFrame",
    "ProtocolError",
    "ProtocolViolation",
    "SendFrame",
    "ServerProtocol",
    "UnsupportedCompression",
    "commands",
    "consistent_slot",
    "crc32c",
    "decompress",
    "encode_batch",
    "encode_command",
    "encode_message",
    "encode_message_header",
    "encode_payload_command",
    "encode_payload_section",
    "encode_send_receipt",
    "is_batch",
    "iter_batch",
    "max_frame_size",
    "murmur3_32",
    "num_messages",
    "parse_metadata",
    "pb",
    "range_slot",
    "slot_of_hash",
    "split_payload",
    "sticky_key",
    "sticky_key_hash",
    "to_int64",
    "to_uint64",
]
