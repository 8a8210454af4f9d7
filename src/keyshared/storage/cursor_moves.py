"""Moves by hand: seek, rewind, reset-cursor, skip and clear-backlog. Each starts a new epoch,
so a read in flight when the cursor is moved completes ``stale`` and moves nothing (seed
issue-20277 / PIP-269).
"""

from __future__ import annotations

from keyshared.storage.cursor_reads import CursorReads
from keyshared.storage.cursor_state import wake
from keyshared.storage.position import Position

_NO_END = 1 << 63


class CursorMoves(CursorReads):
    """The manual moves of a cursor (part of ``cursor.ManagedCursor``)."""

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

    def _new_epoch(self) -> None:
        self._epoch += 1
        op = self._pending
        if op is not None:
            # The read in flight belongs to the old epoch: detach it so a new one can start,
            # and wake it if it waits, so its caller learns at once that it is stale.
            self._pending = None
            wake(op)

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
