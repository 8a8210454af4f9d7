"""Driver side of the source: which topic partitions exist, where each one ends, and ranges.

With ``admin.url`` the planner reads ``internalStats`` (ledger list and last confirmed entry) for
exact counts, subscription cursors and data-loss checks. Without it, the last entry comes from
``GET_LAST_MESSAGE_ID`` on a helper consumer per partition (a durable subscription named
``<prefix>-latest-<random>``, removed by :meth:`Planner.close`).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pulsar

from keyshared.spark.options import SourceOptions
from keyshared.spark.positions import (
    BEFORE_ALL,
    LedgerInfo,
    Pos,
    first_entry,
    last_entry,
    ledgers_from_internal_stats,
    parse_acked_ranges,
    parse_pos,
)
from keyshared.spark.reading import DataLossError, shared_client
from keyshared.spark.topics import Admin, Topic, expand_partitions, match_pattern

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PartitionState:
    """What the planner knows of one topic partition at one moment."""

    topic: Topic
    latest: Pos
    ledgers: list[LedgerInfo] | None
    stats: dict[str, Any] | None


class Planner:
    """Resolves topics and reads partition ends; long-lived in a streaming query's driver."""

    def __init__(self, opts: SourceOptions, *, cache_seconds: float = 0.0) -> None:
        self.opts = opts
        self.admin = Admin(opts.admin_url) if opts.admin_url else None
        self.cache_seconds = cache_seconds
        self._client: pulsar.Client | None = None
        self._latest_consumers: dict[str, Any] = {}
        self._latest_sub = (
            f"{opts.subscription_prefix or 'keyshared-spark'}-latest-" + (uuid.uuid4().hex[:10])
        )
        self._snapshot: tuple[float, dict[str, PartitionState]] | None = None
        self._known_sizes: dict[tuple[str, int], int] = {}

    @property
    def client(self) -> pulsar.Client:
        """The driver's client (created on first use)."""
        if self._client is None:
            self._client = shared_client(self.opts.service_url, self.opts.client_kwargs)
        return self._client

    # --- topics ---------------------------------------------------------------------------
    def topic_partitions(self) -> list[Topic]:
        """Every topic partition to read, in name order."""
        if self.opts.topics_pattern:
            assert self.admin is not None
            return match_pattern(self.admin, self.opts.topics_pattern)
        out: list[Topic] = []
        for name in self.opts.topics:
            topic = Topic.parse(name)
            if self.admin is not None:
                out.extend(expand_partitions(topic, self.admin.partitions(topic)))
            else:
                out.extend(Topic.parse(p) for p in self.client.get_topic_partitions(topic.full))
        return out

    # --- ends -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, PartitionState]:
        """Each partition's latest entry (and ledgers when the admin API is known)."""
        now = time.monotonic()
        if self._snapshot is not None and now - self._snapshot[0] < self.cache_seconds:
            return self._snapshot[1]
        states = {t.full: self._state(t) for t in self.topic_partitions()}
        self._snapshot = (now, states)
        return states

    def _state(self, topic: Topic) -> PartitionState:
        if self.admin is None:
            return PartitionState(topic, self._latest_by_consumer(topic), None, None)
        stats = self.admin.internal_stats(topic)
        if stats is None:
            return PartitionState(topic, BEFORE_ALL, [], None)
        ledgers = ledgers_from_internal_stats(stats)
        for li in ledgers:
            self._known_sizes[(topic.full, li.ledger_id)] = li.entries
        latest = last_entry(ledgers)
        lac = stats.get("lastConfirmedEntry")
        if lac:
            # An entry counted in the ledger list may not be readable yet (not yet durable).
            latest = min(latest, parse_pos(str(lac)))
            if latest[1] < 0:
                latest = last_entry([li for li in ledgers if li.ledger_id < latest[0]])
        return PartitionState(topic, latest, ledgers, stats)

    def _latest_by_consumer(self, topic: Topic) -> Pos:
        consumer = self._latest_consumers.get(topic.full)
        if consumer is None:
            consumer = self.client.subscribe(
                topic.full,
                self._latest_sub,
                receiver_queue_size=1,
                initial_position=pulsar.InitialPosition.Latest,
            )
            self._latest_consumers[topic.full] = consumer
        mid = consumer.get_last_message_id()
        if mid.ledger_id() < 0 or mid.entry_id() < 0:
            return BEFORE_ALL
        return (mid.ledger_id(), mid.entry_id())

    # --- subscriptions and data loss ------------------------------------------------------
    @staticmethod
    def cursor_start(state: PartitionState, subscription: str) -> tuple[Pos, list[tuple[Pos, Pos]]]:
        """A subscription's mark-delete position and acknowledged holes on one partition."""
        cursors = (state.stats or {}).get("cursors") or {}
        cursor = cursors.get(subscription)
        if cursor is None:
            raise ValueError(f"subscription {subscription!r} not found on {state.topic.full}")
        mdp = parse_pos(str(cursor["markDeletePosition"]))
        return mdp, parse_acked_ranges(str(cursor.get("individuallyDeletedMessages") or ""))

    def check_data_loss(self, state: PartitionState, start: Pos) -> None:
        """Fail (or warn, with ``failOnDataLoss=false``) when entries right after ``start``
        were deleted before this query read them.

        When ``start``'s ledger is gone and stored entries begin later, entries were lost unless
        ``start`` was that ledger's last entry, which is known only if this planner saw the
        ledger (ends on a ledger's last entry are written ``NEXT:-1``, see
        :func:`keyshared.spark.positions.advance`, so this case is rare).
        """
        if start == BEFORE_ALL or state.ledgers is None:
            return
        if any(li.ledger_id == start[0] for li in state.ledgers):
            return
        first = first_entry(state.ledgers)
        if first is None or first <= start:
            return
        size = self._known_sizes.get((state.topic.full, start[0]))
        if size is not None and start[1] + 1 >= size:
            return
        text = (
            f"{state.topic.full}: ledger {start[0]} was deleted with entries after "
            f"{start[0]}:{start[1]} unread; the first stored entry is {first[0]}:{first[1]}"
        )
        if self.opts.fail_on_data_loss:
            raise DataLossError(text + " (set failOnDataLoss=false to go on)")
        log.warning("%s: skipped", text)

    def close(self) -> None:
        """Remove the helper subscriptions."""
        for consumer in self._latest_consumers.values():
            try:
                consumer.unsubscribe()
            except Exception:  # the topic may be gone; nothing else to clean
                log.debug("unsubscribe of %s failed", self._latest_sub, exc_info=True)
            try:
                consumer.close()
            except Exception:
                log.debug("close failed", exc_info=True)
        self._latest_consumers.clear()
