"""Appends: the hand-off of an entry to the journal (its position assigned at once, its
durability reported later to ``ledger_rollover``), rolling over to a new ledger when the current
one is full, and refusing appends on a full disk.
"""

from __future__ import annotations

import asyncio
import functools

from keyshared.crc import crc32c
from keyshared.storage.errors import DiskFullError, StorageError
from keyshared.storage.journal import Done, resolve_future
from keyshared.storage.ledger_reads import LedgerReads
from keyshared.storage.ledger_state import LedgerState
from keyshared.storage.position import Position

# An enum member read from the class costs a descriptor lookup; append reads it per entry.
_OPEN = LedgerState.OPEN
# A NamedTuple built without its generated __new__ (one Position per append).
_new_position = tuple.__new__


class LedgerAppends(LedgerReads):
    """The appends of a managed ledger (part of ``ledger.ManagedLedger``)."""

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
        if seg.parked or self._ctx.writable.crowded:
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
