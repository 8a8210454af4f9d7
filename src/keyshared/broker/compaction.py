"""Topic compaction: the compactor of one topic, and reads of its compacted view.

Compaction keeps the latest message of every key (an empty payload deletes the key) in a
managed ledger of its own, ``<topic>/__compacted/<n>`` (see :mod:`compacted_view`), covering
the topic up to a *horizon*. It runs when an admin asks (``PUT .../compaction``) or when the
topic's data after the last horizon grows past ``brokerServiceCompactionThresholdInBytes``
(namespace policy ``compaction_threshold``, topic policy ``compactionThreshold``).

It reads through a durable subscription ``__compaction`` (as Pulsar does), whose mark-delete
position is the horizon: it holds the topic's data until compaction has seen it, and is left
out of message expiry. Its two passes use the cursor's rewind under the epoch rule (see
:mod:`compaction_passes`). A finished compaction is committed in this order: the new ledger is
durable, the metadata record ``compaction/<topic>`` names it and its horizon, then the cursor's
mark-delete moves to the horizon and the previous compacted ledger is deleted. A crash between
the record and the cursor is repaired when the topic loads (the record wins).

Consumers and readers with ``read_compacted`` (Exclusive and Failover only, as in Pulsar) read
the compacted ledger while their read position is at or before the horizon, each entry under
its original message id, then the topic after the horizon. Such a read carries the cursor's
epoch like any other: if the cursor is moved by hand while it is in flight, it is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keyshared.broker.compacted_view import (
    CompactedEntry,
    CompactedView,
    as_entry,
    encode_record,
)
from keyshared.broker.compaction_passes import CompactionStats, compact_range
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.protocol.metadata import num_messages, parse_metadata
from keyshared.storage import batch_ack
from keyshared.storage.cursor import ManagedCursor, ReadResult
from keyshared.storage.position import EARLIEST, Position

if TYPE_CHECKING:
    from keyshared.broker.consumer import Consumer
    from keyshared.broker.subscription import Subscription
    from keyshared.broker.topic import PersistentTopic

log = logging.getLogger(__name__)

COMPACTION_SUBSCRIPTION = "__compaction"
RECORD_PREFIX = "compaction/"
COMPACTED_INFIX = "/__compacted/"


@dataclass(slots=True)
class CompactedReadResult(ReadResult):
    """A read of the compacted view: ``ack_sets`` has the wire ack set (set bit = deliver) of
    every batch entry some of whose messages were compacted out or acked."""

    ack_sets: dict[Position, list[int]] = field(default_factory=dict)


class Compactor:
    """The compaction state of one topic (see the module docstring)."""

    def __init__(self, topic: PersistentTopic) -> None:
        self.topic = topic
        self.status = "NOT_RUN"
        self.last_error = ""
        self.last_stats: CompactionStats | None = None
        self.runs = 0
        self._task: asyncio.Task[None] | None = None
        self._view: CompactedView | None = None
        self._next_check = 0.0
        self._background: set[asyncio.Future[None]] = set()
        # Per consumer: (cursor epoch, where its next compacted read starts). Kept only while
        # the epoch is the one our own last read left, so any hand move resets it.
        self._resume: weakref.WeakKeyDictionary[Consumer, tuple[int, Position]] = (
            weakref.WeakKeyDictionary()
        )
        record = self._metadata.get_json(self._record_key)
        self._record: dict[str, Any] | None = record if isinstance(record, dict) else None
        self._repair_cursor()

    # --- state -------------------------------------------------------------------------------

    @property
    def _metadata(self) -> Any:
        return self.topic.service.storage.metadata

    @property
    def _record_key(self) -> str:
        return RECORD_PREFIX + self.topic.name.full

    @property
    def horizon(self) -> Position | None:
        """Everything up to here is in the compacted ledger (None: never compacted)."""
        if self._record is None:
            return None
        ledger_id, entry_id = self._record["horizon"]
        return Position(int(ledger_id), int(entry_id))

    @property
    def compacted_ledger_name(self) -> str | None:
        """The managed ledger holding the compacted view."""
        return str(self._record["ledger"]) if self._record is not None else None

    @property
    def is_running(self) -> bool:
        """Whether a compaction is in progress."""
        return self._task is not None and not self._task.done()

    def status_json(self) -> dict[str, str]:
        """Pulsar's ``LongRunningProcessStatus``."""
        return {"status": self.status, "lastError": self.last_error}

    def _subscription(self, create: bool) -> Subscription | None:
        sub = self.topic.subscriptions.get(COMPACTION_SUBSCRIPTION)
        if sub is None and create:
            sub = self.topic._create_subscription(COMPACTION_SUBSCRIPTION, True, True, None)
        return sub

    def _repair_cursor(self) -> None:
        """After a crash between the record and the cursor, move the cursor to the horizon."""
        horizon = self.horizon
        sub = self._subscription(create=False)
        if horizon is None or sub is None:
            return
        cursor = sub.cursor
        if cursor.mark_delete_position < horizon <= cursor.last_add_confirmed:
            cursor.ack_cumulative(horizon)
            cursor.persist(force=True)

    def view(self) -> CompactedView | None:
        """The current compacted view, its ledger opened on first use."""
        if self._view is None and self._record is not None:
            name = str(self._record["ledger"])
            ledger = self.topic.service.storage.open_managed_ledger(name)
            horizon = self.horizon
            assert horizon is not None
            self._view = CompactedView(name, horizon, ledger)
        return self._view

    # --- running -----------------------------------------------------------------------------

    def trigger(self) -> asyncio.Task[None]:
        """Start a compaction; BrokerError(NotAllowedError) while one runs (HTTP 409)."""
        if self.topic.closed:
            raise BrokerError(ServerError.ServiceNotReady, f"Topic {self.topic.name} is closing")
        if self.is_running:
            raise BrokerError(ServerError.NotAllowedError, "Compaction already in progress")
        self.status = "RUNNING"
        self._task = asyncio.ensure_future(self._run())
        return self._task

    async def _run(self) -> None:
        try:
            self.last_stats = await self._compact()
            self.status = "SUCCESS"
            self.last_error = ""
        except asyncio.CancelledError:
            self.status = "ERROR"
            self.last_error = "compaction cancelled"
            raise
        except Exception as exc:
            log.exception("compaction of %s failed", self.topic.name)
            self.status = "ERROR"
            self.last_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.runs += 1

    async def _compact(self) -> CompactionStats:
        topic = self.topic
        sub = self._subscription(create=True)
        assert sub is not None
        cursor = sub.cursor
        end = topic.ledger.last_add_confirmed
        if end.entry_id < 0 or end <= cursor.mark_delete_position:
            return CompactionStats()
        await self._drop_orphans()
        previous = self.view()
        if previous is not None:
            await previous.ensure_index()
        floor = previous.horizon if previous is not None else EARLIEST
        seq = int(self._record["seq"]) if self._record is not None else 0
        out = _Output(self, seq + 1, end)

        stats = await compact_range(
            cursor,
            previous.chunks if previous is not None else None,
            floor,
            end,
            out.write,
            retain_null_key=bool(topic.config.topicCompactionRetainNullKey),
            reset_output=out.restart,
        )
        await out.durable()
        if topic.closed or cursor.closed:
            out.discard()
            raise RuntimeError("topic closed during compaction")
        self._commit(out, cursor)
        return stats

    def _commit(self, out: _Output, cursor: ManagedCursor) -> None:
        view = out.view
        view.mark_indexed()
        record = {
            "ledger": view.name,
            "horizon": [view.horizon.ledger_id, view.horizon.entry_id],
            "seq": out.seq,
        }
        self._metadata.put_json(self._record_key, record)
        old = self._view
        self._record = record
        self._view = view
        if view.horizon > cursor.mark_delete_position:
            cursor.ack_cumulative(view.horizon)
        cursor.persist(force=True)
        if old is not None:
            self.retire(old)

    def retire(self, view: CompactedView) -> None:
        """Delete ``view``'s ledger once no read is using it."""
        view.retired = True
        if view.readers == 0:
            self._spawn(self._delete_ledger(view.name))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _delete_ledger(self, name: str) -> None:
        try:
            await self.topic.service.storage.delete_managed_ledger(name)
        except Exception:  # pragma: no cover - a leftover is dropped by the next compaction
            log.exception("cannot delete compacted ledger %s", name)

    async def _drop_orphans(self) -> None:
        """Compacted ledgers a crash left behind (not the current one)."""
        prefix = self.topic.name.full + COMPACTED_INFIX
        current = self.compacted_ledger_name
        storage = self.topic.service.storage
        for name in storage.managed_ledger_names():
            if name.startswith(prefix) and name != current:
                await self._delete_ledger(name)

    # --- threshold -----------------------------------------------------------------------------

    def threshold(self) -> int:
        """Bytes after the horizon that trigger compaction (0: off): topic policy
        ``compactionThreshold``, else namespace ``compaction_threshold``, else broker."""
        return int(self.topic.service.policies.effective(self.topic.name, "compactionThreshold"))

    def backlog_bytes(self) -> int:
        """Estimated bytes after the compaction cursor's mark-delete (the whole topic when
        compaction never ran), as Pulsar's check."""
        sub = self._subscription(create=False)
        ledger = self.topic.ledger
        if sub is None:
            return ledger.total_size
        mdp = sub.cursor.mark_delete_position
        total = 0
        for info in ledger.ledgers:
            if info.ledger_id > mdp.ledger_id:
                total += info.size
            elif info.ledger_id == mdp.ledger_id and info.entries > 0:
                after = max(info.entries - mdp.entry_id - 1, 0)
                total += info.size * after // info.entries
        return total

    def check_threshold(self, now: float | None = None) -> bool:
        """Called every second by the broker's periodic work: at most once per
        ``brokerServiceCompactionMonitorIntervalInSeconds``, start a compaction when the data
        after the horizon is over the threshold. Returns whether one was started."""
        now = time.monotonic() if now is None else now
        if now < self._next_check or self.topic.closed:
            return False
        self._next_check = now + max(
            float(self.topic.config.brokerServiceCompactionMonitorIntervalInSeconds), 0.1
        )
        threshold = self.threshold()
        if threshold <= 0 or self.is_running:
            return False
        # With a threshold set, the compaction cursor must exist so that nothing is trimmed
        # before compaction has seen it (Pulsar's preCreateSubscriptionForCompactionIfNeeded).
        self._subscription(create=True)
        if self.backlog_bytes() <= threshold:
            return False
        self.trigger()
        return True

    # --- reads of the compacted view -------------------------------------------------------------

    def read_entries_or_wait(
        self, cursor: ManagedCursor, max_entries: int, consumer: Consumer
    ) -> Awaitable[ReadResult]:
        """A sequential read for a ``read_compacted`` consumer: the compacted view up to the
        horizon, then the topic. Same contract as ``ManagedCursor.read_entries_or_wait``."""
        if self._record is None:
            return cursor.read_entries_or_wait(max_entries)
        return self._read_compacted(cursor, max_entries, consumer)

    async def _read_compacted(
        self, cursor: ManagedCursor, max_entries: int, consumer: Consumer
    ) -> ReadResult:
        view = self.view()
        assert view is not None
        horizon = view.horizon
        ledger = self.topic.ledger
        epoch = cursor.epoch
        start = cursor.read_position
        resume = self._resume.get(consumer)
        if resume is not None and resume[0] == epoch:
            start = resume[1]
        elif resume is None and self._at_start(cursor):
            # A consumer starting from the very beginning sees what compaction kept of data
            # the topic no longer holds (Pulsar's "read from earliest" on the first read).
            start = EARLIEST
        if start > horizon:
            self._resume.pop(consumer, None)
            return await cursor.read_entries_or_wait(max_entries)
        view.readers += 1
        try:
            records = await view.read(start, max_entries)
        finally:
            view.readers -= 1
            if view.retired and view.readers == 0:
                self.retire(view)
        if cursor.epoch != epoch or cursor.closed or view is not self._view:
            # Moved by hand (or compacted again) while in flight: drop, as the epoch rule says.
            return ReadResult([], epoch, stale=True)
        if not records:
            after = ledger.next_position(horizon)
            if after > cursor.read_position:
                cursor.seek(after)
            self._resume.pop(consumer, None)
            return await cursor.read_entries_or_wait(max_entries)
        read_from = cursor.read_position
        last = records[-1].position
        nxt = ledger.next_position(last)
        if nxt > cursor.read_position:
            # Our own read moved the read position: the seek starts a new epoch, which the
            # resume point below is tied to.
            cursor.seek(nxt)
        # Where the next compacted read starts, even where the topic no longer holds data.
        self._resume[consumer] = (cursor.epoch, last.next())
        return self._deliverable(cursor, records, epoch, read_from)

    async def last_message_id(self) -> tuple[Position, int] | None:
        """For GET_LAST_MESSAGE_ID of a ``read_compacted`` consumer: when nothing follows the
        horizon, the id of the last message the compacted view holds (the topic's last one may
        have been compacted out, and a reader would wait for it forever); else None."""
        view = self.view()
        if view is None or self.topic.ledger.last_add_confirmed > view.horizon:
            return None
        last = await view.last()
        if last is None:
            return EARLIEST, -1
        if last.mask is not None:
            return last.position, last.mask.bit_length() - 1
        n = num_messages(parse_metadata(last.data))
        return last.position, n - 1 if n > 1 else -1

    def _at_start(self, cursor: ManagedCursor) -> bool:
        ledger = self.topic.ledger
        rp = cursor.read_position
        first = ledger.first_position or ledger.next_position(ledger.last_add_confirmed)
        return rp <= first and cursor.mark_delete_position == ledger.previous_position(rp)

    @staticmethod
    def _deliverable(
        cursor: ManagedCursor, records: list[CompactedEntry], epoch: int, read_from: Position
    ) -> CompactedReadResult:
        """The records not acked on ``cursor``, with the ack set each partial batch needs.

        Records before ``read_from`` (read from the start, where the topic no longer holds
        data) lie at or before the cursor's mark-delete without having been consumed: shown.
        """
        result = CompactedReadResult([], epoch)
        batch_bits = cursor.batch_deleted_indexes
        for r in records:
            pos = r.position
            if pos >= read_from and cursor.is_acked(pos):
                continue
            bits = r.mask
            partial = batch_bits.get(pos) if batch_bits else None
            if partial is not None:
                bits = partial if bits is None else bits & partial
            if bits is not None:
                if bits == 0:
                    continue
                result.ack_sets[pos] = batch_ack.to_words(bits)
            result.entries.append(as_entry(r))
        return result

    # --- lifecycle -----------------------------------------------------------------------------

    def forget(self) -> None:
        """The compaction subscription was deleted: so is the compacted view (as Pulsar)."""
        if self._task is not None:
            self._task.cancel()
        name = self.compacted_ledger_name
        self._metadata.delete(self._record_key)
        self._record = None
        view, self._view = self._view, None
        if view is not None:
            self.retire(view)
        elif name is not None:
            self._spawn(self._delete_ledger(name))
        self.status = "NOT_RUN"

    async def close(self) -> None:
        """Stop a running compaction and close the compacted ledger."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        view, self._view = self._view, None
        if view is not None and not view.ledger.is_closed:
            await view.ledger.close()


class _Output:
    """The compacted ledger being written; a restarted pass starts a fresh one."""

    def __init__(self, compactor: Compactor, seq: int, horizon: Position) -> None:
        self.compactor = compactor
        self.seq = seq
        self.horizon = horizon
        self._futures: list[asyncio.Future[None]] = []
        self.view = self._open()

    def _open(self) -> CompactedView:
        topic = self.compactor.topic
        name = f"{topic.name.full}{COMPACTED_INFIX}{self.seq}"
        ledger = topic.service.storage.open_managed_ledger(name)
        return CompactedView(name, self.horizon, ledger)

    def write(self, original: Position, section: bytes, checksum: int, mask: int | None) -> None:
        """Append one kept entry."""
        record = encode_record(original, section, checksum, mask)
        pos, fut = self.view.ledger.add_entry(record)
        self.view.record_written(original, pos)
        self._futures.append(fut)

    def restart(self) -> None:
        """Throw away what was written; the passes run again."""
        self.discard()
        self.seq += 1
        self._futures = []
        self.view = self._open()

    def discard(self) -> None:
        """Delete the ledger written so far."""
        self.compactor.retire(self.view)

    async def durable(self) -> None:
        """Wait until every appended record is durable."""
        futures, self._futures = self._futures, []
        if futures:
            await asyncio.gather(*futures)
