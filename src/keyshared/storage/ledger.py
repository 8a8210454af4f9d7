"""The managed ledger: a topic's log as an ordered list of ledgers of opaque entries.

Like Pulsar's ManagedLedgerImpl: positions are ``(ledger_id, entry_id)``; ledger ids come from a
storage-wide counter so positions never repeat; a new ledger is started each time the managed
ledger is opened and whenever the current one is full (``max_entries_per_ledger`` entries or
``max_size_per_ledger_mb``). Older ledgers are read-only and can be trimmed whole.

Life of a ledger: OPEN (the current one, taking appends) -> SEALED (full, its last appends still
in the journal) -> CLOSED (final entry count recorded in metadata) -> DELETED (trimmed).
Metadata (``managed-ledgers/<name>``) lists every ledger as ``[id, entries, size]``; ``entries``
is null while a ledger is not closed, and such a ledger is recovered by scanning its file when the
managed ledger is next opened.

Reads: entries are served only once durable (at or before ``last_add_confirmed``); recent ones
from the shared entry cache, the rest from the segment files with one pread per contiguous run.
Runs up to ``sync_read_max_bytes`` are read on the loop (page-cache hits cost microseconds);
larger ones in the read thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson

from keyshared.crc import crc32c
from keyshared.storage.cache import Bucket, EntryCache
from keyshared.storage.config import StorageConfig
from keyshared.storage.disk import DiskMonitor
from keyshared.storage.entry import Entry
from keyshared.storage.errors import DiskFullError, StorageError, is_disk_full
from keyshared.storage.journal import Done, Journal, resolve_future
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.position import Position
from keyshared.storage.segment import (
    Segment,
    SegmentPool,
    WritableSegments,
    data_path,
    index_path,
)

log = logging.getLogger(__name__)

METADATA_PREFIX = "managed-ledgers/"
# After a ledger could not be created, appends fail at once for this long instead of each
# trying (and burning a ledger id) again: Pulsar's WaitTimeAfterLedgerCreationFailureMs is 10 s;
# a full disk has its own gate (DiskMonitor), so this only paces other failures.
LEDGER_CREATION_BACKOFF_SECONDS = 1.0


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


class _State(enum.Enum):
    OPEN = 1
    SEALED = 2
    CLOSED = 3
    DELETED = 4


# An enum member read from the class costs a descriptor lookup; append reads it per entry.
_OPEN = _State.OPEN
# A NamedTuple built without its generated __new__ (one Position per append).
_new_position = tuple.__new__


class _Ledger:
    """In-memory state of one ledger."""

    __slots__ = ("cache", "durable", "entries", "ledger_id", "segment", "size", "state")

    def __init__(self, ledger_id: int, entries: int, size: int, state: _State) -> None:
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


class ManagedLedger:
    """A topic's log. Use it from the event loop only. Create with :meth:`open`."""

    def __init__(self, name: str, ctx: LedgerContext, ledgers: list[_Ledger]) -> None:
        self._name = name
        self._ctx = ctx
        self._key = metadata_key(name)
        self._journal = ctx.journal
        self._cache = ctx.cache
        self._ledgers = ledgers
        self._ids = [led.ledger_id for led in ledgers]
        self._current: _Ledger | None = None
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

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, name: str, ctx: LedgerContext) -> ManagedLedger:
        """Open (or create) the managed ledger ``name`` and start a new ledger in it.

        Ledgers left unclosed (by a crash) are recovered from their files and closed; empty
        ones are dropped.
        """
        raw = ctx.metadata.get(metadata_key(name))
        ledgers: list[_Ledger] = []
        empty: list[int] = []
        recovered: list[Segment] = []
        try:
            for ledger_id, entries, size in orjson.loads(raw)["ledgers"] if raw else []:
                if entries is None:
                    seg = Segment.open(ctx.directory, ledger_id, sync=ctx.config.journal_sync_data)
                    recovered.append(seg)
                    entries = seg.count
                    size = seg.data_size(0, entries)
                    if entries == 0:
                        empty.append(ledger_id)
                        continue
                elif entries == 0:
                    empty.append(ledger_id)
                    continue
                ledgers.append(_Ledger(ledger_id, entries, size, _State.CLOSED))
            ml = cls(name, ctx, ledgers)
            # On a full disk the topic still opens, for its consumers: the first append once
            # there is room starts the ledger.
            if ctx.disk.writable():
                try:
                    ml._start_ledger(())
                except DiskFullError as exc:
                    log.warning("%s: opened without a writable ledger: %s", name, exc)
        except BaseException as exc:
            for seg in recovered:
                seg.close()
            if isinstance(exc, OSError):
                raise StorageError(f"cannot open managed ledger {name}: {exc}") from exc
            raise
        for seg in recovered:
            if seg.count == 0:
                seg.close()
            else:
                ctx.segments.add(seg)
        for ledger_id in empty:
            _unlink_ledger_files(ctx.directory, ledger_id)
        ml._lac = ml._compute_lac()
        ml._last_position = ml._lac
        return ml

    @property
    def backing_off(self) -> bool:
        """True while a failed ledger creation or a failed write holds new ledgers back."""
        return time.monotonic() - self._creation_failed_at < LEDGER_CREATION_BACKOFF_SECONDS

    def _start_ledger(self, extra: tuple[tuple[str, bytes], ...]) -> _Ledger:
        """Allocate a ledger, record it in metadata, then create its file."""
        if self.backing_off:
            raise StorageError(f"{self._name}: waiting for new ledger creation to complete")
        ledger_id, counter_item = self._ctx.allocate_ledger_id()
        led = _Ledger(ledger_id, 0, 0, _State.OPEN)
        self._ledgers.append(led)
        self._ids.append(ledger_id)
        try:
            self._persist((counter_item, *extra))
            seg = Segment.create(self._ctx.directory, ledger_id)
        except (OSError, StorageError) as exc:
            self._ledgers.pop()
            self._ids.pop()
            self._creation_failed_at = time.monotonic()
            cls = StorageError
            if is_disk_full(exc):
                cls = DiskFullError
                if not isinstance(exc, DiskFullError):  # the metadata store reported it already
                    self._ctx.disk.note_full(exc)
            raise cls(f"{self._name}: cannot create ledger {ledger_id}: {exc}") from exc
        seg.on_durable = lambda durable, n: self._on_durable(led, durable, n)
        seg.on_failed = lambda err, n: self._on_failed(led, err, n)
        led.segment = seg
        self._current = led
        self._ctx.writable.use(seg)
        return led

    def _compute_lac(self) -> Position:
        for led in reversed(self._ledgers):
            if led.durable > 0:
                return Position(led.ledger_id, led.durable - 1)
        current = self._current
        return Position(current.ledger_id if current is not None else -1, -1)

    def _persist(self, extra: tuple[tuple[str, bytes], ...] = ()) -> None:
        ledgers = [
            [led.ledger_id, led.entries, led.size]
            if led.state is _State.CLOSED
            else [led.ledger_id, None, None]
            for led in self._ledgers
        ]
        self._ctx.metadata.put_many(((self._key, orjson.dumps({"ledgers": ledgers})), *extra))

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

    # --- appends ---------------------------------------------------------------------------

    def add_entry(
        self, data: bytes, checksum: int | None = None
    ) -> tuple[Position, asyncio.Future[None]]:
        """Append ``data``; returns its position (assigned now) and a durability future.

        The future resolves once the entry is durable under the sync policy, or fails with
        :class:`StorageError`. ``checksum`` is the CRC32C of ``data`` when the caller already
        has it. Empty entries are refused: a zero-length record marks a torn tail.
        """
        fut: asyncio.Future[None] = self._journal.loop.create_future()
        return self.append(data, functools.partial(resolve_future, fut), checksum), fut

    def append(self, data: bytes, done: Done, checksum: int | None = None) -> Position:
        """As :meth:`add_entry`, but ``done(None)`` (durable) or ``done(error)`` is called
        instead of a future being resolved, on the loop, in append order (``Journal.
        submit_callback``): the publish path's way, with no future per entry."""
        if self._closed:
            raise StorageError(f"{self._name}: managed ledger is closed")
        if not data:
            raise ValueError("entries must not be empty")
        disk = self._ctx.disk
        if not disk.writable(len(data)):
            disk.refuse()
            self._seal_current()
            raise DiskFullError(f"{self._name}: no space left in the data directory")
        led = self._current
        if led is None or led.entries >= self._max_entries or led.state is not _OPEN:
            led = self._rollover()
        seg = led.segment
        assert seg is not None
        if seg.end >= self._max_bytes and led.entries > 0:
            led = self._rollover()
            seg = led.segment
            assert seg is not None
        if seg.parked or len(self._ctx.writable) >= self._ctx.writable.max_open:
            self._use(seg)
        crc = crc32c(data) if checksum is None else checksum
        entry_id = led.entries
        self._journal.submit_callback(seg, data, crc, done)
        led.entries = entry_id + 1
        self._pending += 1
        pos = _new_position(Position, (led.ledger_id, entry_id))
        self._last_position = pos
        self._cache.insert(led.cache, led.ledger_id, entry_id, data, crc)
        return pos

    def _seal_current(self) -> None:
        """Close the current ledger (once its appends are durable) without starting another:
        on a full disk, so that retention can delete it once it is consumed."""
        led = self._current
        if led is None or led.state is not _State.OPEN or led.entries == 0:
            return
        led.state = _State.SEALED
        if led.durable == led.entries:
            self._close_ledger(led)
            self._persist_quietly()

    def _rollover(self) -> _Ledger:
        old = self._current
        if old is not None:
            old.state = _State.SEALED
            if old.durable == old.entries:
                self._close_ledger(old)
        # A sealed ledger stays unclosed in metadata until its last appends are durable.
        return self._start_ledger(())

    def _close_ledger(self, led: _Ledger) -> None:
        """Make ``led`` read-only with its durable entries; the caller persists metadata."""
        led.entries = led.durable
        led.state = _State.CLOSED
        if self._current is led:
            self._current = None
        seg = led.segment
        led.segment = None
        if seg is None:
            return
        self._ctx.writable.discard(seg)
        seg.on_durable = None
        seg.on_failed = None
        seg.close_index()
        if led.entries == 0 or seg.failed is not None or seg.parked:
            # A parked one is reopened (from its synced index) when read, like any other.
            # Its file may hold unconfirmed records: reopen (and truncate) it when read.
            seg.close()
        else:
            self._ctx.segments.add(seg)

    def _on_durable(self, led: _Ledger, durable: int, n: int) -> None:
        seg = led.segment
        if seg is None or led.state is _State.DELETED:
            return
        added = seg.data_size(led.durable, durable)
        led.durable = durable
        led.size += added
        self._num_entries += n
        self._total_size += added
        self._lac = Position(led.ledger_id, durable - 1)
        self._pending -= n
        if led.state is _State.SEALED and durable == led.entries:
            self._close_ledger(led)
            self._persist_quietly()
        if self._closed:
            if self._pending == 0:
                self._finish_close()
            return
        for cb in tuple(self._listeners):
            try:
                cb()
            except Exception:
                log.exception("%s: entries listener failed", self._name)

    def _on_failed(self, led: _Ledger, err: StorageError, n: int) -> None:
        if led.state in (_State.OPEN, _State.SEALED):
            # This group and every later append to the ledger fail (its segment is marked
            # failed), and once it is closed they report to nobody: count them all now, or
            # close() would wait for them for ever.
            self._pending -= led.entries - led.durable
            self._fail_ledger(led, err)
        if self._closed and self._pending == 0:
            self._finish_close()

    def _fail_ledger(self, led: _Ledger, err: StorageError) -> None:
        # Entries after the last durable one never existed: close the ledger there and move on.
        # Fail-stop: a write or sync that failed is never retried on that ledger (after a
        # failed fsync the kernel may have dropped the dirty pages, so a later fsync that
        # succeeds proves nothing about them); its entries are never confirmed.
        log.error(
            "%s: ledger %d failed (%s), closing it at %d entries",
            self._name,
            led.ledger_id,
            err,
            led.durable,
        )
        self._cache.drop(led.cache, led.ledger_id, led.durable)
        was_current = led is self._current
        self._close_ledger(led)
        if not is_disk_full(err):
            # A failing disk: the next ledger is tried after the creation back-off, not at
            # once, so that a disk failing every write does not burn a ledger a send.
            self._creation_failed_at = time.monotonic()
            self._persist_quietly()
            return
        # On a full disk the next append starts the new ledger, once there is room again.
        if was_current and not self._closed and self._ctx.disk.writable():
            try:
                self._start_ledger(())
            except StorageError as exc:
                log.error("%s: cannot start a new ledger: %s", self._name, exc)
                self._persist_quietly()
        else:
            self._persist_quietly()

    def _persist_quietly(self) -> None:
        try:
            self._persist()
        except StorageError as exc:
            # The next successful persist records the same state.
            log.error("%s: cannot persist ledger list: %s", self._name, exc)

    # --- listeners -------------------------------------------------------------------------

    def add_entries_listener(self, cb: Callable[[], None]) -> None:
        """Call ``cb()`` on the loop whenever ``last_add_confirmed`` advances."""
        self._listeners.append(cb)

    def remove_entries_listener(self, cb: Callable[[], None]) -> None:
        """Stop calling ``cb`` (no error if it was not registered)."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(cb)

    # --- reads -----------------------------------------------------------------------------

    async def read_entries(
        self, start: Position, max_entries: int, max_bytes: int | None = None
    ) -> list[Entry]:
        """Durable entries from ``start`` (inclusive), in order, across ledgers.

        At most ``max_entries``; with ``max_bytes``, stops before the data would exceed it
        (but returns at least one entry). Empty when nothing at or after ``start`` is durable.
        """
        self._check_open()
        out: list[Entry] = []
        if max_entries <= 0:
            return out
        ids = self._ids
        i = bisect_left(ids, start.ledger_id)
        entry_id = max(start.entry_id, 0) if i < len(ids) and ids[i] == start.ledger_id else 0
        used = 0
        budget = max_bytes if max_bytes is not None else -1
        while i < len(self._ledgers):
            led = self._ledgers[i]
            stop = min(led.durable, entry_id + max_entries - len(out))
            bucket = led.cache
            lid = led.ledger_id
            e = entry_id
            while e < stop:
                cached = bucket.get(e)
                if cached is not None:
                    if budget >= 0:
                        size = len(cached[0])
                        if out and used + size > budget:
                            return out
                        used += size
                    out.append(Entry(Position(lid, e), cached[0], cached[1]))
                    e += 1
                    continue
                run_end = e + 1
                while run_end < stop and run_end not in bucket:
                    run_end += 1
                seg = self._segment_for(led)
                if budget >= 0:
                    if out and used + seg.data_size(e, e + 1) > budget:
                        return out
                    run_end = seg.fit(e, run_end, budget - used)
                    used += seg.data_size(e, run_end)
                out.extend(await self._read_disk(seg, e, run_end))
                if led.state is _State.DELETED or self._closed:
                    return out
                e = run_end
            if len(out) >= max_entries or e < led.entries or led.state is _State.OPEN:
                break
            # Trims may have shifted the list while we awaited: find the next ledger by id.
            i = bisect_right(self._ids, led.ledger_id)
            entry_id = 0
        return out

    async def read_entry(self, pos: Position) -> Entry | None:
        """The durable entry at ``pos``, or None."""
        self._check_open()
        i = bisect_left(self._ids, pos.ledger_id)
        if i == len(self._ids) or self._ids[i] != pos.ledger_id:
            return None
        led = self._ledgers[i]
        if not 0 <= pos.entry_id < led.durable:
            return None
        cached = led.cache.get(pos.entry_id)
        if cached is not None:
            return Entry(pos, cached[0], cached[1])
        entries = await self._read_disk(self._segment_for(led), pos.entry_id, pos.entry_id + 1)
        return entries[0] if entries else None

    def _use(self, seg: Segment) -> None:
        """Mark the writable ``seg`` used, reopening its files if they were parked."""
        try:
            self._ctx.writable.use(seg)
        except OSError as exc:
            raise StorageError(f"cannot reopen ledger {seg.ledger_id}: {exc}") from exc

    def _segment_for(self, led: _Ledger) -> Segment:
        if led.segment is not None:
            self._use(led.segment)
            return led.segment
        pool = self._ctx.segments
        seg = pool.get(led.ledger_id)
        if seg is None or seg.closed:
            try:
                seg = Segment.open(
                    self._ctx.directory,
                    led.ledger_id,
                    expected_entries=led.entries,
                    sync=self._ctx.config.journal_sync_data,
                )
            except OSError as exc:
                raise StorageError(f"cannot open ledger {led.ledger_id}: {exc}") from exc
            if seg.count < led.entries:
                self._lost_entries(led, seg)
            pool.add(seg)
        return seg

    def _lost_entries(self, led: _Ledger, seg: Segment) -> None:
        # The file holds fewer records than were confirmed: unsynced data lost to a power
        # failure (journal_sync_data off) or a damaged disk. Serve what is there.
        log.error(
            "%s: ledger %d has %d entries on disk, %d were recorded",
            self._name,
            led.ledger_id,
            seg.count,
            led.entries,
        )
        size = seg.data_size(0, seg.count)
        self._num_entries -= led.durable - seg.count
        self._total_size -= led.size - size
        led.entries = led.durable = seg.count
        led.size = size
        self._cache.drop(led.cache, led.ledger_id, seg.count)
        self._persist_quietly()

    async def _read_disk(self, seg: Segment, first: int, stop: int) -> list[Entry]:
        start, length = seg.span(first, stop)
        seg.acquire()
        try:
            if length <= self._sync_read_max:
                return seg.read_span(start, length, first, stop - first)
            loop = self._journal.loop
            return await loop.run_in_executor(
                self._ctx.read_executor, seg.read_span, start, length, first, stop - first
            )
        except OSError as exc:
            raise StorageError(f"read of ledger {seg.ledger_id} failed: {exc}") from exc
        finally:
            seg.release()

    # --- position arithmetic ---------------------------------------------------------------

    def next_position(self, pos: Position) -> Position:
        """The position right after ``pos``: the next entry of its ledger, or entry 0 of the
        next non-empty ledger when ``pos`` is the last entry of a closed one."""
        ids = self._ids
        i = bisect_left(ids, pos.ledger_id)
        if i < len(ids) and ids[i] == pos.ledger_id:
            led = self._ledgers[i]
            if led.state is _State.OPEN or pos.entry_id + 1 < led.entries:
                return Position(pos.ledger_id, max(pos.entry_id + 1, 0))
            i += 1
        for led in self._ledgers[i:]:
            if led.entries > 0 or led.state is _State.OPEN:
                return Position(led.ledger_id, 0)
        return Position(pos.ledger_id, pos.entry_id + 1)

    def previous_position(self, pos: Position) -> Position:
        """The position right before ``pos``: the last entry of the previous non-empty ledger
        when ``pos`` is an entry 0; ``(pos.ledger_id, -1)`` when nothing precedes it."""
        if pos.entry_id > 0:
            return Position(pos.ledger_id, pos.entry_id - 1)
        i = bisect_left(self._ids, pos.ledger_id)
        for led in reversed(self._ledgers[:i]):
            if led.entries > 0:
                return Position(led.ledger_id, led.entries - 1)
        return Position(pos.ledger_id, -1)

    def count_entries(self, start: Position, end: Position) -> int:
        """Durable entries in ``[start, end]`` (inclusive); O(ledgers in the range)."""
        if end < start:
            return 0
        ids = self._ids
        lo_i = bisect_left(ids, start.ledger_id)
        hi_i = bisect_right(ids, end.ledger_id)
        total = 0
        for led in self._ledgers[lo_i:hi_i]:
            lo = max(start.entry_id, 0) if led.ledger_id == start.ledger_id else 0
            hi = led.durable - 1
            if led.ledger_id == end.ledger_id:
                hi = min(hi, end.entry_id)
            if hi >= lo:
                total += hi - lo + 1
        return total

    async def find_position(self, predicate: Callable[[Entry], bool]) -> Position | None:
        """The first durable entry for which ``predicate`` holds (it must be monotonic: false
        then true, e.g. ``publish_time >= t``), by binary search; None if there is none."""
        self._check_open()
        spans = [(led.ledger_id, led.durable) for led in self._ledgers if led.durable > 0]
        starts: list[int] = []
        total = 0
        for _, count in spans:
            starts.append(total)
            total += count

        def at(index: int) -> Position:
            k = bisect_right(starts, index) - 1
            return Position(spans[k][0], index - starts[k])

        lo, hi = 0, total
        while lo < hi:
            mid = (lo + hi) // 2
            entry = await self.read_entry(at(mid))
            # An entry trimmed meanwhile is before any surviving one: treat it as "false".
            if entry is not None and predicate(entry):
                hi = mid
            else:
                lo = mid + 1
        return at(lo) if lo < total else None

    # --- trimming, closing, deleting -------------------------------------------------------

    def trim(self, min_position: Position) -> list[int]:
        """Delete the closed ledgers whose entries all precede ``min_position``; returns their
        ids. The current ledger is never deleted. Retention and cursors are the caller's
        business."""
        doomed: list[_Ledger] = []
        for led in self._ledgers:
            if led.state is not _State.CLOSED:
                break
            if led.ledger_id < min_position.ledger_id or (
                led.ledger_id == min_position.ledger_id and led.entries <= min_position.entry_id
            ):
                doomed.append(led)
            else:
                break
        if not doomed:
            return []
        kept_ledgers = self._ledgers[len(doomed) :]
        kept_ids = self._ids[len(doomed) :]
        old_ledgers, old_ids = self._ledgers, self._ids
        self._ledgers, self._ids = kept_ledgers, kept_ids
        try:
            self._persist()
        except StorageError:
            self._ledgers, self._ids = old_ledgers, old_ids
            raise
        for led in doomed:
            self._num_entries -= led.durable
            self._total_size -= led.size
            self._forget(led)
        return [led.ledger_id for led in doomed]

    def _forget(self, led: _Ledger) -> None:
        """Drop a ledger's cache, close and remove its files."""
        led.state = _State.DELETED
        self._cache.drop(led.cache, led.ledger_id)
        if led.segment is not None:
            self._ctx.writable.discard(led.segment)
        seg = led.segment or self._ctx.segments.discard(led.ledger_id)
        led.segment = None
        if seg is not None:
            seg.delete()
        else:
            _unlink_ledger_files(self._ctx.directory, led.ledger_id)

    def close(self) -> asyncio.Future[None]:
        """Stop taking appends and reads; once the pending appends complete, close the current
        ledger in metadata and release the files.

        Returns a future that is done then; awaiting it is optional. Until it is done the
        storage refuses to reopen this managed ledger (its last file is still being written).
        """
        if self._close_future is None:
            self._closed = True
            self._close_future = self._journal.loop.create_future()
            self._ctx.on_closing(self)
            if self._pending == 0:
                self._finish_close()
        return self._close_future

    def _finish_close(self) -> None:
        fut = self._close_future
        if fut is None or fut.done():
            return
        try:
            for led in list(self._ledgers):
                if led.state in (_State.OPEN, _State.SEALED):
                    self._close_ledger(led)
            empty = [led for led in self._ledgers if led.entries == 0]
            if empty:
                self._ledgers = [led for led in self._ledgers if led.entries > 0]
                self._ids = [led.ledger_id for led in self._ledgers]
            self._persist_quietly()
            for led in empty:
                self._forget(led)
        finally:
            self._release_all()
            self._ctx.on_closed(self)
            fut.set_result(None)

    async def delete(self) -> None:
        """Close (waiting for pending appends), then remove every ledger file and the managed
        ledger's metadata."""
        await self.close()
        self._ctx.metadata.delete(self._key)
        for led in self._ledgers:
            self._forget(led)
        self._ledgers, self._ids = [], []
        self._num_entries = self._total_size = 0

    def _release_all(self) -> None:
        pool = self._ctx.segments
        for led in self._ledgers:
            self._cache.drop(led.cache, led.ledger_id)
            if led.segment is not None:
                self._ctx.writable.discard(led.segment)
            seg = led.segment or pool.discard(led.ledger_id)
            led.segment = None
            if seg is not None:
                seg.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self._name}: managed ledger is closed")

    def __repr__(self) -> str:
        return (
            f"ManagedLedger({self._name!r}, ledgers={self._ids}, lac={self._lac}, "
            f"entries={self._num_entries})"
        )


def delete_stored(name: str, ctx: LedgerContext) -> bool:
    """Delete a managed ledger that is not open: its files and metadata. Whether it existed."""
    raw = ctx.metadata.get(metadata_key(name))
    if raw is None:
        return False
    ctx.metadata.delete(metadata_key(name))
    for ledger_id, _, _ in orjson.loads(raw)["ledgers"]:
        seg = ctx.segments.discard(ledger_id)
        if seg is not None:
            seg.close()
        _unlink_ledger_files(ctx.directory, ledger_id)
    return True


def _unlink_ledger_files(directory: Path, ledger_id: int) -> None:
    for path in (data_path(directory, ledger_id), index_path(directory, ledger_id)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
