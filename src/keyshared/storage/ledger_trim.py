"""Trimming, closing and deleting: dropping whole ledgers that precede a position, closing the
managed ledger once its pending appends are done, and removing its files and metadata.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

import orjson

from keyshared.storage.errors import StorageError
from keyshared.storage.ledger_rollover import LedgerRollover
from keyshared.storage.ledger_state import (
    Ledger,
    LedgerContext,
    LedgerState,
    metadata_key,
    unlink_ledger_files,
)
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.storage.ledger import ManagedLedger


class LedgerTrim(LedgerRollover):
    """Trimming, closing and deleting (part of ``ledger.ManagedLedger``)."""

    def trim(self, min_position: Position) -> list[int]:
        """Delete the closed ledgers whose entries all precede ``min_position``; returns their
        ids. The current ledger is never deleted. Retention and cursors are the caller's
        business."""
        doomed: list[Ledger] = []
        for led in self._ledgers:
            if led.state is not LedgerState.CLOSED:
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

    def _forget(self, led: Ledger) -> None:
        """Drop a ledger's cache, close and remove its files."""
        led.state = LedgerState.DELETED
        self._cache.drop(led.cache, led.ledger_id)
        if led.segment is not None:
            self._ctx.writable.discard(led.segment)
        seg = led.segment or self._ctx.segments.discard(led.ledger_id)
        led.segment = None
        if seg is not None:
            seg.delete()
        else:
            unlink_ledger_files(self._ctx.directory, led.ledger_id)

    def close(self) -> asyncio.Future[None]:
        """Stop taking appends and reads; once the pending appends complete, close the current
        ledger in metadata and release the files.

        Returns a future that is done then; awaiting it is optional. Until it is done the
        storage refuses to reopen this managed ledger (its last file is still being written).
        """
        if self._close_future is None:
            self._closed = True
            self._close_future = self._journal.loop.create_future()
            # The storage's callbacks take the whole managed ledger, which this part always is.
            self._ctx.on_closing(cast("ManagedLedger", self))
            if self._pending == 0:
                self._finish_close()
        return self._close_future

    def _finish_close(self) -> None:
        fut = self._close_future
        if fut is None or fut.done():
            return
        try:
            for led in list(self._ledgers):
                if led.state in (LedgerState.OPEN, LedgerState.SEALED):
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
            self._ctx.on_closed(cast("ManagedLedger", self))
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
        unlink_ledger_files(ctx.directory, ledger_id)
    return True
