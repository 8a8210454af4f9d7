"""Ledger rollover: starting a ledger (metadata first, then its file), sealing it when full,
closing it once its last appends are durable, and failing it when a write or sync fails (with a
back-off before the next one is created). The journal's durability reports arrive here.
"""

from __future__ import annotations

import time

from keyshared.storage.errors import DiskFullError, StorageError, is_disk_full
from keyshared.storage.ledger_state import Ledger, LedgerBase, LedgerState, log
from keyshared.storage.position import Position
from keyshared.storage.segment import Segment

# After a ledger could not be created, appends fail at once for this long instead of each
# trying (and burning a ledger id) again: Pulsar's WaitTimeAfterLedgerCreationFailureMs is 10 s;
# a full disk has its own gate (DiskMonitor), so this only paces other failures.
LEDGER_CREATION_BACKOFF_SECONDS = 1.0


class LedgerRollover(LedgerBase):
    """The ledgers' life (part of ``ledger.ManagedLedger``)."""

    @property
    def backing_off(self) -> bool:
        """True while a failed ledger creation or a failed write holds new ledgers back."""
        return time.monotonic() - self._creation_failed_at < LEDGER_CREATION_BACKOFF_SECONDS

    def _start_ledger(self, extra: tuple[tuple[str, bytes], ...]) -> Ledger:
        """Allocate a ledger, record it in metadata, then create its file."""
        if self.backing_off:
            raise StorageError(f"{self._name}: waiting for new ledger creation to complete")
        ledger_id, counter_item = self._ctx.allocate_ledger_id()
        led = Ledger(ledger_id, 0, 0, LedgerState.OPEN)
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

    def _seal_current(self) -> None:
        """Close the current ledger (once its appends are durable) without starting another:
        on a full disk, so that retention can delete it once it is consumed."""
        led = self._current
        if led is None or led.state is not LedgerState.OPEN or led.entries == 0:
            return
        led.state = LedgerState.SEALED
        if led.durable == led.entries:
            self._close_ledger(led)
            self._persist_quietly()

    def _rollover(self) -> Ledger:
        old = self._current
        if old is not None:
            old.state = LedgerState.SEALED
            if old.durable == old.entries:
                self._close_ledger(old)
        # A sealed ledger stays unclosed in metadata until its last appends are durable.
        return self._start_ledger(())

    def _close_ledger(self, led: Ledger) -> None:
        """Make ``led`` read-only with its durable entries; the caller persists metadata."""
        led.entries = led.durable
        led.state = LedgerState.CLOSED
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

    def _on_durable(self, led: Ledger, durable: int, n: int) -> None:
        seg = led.segment
        if seg is None or led.state is LedgerState.DELETED:
            return
        added = seg.data_size(led.durable, durable)
        led.durable = durable
        led.size += added
        self._num_entries += n
        self._total_size += added
        self._lac = Position(led.ledger_id, durable - 1)
        self._pending -= n
        if led.state is LedgerState.SEALED and durable == led.entries:
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

    def _on_failed(self, led: Ledger, err: StorageError, n: int) -> None:
        if led.state in (LedgerState.OPEN, LedgerState.SEALED):
            # This group and every later append to the ledger fail (its segment is marked
            # failed), and once it is closed they report to nobody: count them all now, or
            # close() would wait for them for ever.
            self._pending -= led.entries - led.durable
            self._fail_ledger(led, err)
        if self._closed and self._pending == 0:
            self._finish_close()

    def _fail_ledger(self, led: Ledger, err: StorageError) -> None:
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

    def _use(self, seg: Segment) -> None:
        """Mark the writable ``seg`` used, reopening its files if they were parked."""
        try:
            self._ctx.writable.use(seg)
        except OSError as exc:
            raise StorageError(f"cannot reopen ledger {seg.ledger_id}: {exc}") from exc
