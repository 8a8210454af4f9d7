"""Reads: entries are served only once durable (at or before ``last_add_confirmed``); recent
ones from the shared entry cache, the rest from the segment files with one pread per contiguous
run. Runs up to ``sync_read_max_bytes`` are read on the loop (page-cache hits cost
microseconds); larger ones in the read thread pool.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from keyshared.storage.entry import Entry
from keyshared.storage.errors import StorageError
from keyshared.storage.ledger_state import Ledger, LedgerState, log
from keyshared.storage.ledger_trim import LedgerTrim
from keyshared.storage.position import Position
from keyshared.storage.segment import Segment


class LedgerReads(LedgerTrim):
    """The reads of a managed ledger (part of ``ledger.ManagedLedger``)."""

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
                if led.state is LedgerState.DELETED or self._closed:
                    return out
                e = run_end
            if len(out) >= max_entries or e < led.entries or led.state is LedgerState.OPEN:
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

    def _segment_for(self, led: Ledger) -> Segment:
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

    def _lost_entries(self, led: Ledger, seg: Segment) -> None:
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
