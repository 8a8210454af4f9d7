"""What a managed cursor is made of: the ledger it reads (:class:`EntryReader`), its read
results and errors, and :class:`CursorState`, the state every part of the cursor shares with
the read-only views of it (positions, backlog, internal stats) and the two moves of the
mark-delete position that keep it consistent.

The parts that change the state build on it, one over the other (``cursor_persistence``,
``cursor_acks``, ``cursor_reads``, ``cursor_moves``), and ``cursor.ManagedCursor`` is the whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from keyshared.storage.entry import Entry
from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet

if TYPE_CHECKING:
    from keyshared.storage.cursor_config import CursorConfig
    from keyshared.storage.cursor_persistence import CursorPersister, CursorStateStore


class EntryReader(Protocol):
    """What a cursor needs from a managed ledger.

    Entry ids are dense within a ledger (0, 1, 2, ...); ledger ids only grow.
    """

    @property
    def last_add_confirmed(self) -> Position:
        """The last durable entry; when there is none, a position before the first entry."""
        ...

    @property
    def first_position(self) -> Position | None:
        """The first existing entry, or None."""
        ...

    def read_entries(self, start: Position, max_entries: int) -> Awaitable[list[Entry]]:
        """Durable entries at or after ``start``, in order, across ledgers; at most
        ``max_entries``, possibly fewer; empty when there are none."""
        ...

    def read_entry(self, pos: Position) -> Awaitable[Entry | None]:
        """The durable entry at ``pos``, or None."""
        ...

    def next_position(self, pos: Position) -> Position:
        """The first entry after ``pos`` (stepping over ledger ends); when there is none, a
        position after ``last_add_confirmed`` and not after the next entry to be added."""
        ...

    def previous_position(self, pos: Position) -> Position:
        """The last entry before ``pos`` (``(L, e - 1)`` when ``e > 0``); when there is none,
        ``(pos.ledger_id, -1)``."""
        ...

    def count_entries(self, start: Position, end: Position) -> int:
        """How many entries exist in the closed span ``[start, end]``."""
        ...

    def add_entries_listener(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` whenever ``last_add_confirmed`` advances."""
        ...

    def remove_entries_listener(self, cb: Callable[[], None]) -> None:
        """Stop calling ``cb`` (no error if it is not registered)."""
        ...


@dataclass(slots=True)
class ReadResult:
    """The outcome of a sequential read.

    ``stale``: the cursor was moved by hand (or the read cancelled) while the read was in
    flight; ``entries`` is then empty and the read position did not move.
    """

    entries: list[Entry]
    epoch: int
    stale: bool = False
    cancelled: bool = False


class CursorError(Exception):
    """A cursor operation that cannot be done."""


class CursorClosedError(CursorError):
    """The cursor was closed or deleted."""


class PendingReadError(CursorError):
    """A sequential read is already in flight in the current epoch."""


@dataclass(slots=True, eq=False)
class ReadOp:
    """A sequential read in flight: the epoch it was issued in, and what may end it early."""

    epoch: int
    cancelled: bool = False
    waiter: asyncio.Future[None] | None = field(default=None, repr=False)


def wake(op: ReadOp) -> None:
    """End ``op``'s wait for new entries, if it waits."""
    waiter = op.waiter
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def stale(op: ReadOp) -> ReadResult:
    """The result of ``op`` when the cursor was moved by hand or the read cancelled."""
    return ReadResult([], op.epoch, stale=True, cancelled=op.cancelled)


class CursorState:
    """A cursor's state and the views of it (see ``cursor.ManagedCursor``, which sets it up)."""

    name: str
    durable: bool
    config: CursorConfig
    _reader: EntryReader
    _store: CursorStateStore | None
    _clock: Callable[[], float]
    _persister: CursorPersister | None
    _epoch: int
    _mdp: Position
    _read_position: Position
    _acked: RangeSet
    # Position -> int bitset of the batch's still-unacked indexes (a SortedDict).
    _batch: Any
    _pending: ReadOp | None
    _replays: int
    _listening: bool
    _listener: Callable[[], None]
    _closed: bool
    _dirty: bool
    messages_consumed_counter: int

    # --- state -----------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """How many times the read position was moved by hand."""
        return self._epoch

    @property
    def mark_delete_position(self) -> Position:
        """Every entry at or before it is acked."""
        return self._mdp

    @property
    def read_position(self) -> Position:
        """Where the next sequential read starts."""
        return self._read_position

    @property
    def individually_deleted(self) -> RangeSet:
        """Acked entries after the mark-delete position (read only)."""
        return self._acked

    @property
    def batch_deleted_indexes(self) -> Mapping[Position, int]:
        """Partially acked batch entries: position -> bitset of still-unacked indexes."""
        return self._batch  # type: ignore[no-any-return]

    @property
    def last_add_confirmed(self) -> Position:
        """The ledger's last durable entry."""
        return self._reader.last_add_confirmed

    @property
    def reader(self) -> EntryReader:
        """The ledger this cursor reads."""
        return self._reader

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`delete` was called."""
        return self._closed

    @property
    def has_pending_read(self) -> bool:
        """Whether a sequential read of the current epoch is in flight or waiting."""
        return self._pending is not None

    @property
    def is_waiting_for_entries(self) -> bool:
        """Whether the pending read is waiting for entries to be added."""
        op = self._pending
        return op is not None and op.waiter is not None

    @property
    def pending_replay_reads(self) -> int:
        """Replay reads in flight."""
        return self._replays

    @property
    def is_dirty(self) -> bool:
        """Whether the ack state changed since it was last persisted."""
        return self._dirty

    def __repr__(self) -> str:
        return (
            f"ManagedCursor({self.name!r}, mark_delete={self._mdp}, read={self._read_position}, "
            f"ranges={len(self._acked)}, epoch={self._epoch})"
        )

    def is_acked(self, pos: Position) -> bool:
        """Whether ``pos`` is acked (a partially acked batch is not)."""
        return pos <= self._mdp or pos in self._acked

    def _advance_mark_delete(self) -> bool:
        """Swallow the ranges that continue the mark-delete position."""
        acked = self._acked
        reader = self._reader
        moved = False
        while True:
            r = acked.first_range()
            if r is None:
                break
            first, last = r
            mdp = self._mdp
            if not (
                (first.ledger_id == mdp.ledger_id and first.entry_id == mdp.entry_id + 1)
                or first <= reader.next_position(mdp)
            ):
                break
            self._mdp = last
            acked.remove_up_to(last)
            moved = True
        return moved

    def _mark_delete_moved_quietly(self) -> None:
        mdp = self._mdp
        if self._batch:
            for pos in list(self._batch.irange(maximum=mdp)):
                del self._batch[pos]
        if self._read_position <= mdp:
            self._read_position = self._reader.next_position(mdp)

    # --- backlog ---------------------------------------------------------------------------

    @property
    def number_of_entries_in_backlog(self) -> int:
        """Entries after the mark-delete position that are not acked."""
        lac = self._reader.last_add_confirmed
        mdp = self._mdp
        if lac <= mdp:
            return 0
        total = self._reader.count_entries(Position(mdp.ledger_id, mdp.entry_id + 1), lac)
        return max(total - self._acked.count, 0)

    @property
    def number_of_entries_to_read(self) -> int:
        """Unacked entries at or after the read position."""
        rp = self._read_position
        lac = self._reader.last_add_confirmed
        if rp > lac:
            return 0
        return self._reader.count_entries(rp, lac) - self._acked.cardinality(rp, lac)

    @property
    def number_of_entries_since_first_not_acked(self) -> int:
        """Entries in ``(mark-delete, read position]`` (Pulsar's internal-stats figure)."""
        mdp = self._mdp
        return self._reader.count_entries(
            Position(mdp.ledger_id, mdp.entry_id + 1), self._read_position
        )

    def internal_stats(self, max_ranges: int | None = None) -> dict[str, Any]:
        """The cursor section of Pulsar's ``internalStats``, with its field names."""
        op = self._pending
        return {
            "markDeletePosition": str(self._mdp),
            "readPosition": str(self._read_position),
            "waitingReadOp": op is not None and op.waiter is not None,
            "pendingReadOps": (1 if op is not None and op.waiter is None else 0) + self._replays,
            "messagesConsumedCounter": self.messages_consumed_counter,
            "cursorLedger": -1,
            "cursorLedgerLastEntry": -1,
            "individuallyDeletedMessages": self._acked.to_pulsar_string(max_ranges),
            "lastLedgerSwitchTimestamp": "",
            "state": "Closed" if self._closed else "Open",
            "active": not self._closed,
            "numberOfEntriesSinceFirstNotAckedMessage": (
                self.number_of_entries_since_first_not_acked
            ),
            "totalNonContiguousDeletedMessagesRange": len(self._acked),
            "subscriptionHavePendingRead": op is not None,
            "subscriptionHavePendingReplayRead": self._replays > 0,
            "properties": {},
        }
