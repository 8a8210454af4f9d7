"""ManagedCursor against a model: acks, reads, seeks, rewinds, resets, skips, restarts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keyshared.storage import batch_ack
from keyshared.storage.cursor import CursorConfig, ManagedCursor
from keyshared.storage.memory import InMemoryLedger, MemoryCursorStore
from keyshared.storage.position import EARLIEST, LATEST, Position

T = TypeVar("T")
BATCH = 4  # every entry counts as a batch of 4 messages for batch-index acks
INDEX = st.integers(min_value=0, max_value=60)


async def _await(aw: Awaitable[T]) -> T:
    return await aw


class CursorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.ledger = InMemoryLedger(max_entries_per_ledger=4, first_ledger_id=3)
        self.store = MemoryCursorStore()
        self.config = CursorConfig(mark_delete_rate_limit=0)
        self.cursor = ManagedCursor(
            "sub", self.ledger, self.store, initial_position=EARLIEST, config=self.config
        )
        self.positions: list[Position] = []
        self.acked: set[Position] = set()
        self.partial: dict[Position, int] = {}
        self.rp = 0  # model read position: an index into positions
        self.last_epoch = 0
        self.last_read: Position | None = None

    def teardown(self) -> None:
        self.loop.close()

    def run(self, aw: Awaitable[T]) -> T:
        return self.loop.run_until_complete(_await(aw))

    # --- model helpers ---------------------------------------------------------------------

    def prefix(self) -> int:
        k = 0
        while k < len(self.positions) and self.positions[k] in self.acked:
            k += 1
        return k

    def settle(self) -> None:
        self.rp = max(self.rp, self.prefix())
        for p in list(self.partial):
            if p in self.acked:
                del self.partial[p]

    def pick(self, i: int) -> Position:
        return self.positions[i % len(self.positions)]

    def unacked_from(self, idx: int) -> list[Position]:
        return [p for p in self.positions[idx:] if p not in self.acked]

    # --- rules -----------------------------------------------------------------------------

    @rule(n=st.integers(min_value=1, max_value=6))
    def add_entries(self, n: int) -> None:
        self.positions.extend(self.ledger.add_entries(n))

    @rule()
    def roll_empty_ledger(self) -> None:
        self.ledger.roll_ledger()

    @precondition(lambda self: self.positions)
    @rule(idx=st.lists(INDEX, min_size=1, max_size=6))
    def ack_individual(self, idx: list[int]) -> None:
        chosen = [self.pick(i) for i in idx]
        before = self.cursor.mark_delete_position
        moved = self.cursor.ack_individual(chosen)
        assert moved == (self.cursor.mark_delete_position != before)
        self.acked.update(chosen)
        self.settle()

    @rule(n=st.integers(min_value=1, max_value=6), backwards=st.booleans())
    def ack_next(self, n: int, backwards: bool) -> None:
        """Ack the first unacked entries (crossing ledger ends), one by one."""
        todo = self.unacked_from(0)[:n]
        for p in reversed(todo) if backwards else todo:
            self.cursor.ack_individual((p,))
        self.acked.update(todo)
        self.settle()

    @precondition(lambda self: self.positions)
    @rule(i=INDEX)
    def ack_cumulative(self, i: int) -> None:
        pos = self.pick(i)
        self.cursor.ack_cumulative(pos)
        self.acked.update(p for p in self.positions if p <= pos)
        self.settle()

    @precondition(lambda self: self.positions)
    @rule(i=INDEX, indexes=st.sets(st.integers(min_value=0, max_value=BATCH - 1)))
    def ack_batch_index(self, i: int, indexes: set[int]) -> None:
        pos = self.pick(i)
        if pos in self.acked:
            self.cursor.ack_batch_index(pos, [0], BATCH)
            assert self.cursor.is_acked(pos)
            return
        bits = self.partial.get(pos, batch_ack.full(BATCH))
        for k in indexes:
            bits &= ~(1 << k)
        self.cursor.ack_batch_index(pos, batch_ack.to_words(bits), BATCH)
        if bits == 0:
            self.acked.add(pos)
        elif bits != batch_ack.full(BATCH):
            self.partial[pos] = bits
        self.settle()

    @rule(n=st.integers(min_value=0, max_value=7))
    def read(self, n: int) -> None:
        expected = self.unacked_from(self.rp)[:n]
        result = self.run(self.cursor.read_entries(n))
        assert not result.stale
        got = [e.position for e in result.entries]
        assert got == expected
        assert not any(p in self.acked for p in got)
        if self.cursor.epoch == self.last_epoch and got and self.last_read is not None:
            # Within an epoch, a sequential read never goes back.
            assert got[0] > self.last_read
        if self.cursor.epoch != self.last_epoch:
            self.last_epoch = self.cursor.epoch
            self.last_read = None
        if got:
            self.last_read = got[-1]
        if len(got) < n:
            self.rp = len(self.positions)
        elif got:
            self.rp = self.positions.index(got[-1]) + 1

    @rule(idx=st.lists(INDEX, max_size=6))
    def replay(self, idx: list[int]) -> None:
        if not self.positions:
            return
        chosen = [self.pick(i) for i in idx]
        rp_before = self.cursor.read_position
        entries = self.run(self.cursor.replay_entries(chosen))
        assert [e.position for e in entries] == sorted({p for p in chosen if p not in self.acked})
        assert self.cursor.read_position == rp_before

    @rule(i=INDEX, past_end=st.booleans())
    def seek(self, i: int, past_end: bool) -> None:
        if past_end or not self.positions:
            self.cursor.seek(LATEST)
            self.rp = len(self.positions)
        else:
            self.cursor.seek(self.pick(i))
            self.rp = max(self.positions.index(self.pick(i)), self.prefix())

    @rule()
    def rewind(self) -> None:
        self.cursor.rewind()
        self.rp = self.prefix()

    @rule(i=INDEX, where=st.sampled_from(["pos", "earliest", "latest"]))
    def reset_cursor(self, i: int, where: str) -> None:
        if where == "pos" and self.positions:
            target = self.positions.index(self.pick(i))
            self.cursor.reset_cursor(self.positions[target])
        elif where == "earliest":
            target = 0
            self.cursor.reset_cursor(EARLIEST)
        else:
            target = len(self.positions)
            self.cursor.reset_cursor(LATEST)
        self.acked = set(self.positions[:target])
        self.partial.clear()
        self.rp = target

    @rule(n=st.integers(min_value=0, max_value=9))
    def skip_entries(self, n: int) -> None:
        todo = self.unacked_from(0)[:n]
        assert self.cursor.skip_entries(n) == len(todo)
        self.acked.update(todo)
        self.settle()

    @rule()
    def clear_backlog(self) -> None:
        self.cursor.clear_backlog()
        self.acked = set(self.positions)
        self.partial.clear()
        self.rp = len(self.positions)

    @rule()
    def restart(self) -> None:
        self.cursor.close()
        self.cursor = ManagedCursor(
            "sub", self.ledger, self.store, initial_position=LATEST, config=self.config
        )
        self.rp = self.prefix()
        self.last_epoch = 0
        self.last_read = None

    # --- invariants ------------------------------------------------------------------------

    @invariant()
    def mark_delete_is_the_acked_prefix(self) -> None:
        k = self.prefix()
        mdp = self.cursor.mark_delete_position
        if k:
            assert mdp == self.positions[k - 1]
        elif self.positions:
            assert mdp < self.positions[0]

    @invariant()
    def ack_state_matches(self) -> None:
        c = self.cursor
        for p in self.positions:
            assert c.is_acked(p) == (p in self.acked), p
        k = self.prefix()
        assert set(c.individually_deleted.positions()) == {
            p for p in self.positions[k:] if p in self.acked
        }
        for p in self.positions:
            words = c.get_ack_set(p)
            if p in self.partial:
                assert words == batch_ack.to_words(self.partial[p])
            else:
                assert words is None

    @invariant()
    def backlog_matches(self) -> None:
        c = self.cursor
        assert c.number_of_entries_in_backlog == len(self.positions) - len(self.acked)
        to_read = len(self.unacked_from(self.rp))
        assert c.number_of_entries_to_read == to_read
        assert c.has_more_entries() == (to_read > 0)
        assert {p for p in self.positions if p >= c.read_position and p not in self.acked} == set(
            self.unacked_from(self.rp)
        )
        stats: dict[str, Any] = c.internal_stats()
        assert stats["markDeletePosition"] == str(c.mark_delete_position)
        assert stats["totalNonContiguousDeletedMessagesRange"] == len(c.individually_deleted)


TestCursorMachine = CursorMachine.TestCase
TestCursorMachine.settings = settings(max_examples=250, stateful_step_count=40, deadline=None)
