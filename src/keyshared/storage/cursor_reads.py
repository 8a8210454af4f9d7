"""Reads: sequential reads that move the read position (each carrying the epoch it was issued
in, so a read that completes after a manual move is ``stale`` and moves nothing), the wait for
new entries, and replay reads of given positions for redelivery.

Await points (where other coroutines may move the cursor) are only the reader's read calls and
the wait for new entries; every one is followed by an epoch check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from keyshared.storage.cursor_acks import CursorAcks
from keyshared.storage.cursor_state import (
    CursorClosedError,
    PendingReadError,
    ReadOp,
    ReadResult,
    stale,
    wake,
)
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position


class CursorReads(CursorAcks):
    """The read operations of a cursor (part of ``cursor.ManagedCursor``)."""

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
        wake(op)
        return True

    def has_more_entries(self) -> bool:
        """Whether a sequential read would find an unacked entry now."""
        return self._before_end(self._skip_acked(self._read_position))

    def _start_op(self) -> ReadOp:
        if self._closed:
            raise CursorClosedError(f"cursor {self.name} is closed")
        if self._pending is not None:
            raise PendingReadError(f"cursor {self.name} already has a read in flight")
        op = ReadOp(self._epoch)
        self._pending = op
        return op

    async def _run_read(self, op: ReadOp, max_entries: int, *, wait: bool) -> ReadResult:
        try:
            while True:
                if op.cancelled or op.epoch != self._epoch:
                    return stale(op)
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

    async def _read_once(self, op: ReadOp, max_entries: int) -> ReadResult:
        reader = self._reader
        out: list[Entry] = []
        pos = self._skip_acked(self._read_position)
        while len(out) < max_entries and self._before_end(pos):
            batch = await reader.read_entries(pos, max_entries - len(out))
            if op.cancelled or op.epoch != self._epoch:
                return stale(op)
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

    async def _wait_for_entries(self, op: ReadOp) -> None:
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
            wake(op)

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
