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

The cursor is built in layers, one module each, every one over the one before:
``cursor_state`` (the state and its views), ``cursor_persistence`` (saving, restoring, the group
commit), ``cursor_acks``, ``cursor_reads`` (sequential and replay reads), ``cursor_moves``
(seek, rewind, reset, skip, clear-backlog); :class:`ManagedCursor` here sets the state up and
ends it. This module names everything the rest of the broker imports.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sortedcontainers import SortedDict

from keyshared.storage.cursor_config import CursorConfig
from keyshared.storage.cursor_moves import CursorMoves
from keyshared.storage.cursor_persistence import (
    CursorPersister,
    CursorStateStore,
    KeyValue,
    KeyValueCursorStore,
    PreparedState,
)
from keyshared.storage.cursor_state import (
    CursorClosedError,
    CursorError,
    EntryReader,
    PendingReadError,
    ReadResult,
)
from keyshared.storage.position import LATEST, Position
from keyshared.storage.range_set import RangeSet

__all__ = [
    "CursorClosedError",
    "CursorConfig",
    "CursorError",
    "CursorPersister",
    "CursorStateStore",
    "EntryReader",
    "KeyValue",
    "KeyValueCursorStore",
    "ManagedCursor",
    "PendingReadError",
    "PreparedState",
    "ReadResult",
]


class ManagedCursor(CursorMoves):
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
        # Position -> int bitset of the batch's still-unacked indexes (see CursorState).
        self._batch = SortedDict()
        self._pending = None
        self._replays = 0
        self._listening = False
        self._listener = self._on_entries_added
        self._closed = False
        self._dirty = False
        self.messages_consumed_counter = 0
        self.last_persist_time = float("-inf")
        self.last_persisted_mark_delete = None
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
