"""In-memory stand-ins for a managed ledger and a cursor state store, for tests and simulation.

:class:`InMemoryLedger` implements the cursor's ``EntryReader`` with the same position rules as
the real ``ManagedLedger``: entry ids are dense within a ledger, ledgers roll over after
``max_entries_per_ledger`` entries, and positions step across ledger ends.

:class:`ControlledReader` wraps one and holds every read until the test (or a seeded simulator)
releases it, so the order in which reads complete, relative to everything else, is chosen by
the caller: the races of the cursor-epoch seed become reproducible.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from keyshared.crc import crc32c
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position


class InMemoryLedger:
    """A managed ledger that lives in a list: every added entry is durable at once."""

    def __init__(
        self,
        *,
        first_ledger_id: int = 1,
        max_entries_per_ledger: int | None = None,
        ledger_id_step: int = 1,
    ) -> None:
        if max_entries_per_ledger is not None and max_entries_per_ledger <= 0:
            raise ValueError("max_entries_per_ledger must be positive")
        self.max_entries_per_ledger = max_entries_per_ledger
        self.ledger_id_step = ledger_id_step
        self._ids: list[int] = [first_ledger_id]
        self._entries: list[list[Entry]] = [[]]
        self._listeners: list[Callable[[], None]] = []
        self.reads = 0

    # --- writing ---------------------------------------------------------------------------

    def add_entry(self, data: bytes) -> Position:
        """Append ``data``; returns its position. Listeners are told synchronously."""
        cur = self._entries[-1]
        pos = Position(self._ids[-1], len(cur))
        cur.append(Entry(pos, data, crc32c(data)))
        if self.max_entries_per_ledger is not None and len(cur) >= self.max_entries_per_ledger:
            self.roll_ledger()
        for cb in list(self._listeners):
            cb()
        return pos

    def add_entries(self, count: int, prefix: bytes = b"m") -> list[Position]:
        """Append ``count`` entries ``prefix + index``; returns their positions."""
        return [self.add_entry(prefix + str(i).encode()) for i in range(count)]

    def roll_ledger(self) -> int:
        """Close the current ledger and open a new (empty) one; returns the new id."""
        new_id = self._ids[-1] + self.ledger_id_step
        self._ids.append(new_id)
        self._entries.append([])
        return new_id

    def trim(self, up_to: Position) -> None:
        """Forget whole ledgers whose entries are all ``<= up_to`` (never the current one)."""
        while len(self._ids) > 1:
            last = len(self._entries[0]) - 1
            if Position(self._ids[0], last) > up_to:
                break
            del self._ids[0]
            del self._entries[0]

    # --- EntryReader -----------------------------------------------------------------------

    @property
    def last_add_confirmed(self) -> Position:
        """The last entry; ``(current ledger, -1)`` when there is none."""
        for lid, ents in zip(reversed(self._ids), reversed(self._entries), strict=True):
            if ents:
                return Position(lid, len(ents) - 1)
        return Position(self._ids[-1], -1)

    @property
    def first_position(self) -> Position | None:
        """The first entry, or None."""
        for lid, ents in zip(self._ids, self._entries, strict=True):
            if ents:
                return Position(lid, 0)
        return None

    def entries_from(self, start: Position, max_entries: int) -> list[Entry]:
        """Synchronous :meth:`read_entries`."""
        out: list[Entry] = []
        i = bisect_left(self._ids, start.ledger_id)
        first = (
            max(start.entry_id, 0) if i < len(self._ids) and self._ids[i] == start.ledger_id else 0
        )
        while i < len(self._ids) and len(out) < max_entries:
            ents = self._entries[i]
            out.extend(ents[first : first + max_entries - len(out)])
            i += 1
            first = 0
        return out

    def entry_at(self, pos: Position) -> Entry | None:
        """Synchronous :meth:`read_entry`."""
        i = bisect_left(self._ids, pos.ledger_id)
        if i == len(self._ids) or self._ids[i] != pos.ledger_id:
            return None
        ents = self._entries[i]
        return ents[pos.entry_id] if 0 <= pos.entry_id < len(ents) else None

    async def read_entries(self, start: Position, max_entries: int) -> list[Entry]:
        """Entries at or after ``start``, in order, across ledgers; at most ``max_entries``."""
        self.reads += 1
        return self.entries_from(start, max_entries)

    async def read_entry(self, pos: Position) -> Entry | None:
        """The entry at ``pos``, or None."""
        self.reads += 1
        return self.entry_at(pos)

    def next_position(self, pos: Position) -> Position:
        """The first entry after ``pos``; if none, where the next added entry will go."""
        ids = self._ids
        i = bisect_left(ids, pos.ledger_id)
        if i < len(ids) and ids[i] == pos.ledger_id:
            nxt = max(pos.entry_id + 1, 0)
            if nxt < len(self._entries[i]) or i == len(ids) - 1:
                return Position(pos.ledger_id, nxt)
            i += 1
        for j in range(i, len(ids)):
            if self._entries[j] or j == len(ids) - 1:
                return max(Position(ids[j], 0), Position(pos.ledger_id, pos.entry_id + 1))
        return Position(pos.ledger_id, pos.entry_id + 1)

    def previous_position(self, pos: Position) -> Position:
        """The last entry before ``pos``; ``(pos.ledger_id, -1)`` when nothing precedes it."""
        if pos.entry_id > 0:
            return Position(pos.ledger_id, pos.entry_id - 1)
        i = bisect_left(self._ids, pos.ledger_id)
        for j in range(i - 1, -1, -1):
            if self._entries[j]:
                return Position(self._ids[j], len(self._entries[j]) - 1)
        return Position(pos.ledger_id, -1)

    def count_entries(self, start: Position, end: Position) -> int:
        """Entries in the closed span ``[start, end]``."""
        if end < start:
            return 0
        total = 0
        ids = self._ids
        for k in range(bisect_left(ids, start.ledger_id), bisect_right(ids, end.ledger_id)):
            lid = ids[k]
            lo = max(start.entry_id, 0) if lid == start.ledger_id else 0
            hi = len(self._entries[k]) - 1
            if lid == end.ledger_id:
                hi = min(hi, end.entry_id)
            if hi >= lo:
                total += hi - lo + 1
        return total

    def positions(self) -> list[Position]:
        """Every entry's position, in order."""
        return [e.position for ents in self._entries for e in ents]

    def add_entries_listener(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` after every add."""
        self._listeners.append(cb)

    def remove_entries_listener(self, cb: Callable[[], None]) -> None:
        """Stop calling ``cb`` (no error if absent)."""
        if cb in self._listeners:
            self._listeners.remove(cb)

    @property
    def listener_count(self) -> int:
        """How many entries listeners are registered."""
        return len(self._listeners)


@dataclass(slots=True)
class PendingRead:
    """A read held by :class:`ControlledReader` until released."""

    start: Position
    max_entries: int  # 1 for a single-entry read
    single: bool
    future: asyncio.Future[Any] = field(repr=False)


class ControlledReader:
    """An ``EntryReader`` over an :class:`InMemoryLedger` whose reads complete on command.

    Each read is queued in :attr:`pending_reads`; :meth:`complete` answers one with the
    ledger's contents *at that moment*. With ``hold=False`` reads answer at once (still through
    a future, so the caller yields to the loop exactly as with a real ledger).
    """

    def __init__(self, ledger: InMemoryLedger, *, hold: bool = True) -> None:
        self.ledger = ledger
        self.hold = hold
        self.pending_reads: list[PendingRead] = []

    @property
    def last_add_confirmed(self) -> Position:
        """The wrapped ledger's."""
        return self.ledger.last_add_confirmed

    @property
    def first_position(self) -> Position | None:
        """The wrapped ledger's."""
        return self.ledger.first_position

    def read_entries(self, start: Position, max_entries: int) -> asyncio.Future[list[Entry]]:
        """Queue a read of up to ``max_entries`` from ``start``."""
        fut: asyncio.Future[list[Entry]] = asyncio.get_running_loop().create_future()
        read = PendingRead(start, max_entries, False, fut)
        self.pending_reads.append(read)
        if not self.hold:
            self.complete(len(self.pending_reads) - 1)
        return fut

    def read_entry(self, pos: Position) -> asyncio.Future[Entry | None]:
        """Queue a read of the entry at ``pos``."""
        fut: asyncio.Future[Entry | None] = asyncio.get_running_loop().create_future()
        self.pending_reads.append(PendingRead(pos, 1, True, fut))
        if not self.hold:
            self.complete(len(self.pending_reads) - 1)
        return fut

    def complete(self, index: int = 0) -> PendingRead:
        """Answer pending read ``index`` (0: the oldest) with the ledger's current contents."""
        read = self.pending_reads.pop(index)
        if not read.future.done():
            if read.single:
                read.future.set_result(self.ledger.entry_at(read.start))
            else:
                read.future.set_result(self.ledger.entries_from(read.start, read.max_entries))
        return read

    def complete_all(self) -> int:
        """Answer every pending read, oldest first; returns how many."""
        n = 0
        while self.pending_reads:
            self.complete(0)
            n += 1
        return n

    def fail(self, index: int = 0, exc: BaseException | None = None) -> PendingRead:
        """Fail pending read ``index`` with ``exc`` (an ``OSError`` by default)."""
        read = self.pending_reads.pop(index)
        if not read.future.done():
            read.future.set_exception(exc if exc is not None else OSError("read failed"))
        return read

    def next_position(self, pos: Position) -> Position:
        """The wrapped ledger's."""
        return self.ledger.next_position(pos)

    def previous_position(self, pos: Position) -> Position:
        """The wrapped ledger's."""
        return self.ledger.previous_position(pos)

    def count_entries(self, start: Position, end: Position) -> int:
        """The wrapped ledger's."""
        return self.ledger.count_entries(start, end)

    def add_entries_listener(self, cb: Callable[[], None]) -> None:
        """The wrapped ledger's."""
        self.ledger.add_entries_listener(cb)

    def remove_entries_listener(self, cb: Callable[[], None]) -> None:
        """The wrapped ledger's."""
        self.ledger.remove_entries_listener(cb)


class MemoryCursorStore:
    """A ``CursorStateStore`` in a dict; counts saves so tests can check rate limiting."""

    def __init__(self) -> None:
        self.states: dict[str, bytes] = {}
        self.saves = 0

    def load(self, cursor_name: str) -> bytes | None:
        """The stored state, or None."""
        return self.states.get(cursor_name)

    def save(self, cursor_name: str, state: bytes) -> None:
        """Store ``state``."""
        self.states[cursor_name] = state
        self.saves += 1

    def delete(self, cursor_name: str) -> None:
        """Forget the cursor."""
        self.states.pop(cursor_name, None)

    def names(self) -> Sequence[str]:
        """Stored cursor names."""
        return sorted(self.states)
