"""Acknowledgements: individual, cumulative and per batch index, and what follows when they move
the mark-delete position (batch bitsets dropped, the read position pulled along, a save).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from keyshared.storage import batch_ack
from keyshared.storage.cursor_persistence import CursorPersistence
from keyshared.storage.position import Position


class CursorAcks(CursorPersistence):
    """The ack operations of a cursor (part of ``cursor.ManagedCursor``)."""

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
