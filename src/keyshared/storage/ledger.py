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

The parts: ``ledger_state`` (the ledgers, the shared state and its views), ``ledger_rollover``
(starting, sealing, closing and failing ledgers), ``ledger_trim`` (trimming, closing, deleting),
``ledger_reads`` (cached and disk reads), ``ledger_appends`` (the hand-off to the journal). This
module opens a managed ledger (recovering unclosed ledgers) and does position arithmetic.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable

import orjson

from keyshared.storage.entry import Entry
from keyshared.storage.errors import DiskFullError, StorageError
from keyshared.storage.ledger_appends import LedgerAppends
from keyshared.storage.ledger_state import (
    METADATA_PREFIX,
    Ledger,
    LedgerContext,
    LedgerInfo,
    LedgerState,
    log,
    metadata_key,
    unlink_ledger_files,
)
from keyshared.storage.ledger_trim import delete_stored
from keyshared.storage.position import Position
from keyshared.storage.segment import Segment

__all__ = [
    "METADATA_PREFIX",
    "LedgerContext",
    "LedgerInfo",
    "ManagedLedger",
    "delete_stored",
    "metadata_key",
]


class ManagedLedger(LedgerAppends):
    """A topic's log. Use it from the event loop only. Create with :meth:`open`."""

    # --- opening ---------------------------------------------------------------------------

    @classmethod
    def open(cls, name: str, ctx: LedgerContext) -> ManagedLedger:
        """Open (or create) the managed ledger ``name`` and start a new ledger in it.

        Ledgers left unclosed (by a crash) are recovered from their files and closed; empty
        ones are dropped.
        """
        raw = ctx.metadata.get(metadata_key(name))
        ledgers: list[Ledger] = []
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
                ledgers.append(Ledger(ledger_id, entries, size, LedgerState.CLOSED))
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
            unlink_ledger_files(ctx.directory, ledger_id)
        ml._lac = ml._compute_lac()
        ml._last_position = ml._lac
        return ml

    # --- position arithmetic ---------------------------------------------------------------

    def next_position(self, pos: Position) -> Position:
        """The position right after ``pos``: the next entry of its ledger, or entry 0 of the
        next non-empty ledger when ``pos`` is the last entry of a closed one."""
        ids = self._ids
        i = bisect_left(ids, pos.ledger_id)
        if i < len(ids) and ids[i] == pos.ledger_id:
            led = self._ledgers[i]
            if led.state is LedgerState.OPEN or pos.entry_id + 1 < led.entries:
                return Position(pos.ledger_id, max(pos.entry_id + 1, 0))
            i += 1
        for led in self._ledgers[i:]:
            if led.entries > 0 or led.state is LedgerState.OPEN:
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

    def __repr__(self) -> str:
        return (
            f"ManagedLedger({self._name!r}, ledgers={self._ids}, lac={self._lac}, "
            f"entries={self._num_entries})"
        )
