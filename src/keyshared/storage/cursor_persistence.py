"""Where a cursor's ack state is saved and how: the store protocols, the group commit of many
cursors' saves (:class:`CursorPersister`), and the cursor's own saving and restoring
(:class:`CursorPersistence`).

Saves are rate limited as Pulsar's mark-delete and truncated at ``max_unacked_ranges_to_persist``
ranges (seed PIP-299): whatever was acked but not persisted comes back unacked after a restart
(duplicates, never loss).
"""

from __future__ import annotations

import asyncio
import logging
from itertools import islice
from typing import NamedTuple, Protocol

from keyshared.storage import batch_ack
from keyshared.storage.cursor_codec import CursorSnapshot, decode_snapshot, encode_snapshot
from keyshared.storage.cursor_state import CursorState
from keyshared.storage.errors import StorageError
from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet

# The cursor's log, under the name it had before the cursor was split into modules.
log = logging.getLogger("keyshared.storage.cursor")


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
        self._pending: dict[CursorPersistence, None] = {}
        self._scheduled = False
        self.commits = 0
        self.saved = 0

    def schedule(self, cursor: CursorPersistence) -> None:
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
        batch: list[tuple[CursorPersistence, PreparedState, str]] = []
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


class CursorPersistence(CursorState):
    """Saving and restoring a cursor's ack state (part of ``cursor.ManagedCursor``)."""

    last_persist_time: float
    last_persisted_mark_delete: Position | None
    last_persisted_range_count: int
    last_persisted_total_ranges: int
    last_persisted_batch_count: int
    last_persisted_bytes: int
    persist_count: int
    persist_failing: bool

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
