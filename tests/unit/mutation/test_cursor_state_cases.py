"""Cursor cases for ``storage/cursor_state.py`` that ``make mutate`` found no test saying
(bench/results/mutation/report.md)."""

from __future__ import annotations

import asyncio

from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.memory import InMemoryLedger
from keyshared.storage.position import EARLIEST, Position

P = Position


def test_a_skip_whose_mark_delete_lands_on_the_read_position_reads_on_after_it() -> None:
    # Pulsar's markDelete moves the read position past the new mark-delete when the read
    # position is at or before it: a skipped entry is not read, even the one the read was at.
    async def go() -> None:
        ledger = InMemoryLedger()
        ledger.add_entries(10)
        c = ManagedCursor("c", ledger, None, durable=False, initial_position=EARLIEST)
        first = await c.read_entries(3)
        assert [e.position for e in first.entries] == [P(1, 0), P(1, 1), P(1, 2)]
        assert c.read_position == P(1, 3)
        assert c.skip_entries(4) == 4  # entries 0..3: the mark-delete is (1, 3)
        assert c.mark_delete_position == P(1, 3)
        assert c.read_position == P(1, 4)
        after = await c.read_entries(2)
        assert [e.position for e in after.entries] == [P(1, 4), P(1, 5)]

    asyncio.run(go())
