"""Compaction's two passes over a cursor whose read completions the test controls: the second
pass rewinds (a new epoch), and a read in flight when someone moves the cursor by hand is dropped
without moving anything (seed issue-20277); the compaction then starts over."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from keyshared.broker.compacted_view import CompactedEntry, decode_record, encode_record
from keyshared.broker.compaction_passes import (
    CompactionStats,
    compact_range,
    entry_messages,
    rewrite_batch,
)
from keyshared.protocol import pulsar_api_pb2 as pb
from keyshared.protocol.metadata import encode_batch, encode_payload_section, iter_batch
from keyshared.storage.cursor import ManagedCursor, ReadResult
from keyshared.storage.memory import ControlledReader, InMemoryLedger
from keyshared.storage.position import EARLIEST, Position

L = 1


def P(entry: int) -> Position:
    return Position(L, entry)


def single(key: str | None, value: bytes, seq: int = 0) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=seq, publish_time=1)
    if key is not None:
        md.partition_key = key
    return encode_payload_section(md, value)


def batch(messages: list[tuple[str | None, bytes]]) -> bytes:
    md = pb.MessageMetadata(
        producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=len(messages)
    )
    singles = []
    for key, value in messages:
        meta = pb.SingleMessageMetadata(payload_size=0)
        if key is not None:
            meta.partition_key = key
        singles.append((meta, value))
    return encode_payload_section(md, encode_batch(singles))


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


class Output:
    """The compacted records, as compaction wrote them (cleared on a restart)."""

    def __init__(self) -> None:
        self.records: list[CompactedEntry] = []

    def write(self, pos: Position, section: bytes, checksum: int, mask: int | None) -> None:
        self.records.append(decode_record(encode_record(pos, section, checksum, mask)))

    def reset(self) -> None:
        self.records.clear()

    def view(self) -> list[tuple[Position, int | None]]:
        return [(r.position, r.mask) for r in self.records]


def setup(sections: list[bytes]) -> tuple[ControlledReader, ManagedCursor]:
    ledger = InMemoryLedger(first_ledger_id=L)
    for s in sections:
        ledger.add_entry(s)
    reader = ControlledReader(ledger)
    cursor = ManagedCursor("__compaction", reader, None, durable=False, initial_position=EARLIEST)
    return reader, cursor


def spy_reads(cursor: ManagedCursor) -> list[tuple[bool, Position, list[Position]]]:
    """Record each sequential read's outcome and the read position right after it."""
    log: list[tuple[bool, Position, list[Position]]] = []
    original = cursor.read_entries

    async def read(n: int) -> ReadResult:
        result = await original(n)
        log.append((result.stale, cursor.read_position, [e.position for e in result.entries]))
        return result

    cursor.read_entries = read  # type: ignore[method-assign]
    return log


def test_latest_per_key_and_tombstones() -> None:
    async def scenario() -> None:
        sections = [
            single("a", b"a1"),
            single("b", b"b1"),
            single("a", b"a2"),
            single(None, b"no key"),
            single("c", b"c1"),
            single("b", b""),  # deletes b
            single("c", b"c2"),
        ]
        reader, cursor = setup(sections)
        reader.hold = False
        out = Output()
        stats = await compact_range(cursor, None, EARLIEST, P(6), out.write)
        assert out.view() == [(P(2), None), (P(6), None)]
        assert stats.keys == 2 and stats.kept_entries == 2 and stats.restarts == 0
        # The epoch went up once per pass: each pass starts with a rewind.
        assert cursor.epoch == 2

        out = Output()
        await compact_range(cursor, None, EARLIEST, P(6), out.write, retain_null_key=True)
        assert out.view() == [(P(2), None), (P(3), None), (P(6), None)]

    run(scenario())


def test_stale_read_during_pass_two_is_dropped_and_compaction_restarts() -> None:
    async def scenario() -> None:
        sections = [single(f"k{i % 4}", f"v{i}".encode()) for i in range(12)]
        reader, cursor = setup(sections)
        log = spy_reads(cursor)
        out = Output()
        task = asyncio.ensure_future(
            compact_range(cursor, None, EARLIEST, P(11), out.write, read_batch=3)
        )
        await settle()
        # Pass 1: complete reads until pass 2's rewind (epoch 2) has a read in flight.
        while cursor.epoch < 2:
            assert reader.pending_reads
            reader.complete()
            await settle()
        assert reader.pending_reads and cursor.has_pending_read
        # Someone moves the compaction cursor by hand while pass 2 reads entries 0..2.
        cursor.seek(P(7))
        assert cursor.read_position == P(7)
        written_before = len(out.records)
        reader.complete()
        await settle()
        stale = [entry for entry in log if entry[0]]
        assert len(stale) == 1
        _, position_after, entries = stale[0]
        # The stale completion delivered nothing and left the hand-set read position alone.
        assert entries == [] and position_after == P(7)
        assert len(out.records) == written_before
        # Compaction starts over (new rewinds) and finishes with each survivor exactly once.
        while not task.done():
            reader.complete_all()
            await settle()
        stats: CompactionStats = task.result()
        assert stats.restarts == 1
        assert out.view() == [(P(8), None), (P(9), None), (P(10), None), (P(11), None)]

    run(scenario())


def test_batches_keep_indexes_and_mask_survivors() -> None:
    async def scenario() -> None:
        sections = [
            batch([("a", b"a1"), ("b", b"b1"), ("c", b"c1"), (None, b"n")]),
            batch([("a", b"a2"), ("d", b"")]),
            batch([("x", b"x1"), ("y", b"y1")]),
        ]
        reader, cursor = setup(sections)
        reader.hold = False
        out = Output()
        stats = await compact_range(cursor, None, EARLIEST, P(2), out.write)
        # Entry 0 keeps b and c (indexes 1, 2); entry 1 keeps a (index 0); entry 2 is whole.
        assert out.view() == [(P(0), 0b0110), (P(1), 0b01), (P(2), None)]
        assert stats.rewritten_batches == 2
        first = list(iter_batch(out.records[0].data))
        assert [s.compacted_out for s, _ in first] == [True, False, False, True]
        assert [p for _, p in first] == [b"", b"b1", b"c1", b""]
        # A second compaction reads the first one's output through its mask.
        n, msgs = entry_messages(out.records[0].data, out.records[0].mask)
        assert n == 4 and msgs == [(1, "b", True), (2, "c", True)]

    run(scenario())


def test_unreadable_batch_is_kept_whole() -> None:
    async def scenario() -> None:
        md = pb.MessageMetadata(
            producer_name="p", sequence_id=0, publish_time=1, num_messages_in_batch=2
        )
        md.compression = pb.ZLIB
        corrupt = encode_payload_section(md, b"not zlib at all")
        assert rewrite_batch(corrupt, 0b01) is None
        reader, cursor = setup([single("a", b"a1"), corrupt, single("a", b"a2")])
        reader.hold = False
        out = Output()
        stats = await compact_range(cursor, None, EARLIEST, P(2), out.write)
        assert out.view() == [(P(1), None), (P(2), None)]
        assert stats.unreadable_entries == 1

    run(scenario())
