"""A topic's compacted view: the entries compaction kept, each under its original message id.

Compaction writes the entries it keeps into a managed ledger of their own
(``<topic>/__compacted/<n>``). Each record there is::

    original ledger id (int64) | original entry id (int64) | CRC32C of the section (uint32)
    | mask length in bytes (uint16) | mask (little-endian bitset) | payload section

The payload section is the entry as the producer sent it, except for a batch some of whose
messages were compacted out: those messages are replaced by empty placeholders with
``compacted_out`` set (Pulsar's format), so every survivor keeps its batch index. The mask has a
bit set for each surviving index (no mask: every message survives). Dispatch sends it as the
MESSAGE ``ack_set``, which is how the C++ client (and so the Python one) is told to skip an index.

The view keeps an index of the original positions in memory (16 bytes per kept entry, packed in
two ``array('q')``), built while compaction writes or, after a restart, by one scan.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import AsyncIterator
from dataclasses import dataclass

from keyshared.storage.entry import Entry
from keyshared.storage.ledger import ManagedLedger
from keyshared.storage.position import Position

_HEADER = struct.Struct(">qqIH")
HEADER_SIZE = _HEADER.size
# Entry ids stay below 2**32 (ledgers roll over far earlier), so a position packs in an int64.
_SHIFT = 32


def pack(pos: Position) -> int:
    """A position as one sortable int."""
    return (pos.ledger_id << _SHIFT) | pos.entry_id


def unpack(value: int) -> Position:
    """The inverse of :func:`pack`."""
    return Position(value >> _SHIFT, value & ((1 << _SHIFT) - 1))


def encode_record(original: Position, section: bytes, checksum: int, mask: int | None) -> bytes:
    """One compacted-ledger record (see the module docstring)."""
    mask_bytes = b"" if mask is None else mask.to_bytes((mask.bit_length() + 7) // 8, "little")
    header = _HEADER.pack(original.ledger_id, original.entry_id, checksum, len(mask_bytes))
    return b"".join((header, mask_bytes, section))


@dataclass(slots=True)
class CompactedEntry:
    """A decoded record: the original position, its section, checksum and survivor mask."""

    position: Position
    data: bytes
    checksum: int
    mask: int | None


def decode_record(record: bytes) -> CompactedEntry:
    """The inverse of :func:`encode_record`."""
    ledger_id, entry_id, checksum, mask_len = _HEADER.unpack_from(record, 0)
    start = HEADER_SIZE + mask_len
    mask = int.from_bytes(record[HEADER_SIZE:start], "little") if mask_len else None
    return CompactedEntry(Position(ledger_id, entry_id), record[start:], checksum, mask)


class CompactedView:
    """The compacted ledger of a topic up to ``horizon``, readable by original position."""

    def __init__(self, name: str, horizon: Position, ledger: ManagedLedger) -> None:
        self.name = name
        self.horizon = horizon
        self.ledger = ledger
        self._original = array("q")
        self._stored = array("q")
        self._indexed = False
        # Reads in flight; the view is deleted only once they are over.
        self.readers = 0
        self.retired = False

    def __len__(self) -> int:
        return len(self._original)

    # --- building ----------------------------------------------------------------------------

    def record_written(self, original: Position, stored: Position) -> None:
        """Index a record compaction just appended (records come in original order)."""
        self._original.append(pack(original))
        self._stored.append(pack(stored))

    def mark_indexed(self) -> None:
        """Every record is in the index."""
        self._indexed = True

    async def ensure_index(self, chunk: int = 1000) -> None:
        """Build the index by scanning the ledger (after a restart)."""
        if self._indexed:
            return
        original = array("q")
        stored = array("q")
        pos = self.ledger.first_position
        lac = self.ledger.last_add_confirmed
        while pos is not None and pos <= lac:
            batch = await self.ledger.read_entries(pos, chunk)
            if not batch:
                break
            for e in batch:
                ledger_id, entry_id = struct.unpack_from(">qq", e.data, 0)
                original.append((ledger_id << _SHIFT) | entry_id)
                stored.append(pack(e.position))
            pos = self.ledger.next_position(batch[-1].position)
        if not self._indexed:
            self._original, self._stored = original, stored
            self._indexed = True

    # --- reading -----------------------------------------------------------------------------

    @property
    def first_original(self) -> Position | None:
        """The original position of the first kept entry."""
        return unpack(self._original[0]) if self._original else None

    def index_at_or_after(self, pos: Position) -> int:
        """The index of the first kept entry whose original position is ``pos`` or later."""
        if pos.entry_id < 0:
            pos = Position(pos.ledger_id, 0)
        return bisect_left(self._original, pack(pos))

    async def read(self, start: Position, max_entries: int) -> list[CompactedEntry]:
        """Up to ``max_entries`` kept entries whose original position is ``start`` or later."""
        await self.ensure_index()
        i = self.index_at_or_after(start)
        n = len(self._stored)
        if i >= n or max_entries <= 0:
            return []
        first = unpack(self._stored[i])
        want = min(max_entries, n - i)
        records = await self.ledger.read_entries(first, want)
        return [decode_record(r.data) for r in records]

    async def last(self) -> CompactedEntry | None:
        """The last kept entry, or None when nothing was kept."""
        await self.ensure_index()
        if not self._stored:
            return None
        record = await self.ledger.read_entry(unpack(self._stored[-1]))
        return decode_record(record.data) if record is not None else None

    async def chunks(self, chunk: int = 1000) -> AsyncIterator[list[CompactedEntry]]:
        """Every kept entry, in order, ``chunk`` at a time (compaction's two passes)."""
        pos = self.ledger.first_position
        lac = self.ledger.last_add_confirmed
        while pos is not None and pos <= lac:
            batch = await self.ledger.read_entries(pos, chunk)
            if not batch:
                break
            yield [decode_record(e.data) for e in batch]
            pos = self.ledger.next_position(batch[-1].position)


def as_entry(record: CompactedEntry) -> Entry:
    """The record as an entry of the topic, at its original position."""
    return Entry(record.position, record.data, record.checksum)
