"""InMemoryLedger position arithmetic and ControlledReader."""

from __future__ import annotations

import asyncio

import pytest

from keyshared.storage.memory import ControlledReader, InMemoryLedger, MemoryCursorStore
from keyshared.storage.position import Position

P = Position


def test_roll_over_and_positions() -> None:
    ledger = InMemoryLedger(first_ledger_id=5, max_entries_per_ledger=2, ledger_id_step=3)
    assert ledger.last_add_confirmed == P(5, -1)
    assert ledger.first_position is None
    assert ledger.add_entries(5) == [P(5, 0), P(5, 1), P(8, 0), P(8, 1), P(11, 0)]
    assert ledger.last_add_confirmed == P(11, 0)
    assert ledger.first_position == P(5, 0)
    assert ledger.count_entries(P(5, 1), P(11, 0)) == 4
    assert ledger.count_entries(P(0, 0), P(99, 0)) == 5
    assert ledger.count_entries(P(8, 1), P(8, 0)) == 0


def test_next_and_previous_position() -> None:
    ledger = InMemoryLedger(max_entries_per_ledger=2)
    ledger.add_entries(2)  # 1:0, 1:1; ledger 2 opened
    ledger.roll_ledger()  # 2 closed empty, 3 opened
    ledger.add_entries(1)  # 3:0
    assert ledger.next_position(P(1, -1)) == P(1, 0)
    assert ledger.next_position(P(1, 1)) == P(3, 0)  # over the empty ledger 2
    assert ledger.next_position(P(2, -1)) == P(3, 0)
    assert ledger.next_position(P(3, 0)) == P(3, 1)  # where the next entry goes
    assert ledger.next_position(P(0, 7)) == P(1, 0)
    assert ledger.next_position(P(3, 9)) == P(3, 10)
    assert ledger.previous_position(P(3, 0)) == P(1, 1)
    assert ledger.previous_position(P(1, 1)) == P(1, 0)
    assert ledger.previous_position(P(1, 0)) == P(1, -1)


def test_reads_cross_ledgers() -> None:
    ledger = InMemoryLedger(max_entries_per_ledger=3)
    ledger.add_entries(7)

    async def go() -> None:
        got = await ledger.read_entries(P(1, 2), 3)
        assert [e.position for e in got] == [P(1, 2), P(2, 0), P(2, 1)]
        assert await ledger.read_entries(P(3, 1), 5) == []
        entry = await ledger.read_entry(P(2, 2))
        assert entry is not None and entry.data == b"m5"
        assert await ledger.read_entry(P(2, 3)) is None

    asyncio.run(go())


def test_trim_keeps_the_current_ledger() -> None:
    ledger = InMemoryLedger(max_entries_per_ledger=2)
    ledger.add_entries(5)
    ledger.trim(P(2, 1))
    assert ledger.first_position == P(3, 0)
    ledger.trim(P(9, 9))
    assert ledger.first_position == P(3, 0)


def test_listeners() -> None:
    ledger = InMemoryLedger()
    calls: list[int] = []

    def cb() -> None:
        calls.append(1)

    ledger.add_entries_listener(cb)
    ledger.add_entry(b"a")
    ledger.remove_entries_listener(cb)
    ledger.remove_entries_listener(cb)
    ledger.add_entry(b"b")
    assert calls == [1]


def test_controlled_reader_holds_reads() -> None:
    ledger = InMemoryLedger()
    ledger.add_entries(3)
    reader = ControlledReader(ledger)

    async def go() -> None:
        a = reader.read_entries(P(1, 0), 10)
        b = reader.read_entry(P(1, 1))
        c = reader.read_entries(P(1, 0), 1)
        assert len(reader.pending_reads) == 3 and not a.done()
        ledger.add_entry(b"late")
        reader.complete(1)  # out of order
        assert (await b) is not None
        reader.complete()
        assert len(await a) == 4  # contents at completion time
        reader.fail(0, OSError("disk"))
        with pytest.raises(OSError):
            await c
        reader.hold = False
        assert len(await reader.read_entries(P(1, 2), 5)) == 2
        assert reader.complete_all() == 0

    asyncio.run(go())


def test_memory_store() -> None:
    store = MemoryCursorStore()
    assert store.load("x") is None
    store.save("x", b"1")
    assert store.load("x") == b"1" and store.saves == 1
    store.delete("x")
    store.delete("x")
    assert store.names() == []
