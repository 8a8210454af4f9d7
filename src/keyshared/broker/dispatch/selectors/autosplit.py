"""Auto-split hash-range selector (``subscriptionKeySharedUseConsistentHashing=false``).

The PIP-34 "hash layer" example, as Pulsar implements it: consumers own contiguous ranges keyed by
their inclusive upper bound. The first consumer owns ``[0, range_size]``. A new consumer halves the
biggest range (the first one found when sizes tie) and takes its lower half. A leaving consumer's
range goes to the consumer above it; the topmost consumer's range goes to the one below it.

PIP-34 sketches splitting the *busiest* consumer's range by dispatch rate; Pulsar splits the biggest
range instead, and so do we, so that ``keyHashRangeArrays`` match a Pulsar broker's. Like Pulsar, the
top bound is ``range_size`` itself (65536), one past the last slot any key can hash to.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Generic

from keyshared.broker.dispatch.selectors.base import C, ConsumerAssignError, HashRange
from keyshared.broker.dispatch.selectors.hashing import DEFAULT_RANGE_SIZE, hash_range_slot
from keyshared.broker.dispatch.selectors.ranges import (
    Assignment,
    ImpactedRanges,
    diff_assignments,
    ranges_by_consumer,
)
from keyshared.broker.dispatch.selectors.table import EMPTY_TABLE, TABLE_SIZE, apply_moves


class HashRangeAutoSplitStickyKeyConsumerSelector(Generic[C]):
    """Contiguous ranges split in halves on join, handed to a neighbour on leave."""

    def __init__(self, range_size: int = DEFAULT_RANGE_SIZE) -> None:
        if not 2 <= range_size <= TABLE_SIZE or range_size & (range_size - 1):
            raise ValueError(f"range_size must be a power of 2 within [2, {TABLE_SIZE}]")
        self.key_hash_range_size = range_size
        self.key_hash_range: HashRange = (0, range_size - 1)
        # Upper bounds (sorted) and their owners, parallel, so select() is one bisect.
        self._bounds: list[int] = []
        self._owners: list[C] = []
        self._bound_of: dict[C, int] = {}
        self._snapshot: list[Assignment[C]] = []
        self._table: Sequence[C | None] = EMPTY_TABLE

    def sticky_key_hash(self, key: bytes) -> int:
        """Slot formula of this selector: ``pulsar_hash(key) % 65536``, 0 folded to 1."""
        return hash_range_slot(key, self.key_hash_range_size)

    def add_consumer(
        self, consumer: C, ranges: Sequence[HashRange] | None = None
    ) -> ImpactedRanges[C]:
        """Give ``consumer`` half of the biggest range; ``ranges`` is ignored (AUTO_SPLIT).

        Raises ``ConsumerAssignError`` when the biggest range cannot be halved any more.
        """
        if consumer in self._bound_of:
            raise ValueError(f"consumer {consumer!r} is already in the selector")
        if not self._bounds:
            self._insert(self.key_hash_range_size, consumer)
        else:
            upper = self._biggest_range_bound()
            i = bisect_left(self._bounds, upper)
            lower = self._bounds[i - 1] if i > 0 else 0
            if upper - lower <= 1:
                raise ConsumerAssignError(
                    "No more range can assigned to new consumer, assigned consumers "
                    f"{len(self._bounds)}"
                )
            self._insert(upper - ((upper - lower) >> 1), consumer)
        return self._refresh()

    def remove_consumer(self, consumer: C) -> ImpactedRanges[C]:
        """Hand ``consumer``'s range to its neighbour (no-op for an unknown consumer)."""
        bound = self._bound_of.pop(consumer, None)
        if bound is None:
            return ImpactedRanges()
        i = bisect_left(self._bounds, bound)
        if bound == self.key_hash_range_size and len(self._bounds) > 1:
            # The top bound must stay so every slot has a ceiling: the consumer below moves up.
            below = self._owners[i - 1]
            del self._bounds[i - 1]
            del self._owners[i - 1]
            self._owners[-1] = below
            self._bound_of[below] = bound
        else:
            del self._bounds[i]
            del self._owners[i]
        return self._refresh()

    def _insert(self, bound: int, consumer: C) -> None:
        i = bisect_left(self._bounds, bound)
        self._bounds.insert(i, bound)
        self._owners.insert(i, consumer)
        self._bound_of[consumer] = bound

    def _biggest_range_bound(self) -> int:
        # Sizes are measured as bound - previous bound (0 for the first), as Pulsar does, so the
        # first range counts one slot less than it holds; ties keep the lowest range.
        biggest, best = 0, self.key_hash_range_size
        previous = 0
        for bound in self._bounds:
            if bound - previous > biggest:
                biggest, best = bound - previous, bound
            previous = bound
        return best

    def _refresh(self) -> ImpactedRanges[C]:
        before = self._snapshot
        after: list[Assignment[C]] = []
        start = 0
        for bound, owner in zip(self._bounds, self._owners, strict=True):
            after.append((start, bound, owner))
            start = bound + 1
        self._snapshot = after
        impacted = diff_assignments(before, after)
        self._table = apply_moves(self._table, impacted.moves, not after)
        return impacted

    def select(self, sticky_key_hash: int) -> C | None:
        """The consumer whose range holds ``sticky_key_hash``, or ``None`` if there is none."""
        if 0 <= sticky_key_hash < TABLE_SIZE:
            return self._table[sticky_key_hash]
        i = bisect_left(self._bounds, sticky_key_hash)
        return self._owners[i] if i < len(self._owners) else None

    def select_key(self, key: bytes) -> C | None:
        """``select(sticky_key_hash(key))``."""
        return self.select(hash_range_slot(key, self.key_hash_range_size))

    def get_assignments(self) -> list[Assignment[C]]:
        """Sorted, disjoint ``(start, end, consumer)`` covering ``[0, range_size]``."""
        return self._snapshot

    def get_consumer_key_hash_ranges(self) -> dict[C, list[HashRange]]:
        """Each consumer's inclusive range (stats ``keyHashRangeArrays``)."""
        return ranges_by_consumer(self._snapshot)

    def consumers(self) -> list[C]:
        """The consumers in the selector, in the order they were added."""
        return list(self._bound_of)

    def __len__(self) -> int:
        return len(self._bound_of)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._bound_of
