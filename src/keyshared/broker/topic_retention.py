"""A persistent topic's retention and expiry: trimming the ledgers every durable cursor has
consumed (as the retention policy allows) and message TTL."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from keyshared.broker.compaction import COMPACTION_SUBSCRIPTION
from keyshared.storage.errors import StorageError
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.topic import PersistentTopic

log = logging.getLogger("keyshared.broker.topic")


class TopicRetention:
    """Retention and expiry of one persistent topic."""

    def __init__(self, topic: PersistentTopic) -> None:
        self.topic = topic
        # Publish time of a closed ledger's last entry, by ledger id.
        self._ledger_times: dict[int, int] = {}
        self._trim_failing = False

    async def trim_consumed_ledgers(self) -> list[int]:
        """Delete closed ledgers every durable cursor has passed, as retention allows.

        Pulsar's rule: a consumed ledger goes (oldest first) once the consumed data is over
        the retention size or the ledger is older than the retention time; -1 means no limit
        on that side, and the default 0/0 deletes consumed data as soon as its ledger is
        closed. Non-durable cursors (readers) hold nothing, as in Pulsar. A ledger's age is
        the publish time of its last entry.
        """
        ledger = self.topic.ledger
        # Every ledger but the one taking appends; after a write failure on a full disk there
        # is none, and the failed (closed) ledger can go too, which is what frees the space.
        current = ledger.current_ledger_id
        ledgers = [li for li in ledger.ledgers if li.ledger_id != current]
        if not ledgers:
            return []
        durable = [s.cursor for s in self.topic.subscriptions.values() if s.durable]
        durable += self.topic.replication.cursors()
        if durable:
            bound = ledger.next_position(min(c.mark_delete_position for c in durable))
        else:
            bound = ledger.next_position(ledger.last_add_confirmed)
        consumed = [
            li
            for li in ledgers
            if li.ledger_id < bound.ledger_id
            or (li.ledger_id == bound.ledger_id and li.entries <= bound.entry_id)
        ]
        if not consumed:
            return []
        time_min = int(self.topic.policy("retentionTimeInMinutes"))
        size_mb = int(self.topic.policy("retentionSizeInMB"))
        if time_min < 0 and size_mb < 0:
            return []
        now_ms = time.time() * 1000
        retained = sum(li.size for li in consumed)
        last_doomed = None
        for li in consumed:
            over_size = size_mb >= 0 and retained > size_mb * 1024 * 1024
            expired = False
            if time_min >= 0 and not over_size:
                closed_at = await self._ledger_time(li.ledger_id, li.entries)
                expired = closed_at is not None and now_ms - closed_at > time_min * 60_000
            if not (over_size or expired):
                break
            retained -= li.size
            last_doomed = li
        if last_doomed is None:
            return []
        # The deduplication snapshot must cover what is about to disappear.
        self.topic.snapshot_dedup()
        try:
            trimmed = ledger.trim(Position(last_doomed.ledger_id, last_doomed.entries))
        except StorageError as exc:
            # The metadata store is full too: try again next round, logging once per streak.
            if not self._trim_failing:
                log.error("%s: cannot trim consumed ledgers: %s", self.topic.name, exc)
            self._trim_failing = True
            return []
        self._trim_failing = False
        return trimmed

    async def _ledger_time(self, ledger_id: int, entries: int) -> int | None:
        """Publish time of a ledger's last entry (cached: closed ledgers do not change)."""
        cached = self._ledger_times.get(ledger_id)
        if cached is not None:
            return cached
        if entries <= 0:
            return 0
        entry = await self.topic.ledger.read_entry(Position(ledger_id, entries - 1))
        if entry is None:
            return None
        value = self.topic.entry_meta(entry).publish_time
        self._ledger_times[ledger_id] = value
        return value

    async def expire_messages(self) -> None:
        """Message TTL: entries older than ``message_ttl_in_seconds`` are acked on every durable
        subscription (Pulsar's expiry monitor, which moves the mark-delete position)."""
        ttl = int(self.topic.policy("message_ttl_in_seconds"))
        if ttl > 0:
            await self.expire_older_than(ttl)

    async def expire_older_than(self, seconds: int) -> None:
        """Ack, on every durable subscription, the entries published more than ``seconds``
        ago (message TTL, and the backlog quota's eviction by age)."""
        # The compaction cursor is not a consumer: its data must reach compaction (as Pulsar).
        subs = [
            s
            for s in self.topic.subscriptions.values()
            if s.durable and s.name != COMPACTION_SUBSCRIPTION
        ]
        if not subs or self.topic.ledger.last_add_confirmed.entry_id < 0:
            return
        cutoff = int(time.time() * 1000) - seconds * 1000
        first_live = await self.topic.find_position_by_time(cutoff + 1)
        last_expired = self.topic.ledger.previous_position(first_live)
        if last_expired.entry_id < 0:
            return
        for sub in subs:
            cursor = sub.cursor
            if last_expired > cursor.mark_delete_position:
                cursor.ack_cumulative(last_expired)
                sub.last_expire_timestamp = int(time.time() * 1000)
                sub._after_manual_ack(release_held=True)
