"""The managed cursor: a subscription's position in a managed ledger, and its ack state.

State, as in Pulsar's ``ManagedCursorImpl``:

* ``mark_delete_position``: every entry at or before it is acked;
* ``individually_deleted``: acked entries after it (a :class:`RangeSet` of holes' complement);
* per-entry batch bitsets for partially acked batches (a set bit = a message still unacked);
* ``read_position``: where the next *sequential* read starts;
* ``epoch``: how many times the read position was moved by hand (seed issue-20277 / PIP-269).

The epoch is the part Pulsar never shipped. A sequential read carries the epoch it was issued
in; when it completes, it moves the read position only if no seek, rewind, reset, skip or
clear-backlog happened meanwhile. Otherwise its result is marked ``stale``, its entries are
dropped and nothing moves, so a stale completion can never overwrite a position set by hand.
Replay reads carry the epoch too and come back empty when it changed.

Reads go through the narrow :class:`EntryReader`, so tests and the simulator can hand the cursor
an in-memory ledger whose read completions they schedule (``keyshared.storage.memory``).
Persistence goes through :class:`CursorStateStore`, rate limited as Pulsar's mark-delete and
truncated at ``max_unacked_ranges_to_persist`` ranges (seed PIP-299): whatever was acked but
not persisted comes back unacked after a restart (duplicates, never loss).

Await points (where other coroutines may move the cursor) are only the reader's read calls and
the wait for new entries; every one is followed by an epoch check.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sortedcontainers import SortedDict

from keyshared.storage import batch_ack
from keyshared.storage.cursor_codec import CursorSnapshot, decode_snapshot, encode_snapshot
from keyshared.storage.entry import Entry
from keyshared.storage.errors import StorageError
from keyshared.storage.position import LATEST, Position
from keyshared.storage.range_set import RangeSet

if TYPE_CHECKING:
    from keyshared.config import BrokerConfig

log = logging.getLogger(__name__)

_NO_END = 1 << 63


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


class CursorStateStore(Protocol):
    """Where durable cursors keep their state (the real one is a SQLite table)."""

    def load(self, cursor_name: str) -> bytes | None:
        """The last saved state, or None."""
        ...

    def save(self, cursor_name: str, state: bytes) -> None:
        """Replace the saved state (synchronous: durable when it returns)."""
        ...

    def delete(self, cursor_name: str) -> None:
        """Forget the cursor."""
        ...


class KeyValue(Protocol):
    """A byte-valued key-value store (``MetadataStore`` has this shape)."""

    def get(self, key: str) -> bytes | None:
        """The value at ``key``, or None."""
        ...

    def put(self, key: str, value: bytes) -> None:
        """Set ``key``."""
        ...

    def delete(self, key: str) -> bool:
        """Remove ``key``; whether it existed."""
        ...


class KeyValueCursorStore:
    """A :class:`CursorStateStore` over a key-value store: cursor ``c`` lives at
    ``prefix + c`` (e.g. ``cursors/<managed ledger>/``)."""

    def __init__(self, kv: KeyValue, prefix: str) -> None:
        self.kv = kv
        self.prefix = prefix

    def load(self, cursor_name: str) -> bytes | None:
        """The saved state, or None."""
        return self.kv.get(self.prefix + cursor_name)

    def save(self, cursor_name: str, state: bytes) -> None:
        """Replace the saved state."""
        self.kv.put(self.prefix + cursor_name, state)

    def delete(self, cursor_name: str) -> None:
        """Forget the cursor."""
        self.kv.delete(self.prefix + cursor_name)


@dataclass(frozen=True, slots=True)
class CursorConfig:
    """Cursor settings, with the ``broker.conf`` key each one mirrors."""

    # managedLedgerMaxUnackedRangesToPersist (10000): ack ranges persisted; the rest stay in
    # memory only and are redelivered after a restart.
    max_unacked_ranges_to_persist: int = 10_000
    # managedLedgerMaxUnackedRangesToPersistInMetadataStore (1000): Pulsar's cap for ranges
    # written to ZooKeeper rather than a cursor ledger. We have one store, so it is advisory.
    max_unacked_ranges_to_persist_in_metadata_store: int = 1_000
    # managedLedgerMaxBatchDeletedIndexToPersist (10000): partially acked batches persisted.
    max_batch_deleted_index_to_persist: int = 10_000
    # managedLedgerDefaultMarkDeleteRateLimit (1.0): persists per second per cursor; 0 = every
    # mark-delete is persisted.
    mark_delete_rate_limit: float = 1.0
    # managedLedgerCursorPositionFlushSeconds (60): how often the owner should call flush().
    position_flush_seconds: float = 60.0
    # acknowledgmentAtBatchIndexLevelEnabled: keep per-index acks of batch entries.
    batch_index_ack_enabled: bool = True
    # Ours: persist (rate limited) when the mark-delete moves, as Pulsar does. Off, acks only
    # mark the cursor dirty and the owner's periodic flush() writes it, e.g. to batch the
    # writes of many cursors into one transaction.
    persist_on_mark_delete: bool = True

    @classmethod
    def from_broker_config(cls, conf: BrokerConfig) -> CursorConfig:
        """The cursor settings of a broker configuration."""
        return cls(
            max_unacked_ranges_to_persist=conf.managedLedgerMaxUnackedRangesToPersist,
            max_unacked_ranges_to_persist_in_metadata_store=(
                conf.managedLedgerMaxUnackedRangesToPersistInMetadataStore
            ),
            max_batch_deleted_index_to_persist=conf.managedLedgerMaxBatchDeletedIndexToPersist,
            mark_delete_rate_limit=conf.managedLedgerDefaultMarkDeleteRateLimit,
            position_flush_seconds=float(conf.managedLedgerCursorPositionFlushSeconds),
            batch_index_ack_enabled=conf.acknowledgmentAtBatchIndexLevelEnabled,
        )


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
class _ReadOp:
    epoch: int
    cancelled: bool = False
    waiter: asyncio.Future[None] | None = field(default=None, repr=False)


class PreparedState(NamedTuple):
    """A cursor's state to save, and what it records once saved."""

    data: bytes
    time: float
    mark_delete: Position
    total_ranges: int
    range_count: int
    batch_count: int


class CursorPersister:
    """Group commit of cursor state over one key-value store: the ack path schedules its cursor
    instead of saving at once, and every cursor scheduled in one turn of the loop is saved in one
    transaction (one sync) at the end of it. With 10,000 subscriptions acking now and then, each
    ack that moved a mark-delete position was a synced SQLite write of its own on the loop: a
    quarter of the loop's busy time at 1,000 slow topics. A cursor saved this way is saved in the same
    turn of the loop as before, only later in it, so a crash finds the same state."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        self._pending: dict[ManagedCursor, None] = {}
        self._scheduled = False
        self.commits = 0
        self.saved = 0

    def schedule(self, cursor: ManagedCursor) -> None:
        """Save ``cursor`` (rate limited as ``persist``) at the end of this turn of the loop."""
        store = cursor._store
        if not isinstance(store, KeyValueCursorStore) or store.kv is not self._kv:
            cursor.persist()
            return
        if not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                cursor.persist()
                return
            loop.call_soon(self.run)
            self._scheduled = True
        self._pending[cursor] = None

    def run(self) -> None:
        """Save every scheduled cursor in one transaction."""
        self._scheduled = False
        cursors, self._pending = list(self._pending), {}
        batch: list[tuple[ManagedCursor, PreparedState, str]] = []
        for cursor in cursors:
            state = cursor.prepare_persist()
            store = cursor._store
            if state is not None and isinstance(store, KeyValueCursorStore):
                batch.append((cursor, state, store.prefix + cursor.name))
        if not batch:
            return
        try:
            put_many = getattr(self._kv, "put_many", None)
            if put_many is not None:
                put_many([(key, state.data) for _, state, key in batch])
            else:
                for _, state, key in batch:
                    self._kv.put(key, state.data)
        except Exception as exc:  # StorageError mostly; every cursor must hear of it
            for cursor, state, _ in batch:
                cursor.persist_failed(state, exc)
            return
        self.commits += 1
        self.saved += len(batch)
        for cursor, state, _ in batch:
            cursor.persisted(state)


class ManagedCursor:
    """A subscription's cursor over a managed ledger (see the module docstring)."""

    def __init__(
        self,
        name: str,
        reader: EntryReader,
        store: CursorStateStore | None = None,
        *,
        durable: bool = True,
        initial_position: Position = LATEST,
        config: CursorConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        persister: CursorPersister | None = None,
    ) -> None:
        self.name = name
        self.durable = durable
        self.config = config if config is not None else CursorConfig()
        self._reader = reader
        self._store = store if durable else None
        self._clock = clock
        # Group commit of the ack path's saves (see CursorPersister); None: saved at once.
        self._persister = persister
        self._epoch = 0
        self._acked = RangeSet()
        # Position -> int bitset of the batch's still-unacked indexes.
        self._batch: Any = SortedDict()
        self._pending: _ReadOp | None = None
        self._replays = 0
        self._listening = False
        self._listener = self._on_entries_added
        self._closed = False
        self._dirty = False
        self.messages_consumed_counter = 0
        self.last_persist_time = float("-inf")
        self.last_persisted_mark_delete: Position | None = None
        self.last_persisted_range_count = 0
        self.last_persisted_total_ranges = 0
        self.last_persisted_batch_count = 0
        self.last_persisted_bytes = 0
        self.persist_count = 0
        self.persist_failing = False

        data = self._store.load(name) if self._store is not None else None
        if data is not None:
            self._restore(data)
        else:
            self._read_position = self._resolve(initial_position)
            self._mdp = reader.previous_position(self._read_position)
            if self._store is not None:
                self.persist(force=True)

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

    # --- acks ------------------------------------------------------------------------------

    def is_acked(self, pos: Position) -> bool:
        """Whether ``pos`` is acked (a partially acked batch is not)."""
        return pos <= self._mdp or pos in self._acked

    def ack_individual(self, positions: Iterable[Position]) -> bool:
        """Ack each of ``positions``; returns whether the mark-delete position moved.

        Positions at or before the mark-delete, or after the last durable entry, are ignored.
        """
        lac = self._reader.last_add_confirmed
        acked = self._acked
        batch = self._batch
        mdp = start_mdp = self._mdp
        added = 0
        for pos in positions:
            if pos <= mdp or pos > lac or pos.entry_id < 0:
                continue
            if batch and pos in batch:
                del batch[pos]
            if not acked and pos.ledger_id == mdp.ledger_id and pos.entry_id == mdp.entry_id + 1:
                # In-order ack with no holes: the common case costs no range-set work.
                mdp = pos
                added += 1
                continue
            added += acked.add(pos)
        if not added:
            return False
        self._mdp = mdp
        self._dirty = True
        self.messages_consumed_counter += added
        if acked:
            self._advance_mark_delete()
        if self._mdp != start_mdp:
            self._mark_delete_moved()
            return True
        return False

    def ack_cumulative(self, pos: Position) -> bool:
        """Ack everything up to and including ``pos``; returns whether the mark-delete moved.

        Raises ``ValueError`` past the last durable entry (Pulsar's "Invalid mark deleted
        position").
        """
        old = self._mdp
        if pos <= old:
            return False
        reader = self._reader
        if pos > reader.last_add_confirmed:
            raise ValueError(f"cannot mark-delete {pos}: after the last entry")
        removed = self._acked.remove_up_to(pos)
        newly = reader.count_entries(Position(old.ledger_id, old.entry_id + 1), pos) - removed
        self.messages_consumed_counter += max(newly, 0)
        self._mdp = pos
        self._dirty = True
        if self._acked:
            self._advance_mark_delete()
        self._mark_delete_moved()
        return True

    def ack_batch_index(self, pos: Position, ack_set: Sequence[int], batch_size: int) -> bool:
        """Ack some messages of the batch at ``pos``; ``ack_set`` has a bit SET for each index
        still unacked (wire layout). When none is left the entry is acked as a whole.

        Returns whether the mark-delete position moved.
        """
        if self.is_acked(pos) or pos > self._reader.last_add_confirmed:
            return False
        current = self._batch.get(pos)
        if current is None:
            current = batch_ack.full(batch_size) if batch_size > 0 else -1
        bits = batch_ack.intersect(current, ack_set, batch_size)
        if bits == 0:
            return self.ack_individual((pos,))
        if self.config.batch_index_ack_enabled and bits != current:
            self._batch[pos] = bits
            self._dirty = True
        return False

    def get_ack_set(self, pos: Position) -> list[int] | None:
        """The still-unacked bitset of a partially acked batch (for ``MESSAGE.ack_set``), or
        None when no index of the entry at ``pos`` was acked on its own."""
        bits = self._batch.get(pos)
        return batch_ack.to_words(bits) if bits is not None else None

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

    def _mark_delete_moved(self) -> None:
        mdp = self._mdp
        batch = self._batch
        if batch and batch.peekitem(0)[0] <= mdp:
            for pos in list(batch.irange(maximum=mdp)):
                del batch[pos]
        if self._read_position <= mdp:
            self._read_position = self._reader.next_position(mdp)
        if self.config.persist_on_mark_delete:
            persister = self._persister
            if persister is not None:
                persister.schedule(self)
            else:
                self.persist()

    # --- sequential reads ------------------------------------------------------------------

    def read_entries(self, max_entries: int) -> Awaitable[ReadResult]:
        """Read up to ``max_entries`` unacked entries from the read position.

        Returns at once with no entries when nothing is there to read. The read carries the
        current epoch: if the cursor is moved by hand before it completes, the result is
        ``stale`` and the read position stays where the hand put it. Otherwise the read
        position moves past the last entry read. Raises :class:`PendingReadError` if a read of
        the current epoch is already in flight.
        """
        return self._run_read(self._start_op(), max_entries, wait=False)

    def read_entries_or_wait(self, max_entries: int) -> Awaitable[ReadResult]:
        """Like :meth:`read_entries`, but waits until there is something to read.

        A manual move of the cursor or :meth:`cancel_pending_read` ends the wait with a
        ``stale`` result.
        """
        return self._run_read(self._start_op(), max_entries, wait=True)

    def cancel_pending_read(self) -> bool:
        """Cancel the read in flight or waiting: it completes ``stale`` and ``cancelled`` and
        moves nothing. Returns whether there was one."""
        op = self._pending
        if op is None:
            return False
        op.cancelled = True
        self._pending = None
        _wake(op)
        return True

    def has_more_entries(self) -> bool:
        """Whether a sequential read would find an unacked entry now."""
        return self._before_end(self._skip_acked(self._read_position))

    def _start_op(self) -> _ReadOp:
        if self._closed:
            raise CursorClosedError(f"cursor {self.name} is closed")
        if self._pending is not None:
            raise PendingReadError(f"cursor {self.name} already has a read in flight")
        op = _ReadOp(self._epoch)
        self._pending = op
        return op

    async def _run_read(self, op: _ReadOp, max_entries: int, *, wait: bool) -> ReadResult:
        try:
            while True:
                if op.cancelled or op.epoch != self._epoch:
                    return _stale(op)
                if not wait or self.has_more_entries():
                    before = self._read_position
                    result = await self._read_once(op, max_entries)
                    if (
                        result.entries
                        or result.stale
                        or not wait
                        or max_entries <= 0
                        or self._read_position == before
                    ):
                        return result
                    # Everything read was acked meanwhile: wait for more.
                    continue
                await self._wait_for_entries(op)
        finally:
            if self._pending is op:
                self._pending = None

    async def _read_once(self, op: _ReadOp, max_entries: int) -> ReadResult:
        reader = self._reader
        out: list[Entry] = []
        pos = self._skip_acked(self._read_position)
        while len(out) < max_entries and self._before_end(pos):
            batch = await reader.read_entries(pos, max_entries - len(out))
            if op.cancelled or op.epoch != self._epoch:
                return _stale(op)
            if not batch:
                break
            mdp = self._mdp
            acked = self._acked
            if acked:
                out.extend(e for e in batch if e.position > mdp and e.position not in acked)
            elif batch[0].position > mdp:
                out.extend(batch)
            else:
                out.extend(e for e in batch if e.position > mdp)
            # Acks may have moved the mark-delete (and the read position with it) past what
            # this read has reached: go on from there rather than re-read acked entries.
            pos = self._skip_acked(
                max(reader.next_position(batch[-1].position), self._read_position)
            )
        if pos > self._read_position:
            self._read_position = pos
        # Entries kept after an earlier await may have been acked during a later one.
        mdp = self._mdp
        acked = self._acked
        if out and (out[0].position <= mdp or acked):
            out = [e for e in out if e.position > mdp and e.position not in acked]
        return ReadResult(out, op.epoch)

    def _before_end(self, pos: Position) -> bool:
        lac = self._reader.last_add_confirmed
        # An entry id of -1 means the ledger holds no entry at all.
        return lac.entry_id >= 0 and pos <= lac

    def _skip_acked(self, pos: Position) -> Position:
        """``pos``, or the first position after the acked range it falls in."""
        acked = self._acked
        if not acked:
            return pos
        while True:
            r = acked.range_containing(pos)
            if r is None:
                return pos
            pos = self._reader.next_position(r[1])

    async def _wait_for_entries(self, op: _ReadOp) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        op.waiter = fut
        if not self._listening:
            self._reader.add_entries_listener(self._listener)
            self._listening = True
        try:
            await fut
        finally:
            op.waiter = None
            if self._listening and (self._pending is None or self._pending.waiter is None):
                self._reader.remove_entries_listener(self._listener)
                self._listening = False

    def _on_entries_added(self) -> None:
        op = self._pending
        if op is not None:
            _wake(op)

    # --- replay reads ----------------------------------------------------------------------

    def replay_entries(self, positions: Sequence[Position]) -> Awaitable[list[Entry]]:
        """Read the given positions again (redelivery), in position order.

        Acked positions (before or after the read) and positions that do not exist are left
        out. Never moves the read position. The read carries the current epoch: if the cursor
        is moved by hand before it completes, the result is empty, as its entries belong to a
        state that no longer exists.
        """
        if self._closed:
            raise CursorClosedError(f"cursor {self.name} is closed")
        return self._replay(self._epoch, sorted({p for p in positions if not self.is_acked(p)}))

    async def _replay(self, epoch: int, wanted: list[Position]) -> list[Entry]:
        if not wanted:
            return []
        reader = self._reader
        out: list[Entry] = []
        self._replays += 1
        try:
            i = 0
            n = len(wanted)
            while i < n:
                # One ranged read per run of consecutive entry ids.
                first = wanted[i]
                j = i + 1
                while (
                    j < n
                    and wanted[j].ledger_id == first.ledger_id
                    and wanted[j].entry_id == first.entry_id + (j - i)
                ):
                    j += 1
                if j - i == 1:
                    entry = await reader.read_entry(first)
                    got = [entry] if entry is not None else []
                else:
                    got = await reader.read_entries(first, j - i)
                if self._epoch != epoch:
                    return []
                last = wanted[j - 1]
                out.extend(e for e in got if first <= e.position <= last)
                i = j
        finally:
            self._replays -= 1
        return [e for e in out if not self.is_acked(e.position)]

    # --- manual moves (each starts a new epoch) --------------------------------------------

    def seek(self, pos: Position) -> None:
        """Move the read position to ``pos`` (never at or before the mark-delete position)."""
        rp = self._resolve(pos)
        if rp <= self._mdp:
            rp = self._reader.next_position(self._mdp)
        self._read_position = rp
        self._new_epoch()

    def rewind(self) -> None:
        """Read again from the first entry after the mark-delete position."""
        self._read_position = self._reader.next_position(self._mdp)
        self._new_epoch()

    def reset_cursor(self, pos: Position) -> None:
        """Pulsar's reset-cursor: everything before ``pos`` acked, everything from it unacked,
        reading from ``pos``. ``EARLIEST``/``LATEST`` are resolved against the ledger."""
        rp = self._resolve(pos)
        self._acked.clear()
        self._batch.clear()
        self._mdp = self._reader.previous_position(rp)
        self._read_position = rp
        self._dirty = True
        self._new_epoch()
        self.persist(force=True)

    def skip_entries(self, n: int) -> int:
        """Ack the next ``n`` unacked entries after the mark-delete; returns how many."""
        reader = self._reader
        acked = self._acked
        lac = reader.last_add_confirmed
        remaining = n
        pos = reader.next_position(self._mdp)
        while remaining > 0 and pos <= lac:
            r = acked.range_containing(pos)
            if r is not None:
                pos = reader.next_position(r[1])
                continue
            nxt = acked.next_range(pos)
            limit = (
                nxt[0].entry_id - 1
                if nxt is not None and nxt[0].ledger_id == pos.ledger_id
                else _NO_END
            )
            end = Position(pos.ledger_id, min(limit, pos.entry_id + remaining - 1))
            avail = reader.count_entries(pos, end)
            if avail <= 0:
                break
            last = Position(pos.ledger_id, pos.entry_id + avail - 1)
            for p in list(self._batch.irange(pos, last)):
                del self._batch[p]
            acked.add_range(pos, last)
            remaining -= avail
            pos = reader.next_position(last)
        skipped = n - remaining if n > 0 else 0
        if skipped:
            self.messages_consumed_counter += skipped
            self._dirty = True
            self._advance_mark_delete()
            self._mark_delete_moved_quietly()
        self._new_epoch()
        self.persist(force=True)
        return skipped

    def clear_backlog(self) -> None:
        """Ack everything up to the last durable entry."""
        lac = self._reader.last_add_confirmed
        if lac > self._mdp:
            self.messages_consumed_counter += self.number_of_entries_in_backlog
            self._mdp = lac
            self._acked.clear()
            self._batch.clear()
            self._dirty = True
        self._read_position = self._reader.next_position(self._mdp)
        self._new_epoch()
        self.persist(force=True)

    def _mark_delete_moved_quietly(self) -> None:
        mdp = self._mdp
        if self._batch:
            for pos in list(self._batch.irange(maximum=mdp)):
                del self._batch[pos]
        if self._read_position <= mdp:
            self._read_position = self._reader.next_position(mdp)

    def _new_epoch(self) -> None:
        self._epoch += 1
        op = self._pending
        if op is not None:
            # The read in flight belongs to the old epoch: detach it so a new one can start,
            # and wake it if it waits, so its caller learns at once that it is stale.
            self._pending = None
            _wake(op)

    def _resolve(self, pos: Position) -> Position:
        """Clamp ``pos`` (or EARLIEST/LATEST) to ``[first entry, next entry to be added]``."""
        reader = self._reader
        end = reader.next_position(reader.last_add_confirmed)
        if pos >= end:
            return end
        first = reader.first_position
        if first is None:
            return end
        return max(pos, first)

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

    # --- persistence -----------------------------------------------------------------------

    def is_ack_state_fully_persistable(self) -> bool:
        """Whether every ack range fits under ``max_unacked_ranges_to_persist`` (PIP-299: the
        broker pauses dispatch when this is false and the feature is on)."""
        return len(self._acked) <= self.config.max_unacked_ranges_to_persist

    def persist(self, force: bool = False) -> bool:
        """Save the ack state if it changed, at most ``mark_delete_rate_limit`` times a second
        unless ``force``. Returns whether it was written.

        Saved: the mark-delete position, the first ``max_unacked_ranges_to_persist`` ranges
        and the first ``max_batch_deleted_index_to_persist`` batch bitsets, in position order.
        """
        store = self._store
        prepared = self.prepare_persist(force)
        if store is None or prepared is None:
            return False
        try:
            store.save(self.name, prepared.data)
        except StorageError as exc:
            self.persist_failed(prepared, exc)
            return False
        self.persisted(prepared)
        return True

    def prepare_persist(self, force: bool = False) -> PreparedState | None:
        """The state to save now (see ``persist``), or None when nothing is to be saved; the
        caller saves it, then calls ``persisted`` or ``persist_failed``."""
        store = self._store
        if store is None or self._closed:
            return None
        now = self._clock()
        if not force:
            if not self._dirty:
                return None
            rate = self.config.mark_delete_rate_limit
            if rate > 0 and now - self.last_persist_time < 1.0 / rate:
                return None
        cfg = self.config
        limit = cfg.max_unacked_ranges_to_persist
        batch_items = [
            (pos, batch_ack.to_words(bits))
            for pos, bits in islice(self._batch.items(), cfg.max_batch_deleted_index_to_persist)
        ]
        snapshot = CursorSnapshot(self._mdp, self._acked.to_bytes(limit), batch_items)
        return PreparedState(
            encode_snapshot(snapshot),
            now,
            self._mdp,
            len(self._acked),
            min(len(self._acked), limit),
            len(batch_items),
        )

    def persisted(self, state: PreparedState) -> None:
        """``state`` (from ``prepare_persist``, with no change to the cursor since) is saved."""
        if self.persist_failing:
            self.persist_failing = False
            log.warning("cursor %s: ack state persisted again", self.name)
        self._dirty = False
        self.last_persist_time = state.time
        self.last_persisted_mark_delete = state.mark_delete
        self.last_persisted_total_ranges = state.total_ranges
        self.last_persisted_range_count = state.range_count
        self.last_persisted_batch_count = state.batch_count
        self.last_persisted_bytes = len(state.data)
        self.persist_count += 1

    def persist_failed(self, state: PreparedState, exc: BaseException) -> None:
        """Saving ``state`` failed."""
        # A full disk (SQLITE_FULL) or a failing store: the state stays dirty and the owner's
        # periodic flush tries again; what is lost to a crash meanwhile is redelivered.
        # Logged once per failing streak, not at every ack.
        if not self.persist_failing:
            log.error("cursor %s: cannot persist its ack state: %s", self.name, exc)
        self.persist_failing = True
        self.last_persist_time = state.time

    def flush(self) -> bool:
        """Persist now if anything changed (the owner calls this every
        ``position_flush_seconds``, as Pulsar's flush of dirty cursors)."""
        return self.persist(force=True) if self._dirty else False

    def _restore(self, data: bytes) -> None:
        snap = decode_snapshot(data)
        self._mdp = snap.mark_delete
        self._acked = RangeSet.from_bytes(snap.ranges)
        self._acked.remove_up_to(self._mdp)
        for pos, words in snap.batch_indexes:
            bits = batch_ack.from_words(words)
            if bits and pos > self._mdp and pos not in self._acked:
                self._batch[pos] = bits
        self._read_position = self._reader.next_position(self._mdp)
        self._advance_mark_delete()
        self._mark_delete_moved_quietly()
        self.last_persisted_mark_delete = self._mdp
        self.last_persisted_total_ranges = self.last_persisted_range_count = len(self._acked)
        self.last_persisted_batch_count = len(self._batch)
        self.last_persisted_bytes = len(data)

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Persist (durable cursors), end any pending read, stop listening."""
        if self._closed:
            return
        self.persist(force=True)
        self._shut()

    def delete(self) -> None:
        """Close without persisting and remove the stored state."""
        store = self._store
        self._shut()
        if store is not None:
            store.delete(self.name)

    def _shut(self) -> None:
        self.cancel_pending_read()
        if self._listening:
            self._reader.remove_entries_listener(self._listener)
            self._listening = False
        self._closed = True


def _wake(op: _ReadOp) -> None:
    waiter = op.waiter
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


def _stale(op: _ReadOp) -> ReadResult:
    return ReadResult([], op.epoch, stale=True, cancelled=op.cancelled)
