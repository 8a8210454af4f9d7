"""Exclusive hash-range selector for Key_Shared STICKY mode (client-chosen ranges).

Each consumer brings its own inclusive ranges within ``[0, 65536]`` (the bound the Java client
checks). Ranges of different consumers must not overlap; hashes no consumer covers select ``None``
and their messages wait until a consumer covering them arrives. Ranges never move between live
consumers, so there is nothing to drain.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from typing import Generic

from keyshared.broker.dispatch.selectors.base import C, ConsumerAssignError, HashRange
from keyshared.broker.dispatch.selectors.hashing import DEFAULT_RANGE_SIZE, hash_range_slot
from keyshared.broker.dispatch.selectors.ranges import (
    Assignment,
    ImpactedRanges,
    RangeMove,
    ranges_by_consumer,
)
from keyshared.broker.dispatch.selectors.table import EMPTY_TABLE, TABLE_SIZE, apply_moves


class HashRangeExclusiveStickyKeyConsumerSelector(Generic[C]):
    """Client-chosen, non-overlapping ranges; uncovered hashes have no consumer."""

    def __init__(self, range_size: int = DEFAULT_RANGE_SIZE) -> None:
        if not 1 <= range_size <= TABLE_SIZE:
            raise ValueError(f"range_size must be within [1, {TABLE_SIZE}]")
        self.key_hash_range_size = range_size
        self.key_hash_range: HashRange = (0, range_size - 1)
        # Ranges sorted by start, as three parallel lists so select() is one bisect.
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._owners: list[C] = []
        self._ranges_of: dict[C, list[HashRange]] = {}
        self._table: Sequence[C | None] = EMPTY_TABLE

    def sticky_key_hash(self, key: bytes) -> int:
        """Slot formula of this selector: ``pulsar_hash(key) % 65536``, 0 folded to 1."""
        return hash_range_slot(key, self.key_hash_range_size)

    def validate_ranges(self, ranges: Sequence[HashRange] | None) -> list[HashRange]:
        """Check a consumer's own ranges; returns them sorted or raises ``ConsumerAssignError``."""
        if ranges is None:
            raise ConsumerAssignError("Must specify key shared meta for consumer.")
        if not ranges:
            raise ConsumerAssignError("Ranges for KeyShared policy must not be empty.")
        limit = self.key_hash_range_size
        ordered = sorted((int(start), int(end)) for start, end in ranges)
        for i, (start, end) in enumerate(ordered):
            if start > end:
                raise ConsumerAssignError(
                    f"Fixed hash range start > end for range: [{start},{end}]"
                )
            if start < 0 or end > limit:
                raise ConsumerAssignError(
                    f"Fixed hash range [{start},{end}] is outside [0,{limit}]"
                )
            if i + 1 < len(ordered):
                next_start, next_end = ordered[i + 1]
                if next_start <= end:
                    raise ConsumerAssignError(
                        f"Consumer's own ranges conflict: [{start},{end}] overlaps with "
                        f"[{next_start},{next_end}]"
                    )
        return ordered

    def find_conflicting_consumer(self, ranges: Sequence[HashRange]) -> C | None:
        """The first present consumer owning a hash in one of ``ranges``, if any."""
        for start, end in ranges:
            # The only candidates are the range starting at or before ``start`` and the first
            # range starting after it; anything further right starts after one of those ends.
            i = bisect_right(self._starts, start) - 1
            if i >= 0 and self._ends[i] >= start:
                return self._owners[i]
            if i + 1 < len(self._starts) and self._starts[i + 1] <= end:
                return self._owners[i + 1]
        return None

    def add_consumer(
        self, consumer: C, ranges: Sequence[HashRange] | None = None
    ) -> ImpactedRanges[C]:
        """Give ``consumer`` exactly ``ranges``, or raise ``ConsumerAssignError``.

        Refused: no or empty ranges, a range with start > end or outside ``[0, 65536]``, the
        consumer's own ranges overlapping, or overlap with another consumer (the error then
        carries ``conflicting_consumer``; the caller may check that one is still alive, remove it
        and retry, as Pulsar does).
        """
        if consumer in self._ranges_of:
            raise ValueError(f"consumer {consumer!r} is already in the selector")
        ordered = self.validate_ranges(ranges)
        conflicting = self.find_conflicting_consumer(ordered)
        if conflicting is not None:
            raise ConsumerAssignError(
                f"Range conflict with consumer {conflicting.consumer_name}",
                conflicting_consumer=conflicting,
            )
        for start, end in ordered:
            i = bisect_left(self._starts, start)
            self._starts.insert(i, start)
            self._ends.insert(i, end)
            self._owners.insert(i, consumer)
        self._ranges_of[consumer] = ordered
        return self._changed(RangeMove(s, e, None, consumer) for s, e in ordered)

    def remove_consumer(self, consumer: C) -> ImpactedRanges[C]:
        """Drop ``consumer``'s ranges; its hashes have no consumer until someone covers them."""
        ranges = self._ranges_of.pop(consumer, None)
        if ranges is None:
            return ImpactedRanges()
        for start, _ in ranges:
            i = bisect_left(self._starts, start)
            del self._starts[i]
            del self._ends[i]
            del self._owners[i]
        return self._changed(RangeMove(s, e, consumer, None) for s, e in ranges)

    def _changed(self, moves: Iterable[RangeMove[C]]) -> ImpactedRanges[C]:
        impacted = ImpactedRanges.from_moves(moves)
        self._table = apply_moves(self._table, impacted.moves, not self._ranges_of)
        return impacted

    def select(self, sticky_key_hash: int) -> C | None:
        """The consumer whose range holds the hash, or ``None`` when no range covers it."""
        size = self.key_hash_range_size
        if 0 <= sticky_key_hash < size:
            return self._table[sticky_key_hash]
        slot = sticky_key_hash % size
        i = bisect_right(self._starts, slot) - 1
        if i >= 0 and slot <= self._ends[i]:
            return self._owners[i]
        return None

    def select_key(self, key: bytes) -> C | None:
        """``select(sticky_key_hash(key))``."""
        return self.select(hash_range_slot(key, self.key_hash_range_size))

    def get_assignments(self) -> list[Assignment[C]]:
        """Sorted, disjoint ``(start, end, consumer)``; gaps are hashes nobody covers."""
        return list(zip(self._starts, self._ends, self._owners, strict=True))

    def get_consumer_key_hash_ranges(self) -> dict[C, list[HashRange]]:
        """Each consumer's merged inclusive ranges (stats ``keyHashRangeArrays``)."""
        return ranges_by_consumer(self.get_assignments())

    def uncovered_ranges(self) -> list[HashRange]:
        """Hashes of ``[0, 65535]`` no consumer covers (their messages wait)."""
        gaps: list[HashRange] = []
        cursor = 0
        last = self.key_hash_range_size - 1
        for start, end in zip(self._starts, self._ends, strict=True):
            if start > cursor:
                gaps.append((cursor, min(start - 1, last)))
            cursor = max(cursor, end + 1)
        if cursor <= last:
            gaps.append((cursor, last))
        return [g for g in gaps if g[0] <= g[1]]

    def consumers(self) -> list[C]:
        """The consumers in the selector, in the order they were added."""
        return list(self._ranges_of)

    def __len__(self) -> int:
        return len(self._ranges_of)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._ranges_of
