"""Reads in flight against manual moves, acks and appends, in any interleaving (seed issue-20277).

Every read goes through a ControlledReader, so hypothesis chooses when each one completes
relative to seeks, rewinds, resets, skips, clear-backlogs, cancels, acks and appends. Each
completion is checked at the instant it happens:

* a read whose epoch is no longer the cursor's comes back stale, empty, and moved nothing;
* a read that is not stale returns, in order, exactly the unacked entries from where it started
  to its last entry (nothing acked, nothing skipped), then the read position is past it;
* within one epoch, sequential reads never go back;
* a replay returns exactly the requested entries still unacked, or nothing if the epoch moved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keyshared.storage.cursor import CursorConfig, ManagedCursor, ReadResult
from keyshared.storage.memory import ControlledReader, InMemoryLedger
from keyshared.storage.position import EARLIEST, LATEST, Position

INDEX = st.integers(min_value=0, max_value=50)


class CursorRaceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.ledger = InMemoryLedger(max_entries_per_ledger=5)
        self.ledger.add_entries(6)
        self.reader = ControlledReader(self.ledger)
        self.cursor = ManagedCursor(
            "sub",
            self.reader,
            None,
            durable=False,
            initial_position=EARLIEST,
            config=CursorConfig(),
        )
        self.expected_rp = self.cursor.read_position
        self.tasks: list[asyncio.Future[Any]] = []
        self.last_read: dict[int, Position] = {}  # epoch -> last entry read in it
        self.completed = 0
        self.stale = 0
        self.acks = 0  # ack operations so far (a read in flight may see some of them)

    def teardown(self) -> None:
        self.cursor.cancel_pending_read()
        for _ in range(20):
            self.reader.complete_all()
            self.settle()
        for t in self.tasks:
            t.cancel()
        self.settle()
        self.loop.close()

    def settle(self) -> None:
        # Enough turns for a completion to travel reader -> cursor -> the checking task.
        for _ in range(30):
            self.loop.run_until_complete(asyncio.sleep(0))

    def spawn(self, aw: Awaitable[Any]) -> None:
        self.tasks.append(asyncio.ensure_future(aw, loop=self.loop))

    # --- checks run at the instant a read completes ------------------------------------------

    async def sequential(self, n: int, wait: bool) -> None:
        c = self.cursor
        issued_epoch = c.epoch
        start = c.read_position
        acks_before = self.acks
        aw = c.read_entries_or_wait(n) if wait else c.read_entries(n)
        result: ReadResult = await aw
        # No await from here on: this is the cursor's state at completion.
        self.completed += 1
        assert result.epoch == issued_epoch
        if result.stale:
            self.stale += 1
            assert not result.entries
            assert c.read_position == self.expected_rp
            assert result.cancelled or c.epoch != issued_epoch
            return
        assert c.epoch == issued_epoch
        assert c.read_position >= self.expected_rp  # a completion never moves it back
        got = [e.position for e in result.entries]
        assert len(got) <= n
        assert got == sorted(set(got))
        assert not any(c.is_acked(p) for p in got)
        if wait and n > 0:
            assert got
        if got:
            assert got[0] >= start
            skipped = [
                p
                for p in self.ledger.positions()
                if start <= p <= got[-1] and not c.is_acked(p) and p not in got
            ]
            assert not skipped
            assert c.read_position > got[-1]
            prev = self.last_read.get(issued_epoch)
            assert prev is None or got[0] > prev
            self.last_read[issued_epoch] = got[-1]
        if len(got) < n and self.acks == acks_before:
            # Fewer than asked means nothing else was there, unless acks landed while the read
            # was in flight: entries acked meanwhile are dropped from the result, not replaced.
            rest = [p for p in self.ledger.positions() if p >= start and not c.is_acked(p)]
            assert set(rest) <= set(got)
        self.expected_rp = c.read_position

    async def replayed(self, positions: list[Position]) -> None:
        c = self.cursor
        epoch = c.epoch
        entries = await c.replay_entries(positions)
        got = [e.position for e in entries]
        if c.epoch != epoch:
            assert got == []
            return
        existing = set(self.ledger.positions())
        assert got == sorted({p for p in positions if p in existing and not c.is_acked(p)})

    # --- rules -----------------------------------------------------------------------------

    @rule(n=st.integers(min_value=1, max_value=4))
    def append(self, n: int) -> None:
        self.ledger.add_entries(n)
        self.settle()

    @rule(idx=st.lists(INDEX, min_size=1, max_size=4))
    def ack(self, idx: list[int]) -> None:
        ps = self.ledger.positions()
        self.acks += 1
        self.cursor.ack_individual(ps[i % len(ps)] for i in idx)
        self.expected_rp = self.cursor.read_position  # the mark-delete may pass it
        self.settle()

    @rule(i=INDEX)
    def ack_cumulative(self, i: int) -> None:
        ps = self.ledger.positions()
        self.acks += 1
        self.cursor.ack_cumulative(ps[i % len(ps)])
        self.expected_rp = self.cursor.read_position
        self.settle()

    @precondition(lambda self: not self.cursor.has_pending_read)
    @rule(n=st.integers(min_value=0, max_value=6), wait=st.booleans())
    def start_read(self, n: int, wait: bool) -> None:
        self.spawn(self.sequential(n, wait))
        self.settle()

    @rule(idx=st.lists(INDEX, max_size=5))
    def start_replay(self, idx: list[int]) -> None:
        ps = self.ledger.positions()
        self.spawn(self.replayed([ps[i % len(ps)] for i in idx]))
        self.settle()

    @precondition(lambda self: self.reader.pending_reads)
    @rule(i=INDEX)
    def complete_one(self, i: int) -> None:
        self.reader.complete(i % len(self.reader.pending_reads))
        self.settle()

    @rule(
        move=st.sampled_from(["seek", "rewind", "reset", "reset-latest", "skip", "clear"]),
        i=INDEX,
    )
    def manual_move(self, move: str, i: int) -> None:
        c = self.cursor
        ps = self.ledger.positions()
        before = c.epoch
        if move == "seek":
            c.seek(ps[i % len(ps)])
        elif move == "rewind":
            c.rewind()
        elif move == "reset":
            c.reset_cursor(ps[i % len(ps)])
        elif move == "reset-latest":
            c.reset_cursor(LATEST)
        elif move == "skip":
            c.skip_entries(i % 4)
        else:
            c.clear_backlog()
        assert c.epoch == before + 1
        assert not c.has_pending_read
        self.expected_rp = c.read_position
        self.settle()

    @rule()
    def cancel(self) -> None:
        self.cursor.cancel_pending_read()
        self.settle()

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def nobody_else_moves_the_read_position(self) -> None:
        assert self.cursor.read_position == self.expected_rp

    @invariant()
    def nothing_is_stuck(self) -> None:
        # Every unfinished read awaits either the reader or, for the current epoch's read
        # only, new entries; a waiting read with something to read should have been woken.
        waiting = self.cursor.is_waiting_for_entries
        if waiting:
            assert not self.cursor.has_more_entries()
        unfinished = sum(1 for t in self.tasks if not t.done())
        assert unfinished <= len(self.reader.pending_reads) + (1 if waiting else 0)

    @invariant()
    def no_check_failed(self) -> None:
        for t in self.tasks:
            if t.done() and not t.cancelled():
                t.result()
        self.tasks = [t for t in self.tasks if not t.done()]


TestCursorRaces = CursorRaceMachine.TestCase
TestCursorRaces.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
