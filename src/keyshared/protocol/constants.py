"""Protocol-wide numbers shared by the codec and the server."""

from __future__ import annotations

PROTOCOL_VERSION = 20
"""Highest protocol version we speak (pulsar-client 3.13 / C++ 4.2.0 sends 20)."""

DEFAULT_MAX_MESSAGE_SIZE = 5 * 1024 * 1024
"""Pulsar's default ``maxMessageSize`` (5 MiB), advertised in CONNECTED."""

FRAME_PADDING = 10 * 1024
"""Room for command and metadata on top of ``maxMessageSize`` (Pulsar's MESSAGE_SIZE_FRAME_PADDING)."""

MAGIC_CRC32C = 0x0E01
"""Two bytes announcing a CRC32C over the rest of a payload frame."""

MAGIC_BROKER_ENTRY_METADATA = 0x0E02
"""Two bytes announcing a BrokerEntryMetadata section (broker to client only)."""

NONE_KEY = b"NONE_KEY"
"""Sticky key of an entry whose metadata yields no key (Pulsar's ``Commands.NONE_KEY``)."""

UINT64_MASK = (1 << 64) - 1
"""Mask turning a signed 64-bit id (e.g. ledger/entry -1) into its uint64 wire value."""


def max_frame_size(max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> int:
    """Largest frame (the 4-byte ``totalSize`` value) to accept for a given ``maxMessageSize``."""
    return max_message_size + FRAME_PADDING
