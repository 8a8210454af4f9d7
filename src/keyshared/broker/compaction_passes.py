"""Topic compaction's two passes (Pulsar's ``TwoPhaseCompactor``), apart from any topic.

Both passes read the same sequence: the previous compacted view (if any), then the topic's
entries after its horizon, up to ``end``, through the compaction cursor. Pass 1 learns the
latest message of every key (an empty payload or ``null_value`` deletes the key; messages
without a key go unless ``retain_null_key``). Pass 2 *rewinds* the cursor and reads the range
again, handing every entry that still holds a survivor to ``write`` with its original position.

The rewind is the cursor's (seed issue-20277): it starts a new epoch. A read of either pass that
comes back stale, because someone else moved the compaction cursor by hand meanwhile (reset,
skip, clear-backlog, another rewind), is dropped as the epoch rule says, and the whole
compaction starts over from the cursor's new state; :class:`CompactionStats.restarts` counts
that. Nothing read under an old epoch ever reaches the output.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import cast

from keyshared.broker.compacted_view import CompactedEntry
from keyshared.crc import crc32c
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.errors import MalformedFrame, UnsupportedCompression
from keyshared.protocol.metadata import decompress, encode_payload_section, split_payload
from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.position import Position

_U32 = struct.Struct(">I")

# write(original position, payload section, its CRC32C, survivor mask or None for "all").
Writer = Callable[[Position, bytes, int, int | None], None]
PreviousChunks = Callable[[], AsyncIterator[list[CompactedEntry]]]

# A pass is abandoned and compaction restarted at most this many times.
MAX_RESTARTS = 5


class CursorMoved(Exception):
    """A read of a pass came back stale: the compaction cursor was moved by hand."""


class CompactionAborted(Exception):
    """The compaction cursor kept moving; compaction gave up."""


@dataclass(slots=True)
class CompactionStats:
    """What one compaction saw and kept."""

    entries_read: int = 0
    messages_read: int = 0
    keys: int = 0
    kept_entries: int = 0
    kept_messages: int = 0
    rewritten_batches: int = 0
    unreadable_entries: int = 0
    restarts: int = 0


@dataclass(slots=True)
class _Item:
    """One entry of the sequence both passes read."""

    position: Position
    data: bytes
    checksum: int
    mask: int | None


# --- reading messages out of an entry ---------------------------------------------------------


def entry_messages(data: bytes, mask: int | None) -> tuple[int, list[tuple[int, str | None, bool]]]:
    """``(num_messages, [(batch index, key, alive), ...])`` of an entry's live messages.

    ``alive`` is false for a tombstone (empty payload or ``null_value``). Indexes outside
    ``mask`` and ``compacted_out`` placeholders are left out. Raises
    :class:`UnsupportedCompression` or :class:`MalformedFrame` when the body cannot be read.
    """
    md, payload = split_payload(data)
    if not md.HasField("num_messages_in_batch"):
        key = md.partition_key if md.HasField("partition_key") else None
        size = md.uncompressed_size if md.compression != pb.NONE else len(payload)
        return 1, [(0, key, size > 0 and not md.null_value)]
    n = md.num_messages_in_batch
    out: list[tuple[int, str | None, bool]] = []
    for index, single, _start, _end in _walk_batch(md, payload):
        if (mask is not None and not (mask >> index) & 1) or single.compacted_out:
            continue
        key = single.partition_key if single.HasField("partition_key") else None
        out.append((index, key, single.payload_size > 0 and not single.null_value))
    return n, out


def _walk_batch(
    md: pb.MessageMetadata, payload: memoryview, body: bytes | None = None
) -> list[tuple[int, pb.SingleMessageMetadata, int, int]]:
    """``(index, metadata, start, end)`` of each message of a batch body; ``start:end`` spans
    the message's size prefix, metadata and payload in the uncompressed body."""
    if body is None:
        body = decompress(md, payload)
    view = memoryview(body)
    pos = 0
    out = []
    for index in range(md.num_messages_in_batch):
        if len(view) - pos < 4:
            raise MalformedFrame(f"batch body ends before message {index}")
        start = pos
        size: int = _U32.unpack_from(view, pos)[0]
        pos += 4
        single = pb.SingleMessageMetadata()
        try:
            single.ParseFromString(cast(bytes, view[pos : pos + size]))
        except Exception as exc:
            raise MalformedFrame(f"batch message {index}: {exc}") from None
        pos += size
        if single.payload_size < 0 or single.payload_size > len(view) - pos:
            raise MalformedFrame(f"payload of batch message {index} runs past the body")
        pos += single.payload_size
        out.append((index, single, start, pos))
    return out


_PLACEHOLDER = pb.SingleMessageMetadata(payload_size=0, compacted_out=True).SerializeToString()
_PLACEHOLDER_RECORD = _U32.pack(len(_PLACEHOLDER)) + _PLACEHOLDER


def rewrite_batch(data: bytes, keep: int) -> bytes | None:
    """The batch with every message outside ``keep`` replaced by a ``compacted_out``
    placeholder, uncompressed; None if the body cannot be read (the entry is then kept whole
    and the mask alone hides what was compacted out)."""
    try:
        md, payload = split_payload(data)
        body = decompress(md, payload)
        parts = [
            body[start:end] if (keep >> index) & 1 else _PLACEHOLDER_RECORD
            for index, _, start, end in _walk_batch(md, payload, body)
        ]
    except (UnsupportedCompression, MalformedFrame):
        return None
    new_md = pb.MessageMetadata()
    new_md.CopyFrom(md)
    new_md.compression = pb.NONE
    new_md.ClearField("uncompressed_size")
    return encode_payload_section(new_md, b"".join(parts))


# --- the passes -----------------------------------------------------------------------------


async def _sequence(
    cursor: ManagedCursor,
    previous: PreviousChunks | None,
    floor: Position,
    end: Position,
    read_batch: int,
) -> AsyncIterator[list[_Item]]:
    """The previous view's entries, then the topic's in ``(floor, end]`` read through the
    cursor from a rewind; raises :class:`CursorMoved` on a stale read."""
    if previous is not None:
        async for chunk in previous():
            yield [_Item(r.position, r.data, r.checksum, r.mask) for r in chunk]
            # Reads served from the cache complete without suspending: let the broker breathe.
            await asyncio.sleep(0)
    cursor.rewind()
    while cursor.read_position <= end:
        result = await cursor.read_entries(read_batch)
        if result.stale:
            raise CursorMoved(f"compaction cursor moved during a pass (epoch {result.epoch})")
        if not result.entries:
            break
        items = [
            _Item(e.position, e.data, e.checksum, None)
            for e in result.entries
            if floor < e.position <= end
        ]
        if items:
            yield items
        if result.entries[-1].position >= end:
            break
        await asyncio.sleep(0)


async def _pass_one(
    seq: AsyncIterator[list[_Item]], retain_null_key: bool, stats: CompactionStats
) -> dict[Position, int]:
    """Survivors: position -> bitmask of surviving batch indexes (-1: keep as it is)."""
    latest: dict[str, tuple[Position, int]] = {}
    survivors: dict[Position, int] = {}
    async for chunk in seq:
        for item in chunk:
            stats.entries_read += 1
            pos = item.position
            try:
                _, messages = entry_messages(item.data, item.mask)
            except (UnsupportedCompression, MalformedFrame):
                # Keys unknown: keep the entry whole rather than lose what it holds.
                stats.unreadable_entries += 1
                survivors[pos] = -1
                continue
            stats.messages_read += len(messages)
            for index, key, alive in messages:
                if key is None:
                    if retain_null_key:
                        survivors[pos] = survivors.get(pos, 0) | (1 << index)
                    continue
                if alive:
                    latest[key] = (pos, index)
                else:
                    latest.pop(key, None)
    stats.keys = len(latest)
    for pos, index in latest.values():
        bits = survivors.get(pos, 0)
        if bits != -1:
            survivors[pos] = bits | (1 << index)
    return survivors


async def _pass_two(
    seq: AsyncIterator[list[_Item]],
    survivors: dict[Position, int],
    write: Writer,
    stats: CompactionStats,
) -> None:
    async for chunk in seq:
        for item in chunk:
            bits = survivors.get(item.position)
            if bits is None:
                continue
            data, checksum, mask = item.data, item.checksum, item.mask
            if bits == -1:
                stats.kept_messages += 1
            else:
                stats.kept_messages += bits.bit_count()
                n = _num_messages(data)
                if n > 1 and bits != (1 << n) - 1:
                    mask = bits
                    if bits != item.mask:
                        rewritten = rewrite_batch(data, bits)
                        if rewritten is not None:
                            data, checksum = rewritten, crc32c(rewritten)
                            stats.rewritten_batches += 1
            write(item.position, data, checksum, mask)
            stats.kept_entries += 1


def _num_messages(data: bytes) -> int:
    md, _ = split_payload(data)
    return md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1


async def compact_range(
    cursor: ManagedCursor,
    previous: PreviousChunks | None,
    floor: Position,
    end: Position,
    write: Writer,
    *,
    retain_null_key: bool = False,
    read_batch: int = 500,
    reset_output: Callable[[], None] | None = None,
) -> CompactionStats:
    """Run both passes over the previous view and the topic's ``(floor, end]``.

    ``write`` receives the kept entries in order. When a pass is disturbed (stale read), the
    output so far is discarded through ``reset_output`` and both passes run again.
    """
    stats = CompactionStats()
    for attempt in range(MAX_RESTARTS + 1):
        try:
            survivors = await _pass_one(
                _sequence(cursor, previous, floor, end, read_batch), retain_null_key, stats
            )
            await _pass_two(
                _sequence(cursor, previous, floor, end, read_batch), survivors, write, stats
            )
            return stats
        except CursorMoved:
            if attempt == MAX_RESTARTS:
                raise CompactionAborted(
                    f"the compaction cursor moved {attempt + 1} times during compaction"
                ) from None
            stats = CompactionStats(restarts=stats.restarts + 1)
            if reset_output is not None:
                reset_output()
    raise AssertionError("unreachable")  # pragma: no cover
