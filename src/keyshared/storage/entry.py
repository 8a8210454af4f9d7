"""An entry read back from a ledger."""

from __future__ import annotations

from dataclasses import dataclass

from keyshared.storage.position import Position


@dataclass(slots=True)
class Entry:
    """One stored entry: its position, its opaque bytes, and the CRC32C of those bytes.

    The checksum is the one the record was stored with, so a reader can forward it without
    computing it again.
    """

    position: Position
    data: bytes
    checksum: int
