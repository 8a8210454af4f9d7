"""What a managed ledger is made of: its ledgers (:class:`Ledger`, each OPEN -> SEALED ->
CLOSED -> DELETED), what it needs from the storage (:class:`LedgerContext`), and
:class:`LedgerBase`, the state every part of ``ledger.ManagedLedger`` shares, with the read-only
views of it and the persisting of the ledger list.

The parts that change the state build on it, one over the other (``ledger_rollover``,
``ledger_trim``, ``ledger_reads``, ``ledger_appends``), and ``ledger.ManagedLedger`` is the whole.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import orjson

from keyshared.storage.cache import Bucket, EntryCache
from keyshared.storage.config import StorageConfig
from keyshared.storage.disk import DiskMonitor
from keyshared.storage.errors import StorageError
from keyshared.storage.journal import Journal
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.position import Position
from keyshared.storage.segment import (
    Segment,
    SegmentPool,
    WritableSegments,
    data_path,
    index_path,
)

if TYPE_CHECKING:
    import asyncio

    from keyshared.storage.ledger import ManagedLedger

log = logging.getLogger("keyshared.storage.ledger")

METADATA_PREFIX = "managed-ledgers/"


class LedgerInfo(NamedTuple):
    """One ledger of a managed ledger, for internal stats: durable entries and data bytes."""

    ledger_id: int
    entries: int
    size: int


@dataclass(slots=True)
class LedgerContext:
    """What a managed ledger needs from the storage that owns it."""

    directory: Path
    config: StorageConfig
    metadata: MetadataStore
    journal: Journal
    cache: EntryCache
    segments: SegmentPool
    # The open ledgers' segments, at most so many holding their files open.
    writable: WritableSegments
    read_executor: Executor
    # Whether the data directory takes new entries (BookKeeper's disk thresholds).
    disk: DiskMonitor
    # Returns a fresh ledger id and the metadata item that persists the counter past it.
    allocate_ledger_id: Callable[[], tuple[int, tuple[str, bytes]]]
    # Called when close() starts, then when it has finished.
    on_closing: Callable[[ManagedLedger], None]
    on_closed: Callable[[ManagedLedger], None]


class LedgerState(enum.Enum):
    """Where a ledger is in its life (see ``ledger``)."""

    OPEN = 1
    SEALED = 2
    CLOSED = 3
    DELETED = 4


class Ledger:
    """In-memory state of one ledger."""

    __slots__ = ("cache", "durable", "entries", "ledger_id", "segment", "size", "state")

    def __init__(self, ledger_id: int, entries: int, size: int, state: LedgerState) -> None:
        self.ledger_id = ledger_id
        # Positions handed out (final once CLOSED).
        self.entries = entries
        # Entries durable (== entries once CLOSED).
        self.durable = entries
        # Data bytes of the durable entries.
        self.size = size
        self.state = state
        # The writable segment while OPEN or SEALED; closed ledgers use the storage's pool.
        self.segment: Segment | None = None
        self.cache: Bucket = {}


def metadata_key(name: str) -> str:
    """The metadata key holding a managed ledger's list of ledgers."""
    return METADATA_PREFIX + name


def unlink_ledger_files(directory: Path, ledger_id: int) -> None:
    """Remove a ledger's data and index files (those that exist)."""
    for path in (data_path(directory, ledger_id), index_path(directory, ledger_id)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class LedgerBase:
    """A managed ledger's state and the views of it (``ledger.ManagedLedger`` is the whole)."""

    def __init__(self, name: str, ctx: LedgerContext, ledgers: list[Ledger]) -> None:
        self._name = name
        self._ctx = ctx
        self._key = metadata_key(name)
        self._journal = ctx.journal
        self._cache = ctx.cache
        self._ledgers = ledgers
        self._ids = [led.ledger_id for led in ledgers]
        self._current: Ledger | None = None
        self._max_entries = max(1, ctx.config.max_entries_per_ledger)
        self._max_bytes = max(1, ctx.config.max_size_per_ledger_mb) * 1024 * 1024
        self._sync_read_max = ctx.config.sync_read_max_bytes
        self._listeners: list[Callable[[], None]] = []
        self._pending = 0
        self._close_future: asyncio.Future[None] | None = None
        self._closed = False
        self._num_entries = sum(led.durable for led in ledgers)
        self._total_size = sum(led.size for led in ledgers)
        self._lac = Position(-1, -1)
        self._last_position = Position(-1, -1)
        self._creation_failed_at = float("-inf")

    def _compute_lac(self) -> Position:
        for led in reversed(self._ledgers):
            if led.durable > 0:
                return Position(led.ledger_id, led.durable - 1)
        current = self._current
        return Position(current.ledger_id if current is not None else -1, -1)

    def _persist(self, extra: tuple[tuple[str, bytes], ...] = ()) -> None:
        ledgers = [
            [led.ledger_id, led.entries, led.size]
            if led.state is LedgerState.CLOSED
            else [led.ledger_id, None, None]
            for led in self._ledgers
        ]
        self._ctx.metadata.put_many(((self._key, orjson.dumps({"ledgers": ledgers})), *extra))

    def _persist_quietly(self) -> None:
        try:
            self._persist()
        except StorageError as exc:
            # The next successful persist records the same state.
            log.error("%s: cannot persist ledger list: %s", self._name, exc)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self._name}: managed ledger is closed")

    def _finish_close(self) -> None:
        """Close the ledgers and release the files once no append is pending (``ledger_trim``)."""
        raise NotImplementedError

    # --- properties --------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The managed ledger's name."""
        return self._name

    @property
    def last_add_confirmed(self) -> Position:
        """The last durable entry; ``(current ledger, -1)`` when the log has none."""
        return self._lac

    @property
    def last_position(self) -> Position:
        """The last position handed out by :meth:`add_entry` (possibly not yet durable)."""
        return self._last_position

    @property
    def first_position(self) -> Position | None:
        """The first existing (durable) entry, or None."""
        for led in self._ledgers:
            if led.durable > 0:
                return Position(led.ledger_id, 0)
        return None

    @property
    def number_of_entries(self) -> int:
        """Durable entries in the log."""
        return self._num_entries

    @property
    def total_size(self) -> int:
        """Data bytes of the durable entries (record headers excluded)."""
        return self._total_size

    @property
    def pending_add_entries(self) -> int:
        """Appends submitted and not yet completed."""
        return self._pending

    @property
    def current_ledger_id(self) -> int:
        """The ledger that takes appends (-1 if none, after a failure)."""
        return self._current.ledger_id if self._current is not None else -1

    @property
    def ledgers(self) -> list[LedgerInfo]:
        """Every ledger with its durable entry count and data size."""
        return [LedgerInfo(led.ledger_id, led.durable, led.size) for led in self._ledgers]

    @property
    def is_closed(self) -> bool:
        """Whether :meth:`close` or :meth:`delete` was called."""
        return self._closed

    # --- listeners -------------------------------------------------------------------------

    def add_entries_listener(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` on the loop whenever ``last_add_confirmed`` advances."""
        self._listeners.append(cb)

    def remove_entries_listener(self, cb: Callable[[], None]) -> None:
        """Stop calling ``cb`` (no error if it was not registered)."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(cb)
