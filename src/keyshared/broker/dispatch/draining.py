"""PIP-379 draining hashes: a hash that moved to another consumer waits for its old owner.

When a consumer join or leave moves a hash range, every hash in it that the *old* owner still holds
unacked entries for becomes "draining": it stays blocked for everyone else until those entries are
acked (or the old owner leaves). The entry's ``ref_count`` is the number of pending *entries* (a
batch counts once) the old owner holds for the hash; ``blocked_count`` counts refused deliveries.

Differences from Pulsar 4.x's ``DrainingHashesTracker``, both deliberate:

* A hash that moves back to the consumer draining it stops draining at that change, and
  registering a hash already draining for the *same* consumer sets its count to the entries that
  consumer holds rather than adding them again. Pulsar 4.0 did neither, so a hash that moved away,
  came back without a delivery and moved away again (a consumer reconnecting under the same name)
  was counted twice and stayed blocked until the old owner disconnected (apache/pulsar#23845,
  fixed upstream by PR 24736).
* :meth:`DrainingHashesTracker.would_block` and :meth:`DrainingHashesTracker.blocker_of` answer
  questions without side effects (for look-ahead and for "what blocks this hash").

Single-threaded: the broker touches it only from its event loop, so there are no locks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic

from keyshared.broker.dispatch.pending_acks import PendingAcksMap
from keyshared.broker.dispatch.selectors.base import C
from keyshared.broker.dispatch.selectors.hashing import STICKY_KEY_HASH_NOT_SET
from keyshared.broker.dispatch.selectors.ranges import ImpactedRanges, RemovedHashRanges

UnblockingHandler = Callable[[int], None]
"""Called with a hash that got unblocked, or ``-1`` after a batch that unblocked some."""

BATCH_UNBLOCKED = -1
"""The hash passed to the unblocking handler when a batch unblocked one or more hashes."""


class DrainingStateError(RuntimeError):
    """Two consumers claim the same draining hash (Pulsar's ``IllegalStateException``)."""


class DrainingHashEntry(Generic[C]):
    """One draining hash: its old owner, pending-entry count and refused deliveries."""

    __slots__ = ("blocked_count", "consumer", "ref_count")

    def __init__(self, consumer: C) -> None:
        self.consumer = consumer
        self.ref_count = 0
        self.blocked_count = 0

    def __repr__(self) -> str:
        return (
            f"DrainingHashEntry({self.consumer!r}, ref_count={self.ref_count}, "
            f"blocked_count={self.blocked_count})"
        )


@dataclass(frozen=True, slots=True)
class DrainingHashStat:
    """One row of the consumer stats ``drainingHashes`` list."""

    hash: int
    unack_msgs: int
    blocked_attempts: int

    def to_json(self) -> dict[str, int]:
        """Pulsar's JSON field names."""
        return {
            "hash": self.hash,
            "unackMsgs": self.unack_msgs,
            "blockedAttempts": self.blocked_attempts,
        }


@dataclass(frozen=True, slots=True)
class DrainingHashesStats:
    """A consumer's draining-hash stats (PR 23429)."""

    draining_hashes_count: int = 0
    draining_hashes_cleared_total: int = 0
    draining_hashes_unacked_messages: int = 0
    draining_hashes: tuple[DrainingHashStat, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """Pulsar's JSON field names, ready to merge into the consumer stats object."""
        return {
            "drainingHashesCount": self.draining_hashes_count,
            "drainingHashesClearedTotal": self.draining_hashes_cleared_total,
            "drainingHashesUnackedMessages": self.draining_hashes_unacked_messages,
            "drainingHashes": [row.to_json() for row in self.draining_hashes],
        }


@dataclass(frozen=True, slots=True)
class HashBlocker(Generic[C]):
    """Why a hash is blocked: the consumer draining it and what it still holds.

    ``positions`` are the unacked positions holding it, when the caller let us look them up.
    """

    sticky_hash: int
    consumer: C
    unacked_entries: int
    blocked_attempts: int
    positions: tuple[Any, ...] = ()


class _ConsumerStats:
    __slots__ = ("cleared_total", "hashes")

    def __init__(self) -> None:
        self.hashes: set[int] = set()
        self.cleared_total = 0


class DrainingHashesTracker(Generic[C]):
    """Hash -> :class:`DrainingHashEntry`, per-consumer stats, and the unblocking callback.

    It also serves as a ``PendingAcksMap`` remove handler (``handle_removing``, ``start_batch``,
    ``end_batch``), so acks flow straight into ref counts.
    """

    def __init__(self, unblocking_handler: UnblockingHandler | None = None, name: str = "") -> None:
        self.name = name
        self.unblocking_handler = unblocking_handler
        self._entries: dict[int, DrainingHashEntry[C]] = {}
        self._stats: dict[C, _ConsumerStats] = {}
        self._batch_level = 0
        self._unblocked_while_batching = False

    # --- core operations ------------------------------------------------------------------
    def add_entry(self, consumer: C, sticky_hash: int, count: int = 1) -> None:
        """Count ``count`` more pending entries of ``consumer`` for draining ``sticky_hash``."""
        if sticky_hash == STICKY_KEY_HASH_NOT_SET:
            raise ValueError("Sticky hash cannot be 0")
        entry = self._entry_for(consumer, sticky_hash)
        entry.ref_count += count

    def _entry_for(self, consumer: C, sticky_hash: int) -> DrainingHashEntry[C]:
        entry = self._entries.get(sticky_hash)
        if entry is None:
            entry = DrainingHashEntry(consumer)
            self._entries[sticky_hash] = entry
            self._stats_of(consumer).hashes.add(sticky_hash)
        elif entry.consumer is not consumer:
            raise DrainingStateError(
                f"Consumer {entry.consumer!r} is already draining hash {sticky_hash} in "
                f"dispatcher {self.name}. Same hash being used for consumer {consumer!r}."
            )
        return entry

    def reduce_ref_count(self, consumer: C, sticky_hash: int, closing: bool = False) -> None:
        """One pending entry of ``consumer`` for ``sticky_hash`` is gone (acked or taken back).

        At zero the hash stops draining; if it had refused deliveries and the consumer is not
        closing, the unblocking handler runs (deferred to the end of a batch).
        """
        entry = self._entries.get(sticky_hash)
        if entry is None:
            return
        if entry.consumer is not consumer:
            raise DrainingStateError(
                f"Consumer {entry.consumer!r} is already draining hash {sticky_hash} in "
                f"dispatcher {self.name}. Same hash being used for consumer {consumer!r}."
            )
        entry.ref_count -= 1
        if entry.ref_count > 0:
            return
        del self._entries[sticky_hash]
        self._clear_stat(consumer, sticky_hash)
        if not closing and entry.blocked_count > 0:
            if self._batch_level > 0:
                self._unblocked_while_batching = True
            elif self.unblocking_handler is not None:
                self.unblocking_handler(sticky_hash)

    def should_block_sticky_key_hash(self, consumer: C, sticky_hash: int) -> bool:
        """Whether delivering ``sticky_hash`` to ``consumer`` must wait; counts blocked attempts.

        A hash that came back to the consumer draining it stops draining (nobody else can hold
        it), and is not blocked.
        """
        entry = self._entries.get(sticky_hash)
        if entry is None:
            return False
        if entry.consumer is consumer:
            del self._entries[sticky_hash]
            self._clear_stat(consumer, sticky_hash)
            return False
        entry.blocked_count += 1
        return True

    def would_block(self, consumer: C, sticky_hash: int) -> bool:
        """``should_block_sticky_key_hash`` without counting or clearing anything."""
        entry = self._entries.get(sticky_hash)
        return entry is not None and entry.consumer is not consumer

    def may_add_pending_ack(self, consumer: C, sticky_hash: int) -> bool:
        """The check of Pulsar's pending-ack add handler: refuse if another consumer drains it.

        The dispatcher re-queues the entry for replay when this says no.
        """
        if sticky_hash == STICKY_KEY_HASH_NOT_SET:
            raise ValueError("Sticky hash cannot be 0")
        entry = self._entries.get(sticky_hash)
        return entry is None or entry.consumer is consumer

    # --- starting to drain ------------------------------------------------------------------
    def start_draining_hashes_for_consumer(
        self,
        consumer: C,
        removed_ranges: RemovedHashRanges,
        pending_sticky_hashes: Iterable[int],
    ) -> int:
        """``consumer`` lost ``removed_ranges``: its pending hashes in them start draining.

        ``pending_sticky_hashes`` yields the sticky hash of each entry the consumer holds (one per
        pending entry; 0 = unknown, skipped). Returns how many hashes are draining for it now.
        """
        counts: dict[int, int] = {}
        contains = removed_ranges.contains_sticky_key
        for sticky_hash in pending_sticky_hashes:
            if sticky_hash != STICKY_KEY_HASH_NOT_SET and contains(sticky_hash):
                counts[sticky_hash] = counts.get(sticky_hash, 0) + 1
        for sticky_hash, count in counts.items():
            # Set, not add: the entry may survive from an earlier move of the same hash.
            self._entry_for(consumer, sticky_hash).ref_count = count
        return len(counts)

    def register_draining_hashes(
        self,
        impacted: ImpactedRanges[C],
        pending_sticky_hashes_of: Callable[[C], Iterable[int]],
        skip: C | None = None,
    ) -> None:
        """Pulsar's ``registerDrainingHashes``: start draining for every consumer that lost ranges.

        ``skip`` is the consumer being added or removed (it has nothing to drain: a new consumer
        holds nothing and a leaving one gives its entries back).
        """
        if self._entries and impacted:
            # A hash that moved back to the consumer draining it stops draining now, rather than
            # lingering until that consumer's next delivery of it (Pulsar #23845 / PR 24736).
            for sticky_hash, entry in list(self._entries.items()):
                change = impacted.owner_change(sticky_hash)
                if change is not None and change[1] is entry.consumer:
                    del self._entries[sticky_hash]
                    self._clear_stat(entry.consumer, sticky_hash)
        for consumer, removed in impacted.removed_ranges_by_consumer().items():
            if consumer is not skip:
                self.start_draining_hashes_for_consumer(
                    consumer, removed, pending_sticky_hashes_of(consumer)
                )

    # --- batching -------------------------------------------------------------------------
    def start_batch(self) -> None:
        """Defer unblocking callbacks until the matching :meth:`end_batch` (nestable)."""
        self._batch_level += 1

    def end_batch(self) -> None:
        """End a batch; the outermost one reports ``-1`` if any hash was unblocked inside."""
        self._batch_level -= 1
        if self._batch_level == 0 and self._unblocked_while_batching:
            self._unblocked_while_batching = False
            if self.unblocking_handler is not None:
                self.unblocking_handler(BATCH_UNBLOCKED)

    @contextmanager
    def batch(self) -> Iterator[None]:
        """``with tracker.batch():`` around many reductions (one callback at the end)."""
        self.start_batch()
        try:
            yield
        finally:
            self.end_batch()

    # --- PendingAcksMap remove-handler protocol --------------------------------------------
    def handle_removing(
        self, consumer: C, position: object, sticky_hash: int, closing: bool
    ) -> None:
        """A pending ack of ``consumer`` went away: ``reduce_ref_count``."""
        self.reduce_ref_count(consumer, sticky_hash, closing)

    # --- queries --------------------------------------------------------------------------
    def get_entry(self, sticky_hash: int) -> DrainingHashEntry[C] | None:
        """The draining entry of ``sticky_hash``, if it is draining."""
        return self._entries.get(sticky_hash)

    def blocker_of(
        self,
        sticky_hash: int,
        pending_acks_of: Callable[[C], PendingAcksMap[C, Any] | None] | None = None,
    ) -> HashBlocker[C] | None:
        """What blocks ``sticky_hash``: the consumer draining it, its unacked entry count, and
        (given ``pending_acks_of``, the consumer -> its pending acks lookup) the positions.

        ``None`` when the hash is not draining.
        """
        entry = self._entries.get(sticky_hash)
        if entry is None:
            return None
        positions: tuple[Any, ...] = ()
        if pending_acks_of is not None:
            pending = pending_acks_of(entry.consumer)
            if pending is not None:
                positions = tuple(
                    pending.positions_for_sticky_hash(sticky_hash, limit=entry.ref_count)
                )
        return HashBlocker(
            sticky_hash, entry.consumer, entry.ref_count, entry.blocked_count, positions
        )

    def draining_hashes_of(self, consumer: C) -> list[int]:
        """The hashes ``consumer`` is draining, ascending."""
        stats = self._stats.get(consumer)
        return sorted(stats.hashes) if stats is not None else []

    def consumer_stats(self, consumer: C) -> DrainingHashesStats:
        """``drainingHashesCount``/``ClearedTotal``/``UnackedMessages``/``drainingHashes``."""
        stats = self._stats.get(consumer)
        if stats is None:
            return DrainingHashesStats()
        rows = []
        unacked = 0
        for sticky_hash in sorted(stats.hashes):
            entry = self._entries.get(sticky_hash)
            if entry is None:
                continue
            rows.append(DrainingHashStat(sticky_hash, entry.ref_count, entry.blocked_count))
            unacked += entry.ref_count
        return DrainingHashesStats(len(rows), stats.cleared_total, unacked, tuple(rows))

    def consumer_removed(self, consumer: C) -> None:
        """Forget ``consumer``'s stats (after its pending acks were closed)."""
        self._stats.pop(consumer, None)

    def clear(self) -> None:
        """Forget everything (the last consumer left)."""
        self._entries.clear()
        self._stats.clear()

    def items(self) -> Iterator[tuple[int, DrainingHashEntry[C]]]:
        """``(hash, entry)`` for every draining hash, in no particular order."""
        return iter(self._entries.items())

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, sticky_hash: object) -> bool:
        return sticky_hash in self._entries

    # --- internals ------------------------------------------------------------------------
    def _stats_of(self, consumer: C) -> _ConsumerStats:
        stats = self._stats.get(consumer)
        if stats is None:
            stats = self._stats[consumer] = _ConsumerStats()
        return stats

    def _clear_stat(self, consumer: C, sticky_hash: int) -> None:
        stats = self._stats.get(consumer)
        if stats is not None:
            stats.hashes.discard(sticky_hash)
            stats.cleared_total += 1
