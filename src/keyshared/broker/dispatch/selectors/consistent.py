"""Consistent-hashing selector: the default for Key_Shared AUTO_SPLIT (Pulsar 4.x semantics).

Each consumer puts ``replica_points`` points on a ring over slots ``[1, 65535]``; a hash belongs to
the first point at or after it (wrapping to the first point). Point keys are
``name NUL name_index NUL i`` so that "consumer1"/"consumer11" cannot collide (Pulsar #22050) and
consumers sharing a name get disjoint point sets: each live consumer of a name holds the lowest free
name index, and a consumer that leaves and comes back gets its old index, hence its old points.

When two points collide, the consumer added first keeps the point and the later ones queue behind
it; removing the holder promotes the next in line (Pulsar's ``HashRingPointEntry``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Generic

from keyshared.broker.dispatch.selectors.base import C, HashRange
from keyshared.broker.dispatch.selectors.hashing import (
    CONSISTENT_HASHING_RANGE_END,
    DEFAULT_RANGE_SIZE,
    consistent_hashing_slot,
)
from keyshared.broker.dispatch.selectors.ranges import (
    Assignment,
    ImpactedRanges,
    RangeMove,
    ranges_by_consumer,
)
from keyshared.broker.dispatch.selectors.table import EMPTY_TABLE, TABLE_SIZE, apply_moves

DEFAULT_REPLICA_POINTS = 100
"""``subscriptionKeySharedConsistentHashingReplicaPoints`` default."""

_RANGE_START = 1
_RANGE_END = CONSISTENT_HASHING_RANGE_END


def ring_point_hash(consumer_name: str, name_index: int, point_index: int) -> int:
    """The ring slot of one consumer point: ``makeStickyKeyHash(name \\0 index \\0 i)``."""
    return consistent_hashing_slot(f"{consumer_name}\0{name_index}\0{point_index}".encode())


class _NameIndexTracker:
    """Pulsar's ``ConsumerNameIndexTracker``: lowest free index per consumer name."""

    __slots__ = ("_used",)

    def __init__(self) -> None:
        self._used: dict[str, set[int]] = {}

    def allocate(self, name: str) -> int:
        used = self._used.setdefault(name, set())
        index = 0
        while index in used:
            index += 1
        used.add(index)
        return index

    def release(self, name: str, index: int) -> None:
        used = self._used.get(name)
        if used is not None:
            used.discard(index)
            if not used:
                del self._used[name]


class ConsistentHashingStickyKeyConsumerSelector(Generic[C]):
    """Consistent hashing over ``[1, 65535]`` with ``replica_points`` points per consumer."""

    key_hash_range_size = DEFAULT_RANGE_SIZE
    key_hash_range: HashRange = (_RANGE_START, _RANGE_END)

    def __init__(self, replica_points: int = DEFAULT_REPLICA_POINTS) -> None:
        if replica_points < 1:
            raise ValueError("replica_points must be at least 1")
        self.replica_points = replica_points
        # The ring as two parallel sorted lists so select() is one bisect and one index.
        self._points: list[int] = []
        self._owners: list[C] = []
        # point -> consumers on it in arrival order; [0] is the selected one.
        self._entries: dict[int, list[C]] = {}
        # consumer -> (name index, its distinct points)
        self._consumers: dict[C, tuple[int, tuple[int, ...]]] = {}
        self._names = _NameIndexTracker()
        self._snapshot: list[Assignment[C]] | None = None
        self._table: Sequence[C | None] = EMPTY_TABLE
        self.last_add_collisions = 0

    # --- hashing -------------------------------------------------------------------------
    @staticmethod
    def sticky_key_hash(key: bytes) -> int:
        """Slot formula of this selector: ``pulsar_hash(key) % 65535 + 1``."""
        return consistent_hashing_slot(key)

    # --- membership ----------------------------------------------------------------------
    def add_consumer(
        self, consumer: C, ranges: Sequence[HashRange] | None = None
    ) -> ImpactedRanges[C]:
        """Put ``consumer``'s points on the ring; ``ranges`` is ignored (AUTO_SPLIT mode)."""
        if consumer in self._consumers:
            raise ValueError(f"consumer {consumer!r} is already in the selector")
        name = consumer.consumer_name
        name_index = self._names.allocate(name)
        points = tuple(
            dict.fromkeys(ring_point_hash(name, name_index, i) for i in range(self.replica_points))
        )
        self._consumers[consumer] = (name_index, points)
        entries = self._entries
        new_points: list[int] = []
        previous_owners: list[C | None] = []
        collisions = 0
        for point in points:
            holders = entries.get(point)
            if holders is None:
                entries[point] = [consumer]
                new_points.append(point)
                previous_owners.append(self._select_on_ring(point))
            else:
                holders.append(consumer)
                collisions += 1
        self.last_add_collisions = collisions
        for point in new_points:
            i = bisect_left(self._points, point)
            self._points.insert(i, point)
            self._owners.insert(i, consumer)
        self._snapshot = None
        # A new point takes over exactly the arc between it and its predecessor on the new ring;
        # every other arc keeps its owner because existing points keep their selected consumer.
        moves = [
            move
            for point, before in zip(new_points, previous_owners, strict=True)
            for move in self._arc_moves(point, before, consumer)
        ]
        return self._changed(moves)

    def remove_consumer(self, consumer: C) -> ImpactedRanges[C]:
        """Take ``consumer``'s points off the ring (no-op for an unknown consumer)."""
        tracked = self._consumers.pop(consumer, None)
        if tracked is None:
            return ImpactedRanges()
        name_index, points = tracked
        self._names.release(consumer.consumer_name, name_index)
        entries = self._entries
        promoted: list[tuple[int, C]] = []
        deleted: list[int] = []
        for point in points:
            holders = entries[point]
            was_selected = holders[0] is consumer
            remaining = [c for c in holders if c is not consumer]
            if not remaining:
                del entries[point]
                deleted.append(point)
            else:
                entries[point] = remaining
                if was_selected:
                    promoted.append((point, remaining[0]))
        # Arcs are measured on the ring as it was: a deleted point's arc goes to the next
        # surviving point, whose owner is only known once all deletions are done.
        moves: list[RangeMove[C]] = []
        for point, new_owner in promoted:
            moves.extend(self._arc_moves(point, consumer, new_owner))
            self._owners[bisect_left(self._points, point)] = new_owner
        deleted_arcs = [(point, self._arc_bounds(point)) for point in deleted]
        for point in deleted:
            i = bisect_left(self._points, point)
            del self._points[i]
            del self._owners[i]
        for point, bounds in deleted_arcs:
            after = self._select_on_ring(point)
            moves.extend(RangeMove(lo, hi, consumer, after) for lo, hi in bounds)
        self._snapshot = None
        return self._changed(moves)

    def _changed(self, moves: list[RangeMove[C]]) -> ImpactedRanges[C]:
        impacted = ImpactedRanges.from_moves(moves)
        self._table = apply_moves(self._table, impacted.moves, not self._points)
        return impacted

    def _arc_bounds(self, point: int) -> list[HashRange]:
        """The hashes ``point`` owns on the current ring (the first point also owns the tail)."""
        points = self._points
        i = bisect_left(points, point)
        if i > 0:
            return [(points[i - 1] + 1, point)]
        bounds = [(_RANGE_START, point)]
        last = points[-1]
        if last < _RANGE_END:
            bounds.append((last + 1, _RANGE_END))
        return bounds

    def _arc_moves(self, point: int, before: C | None, after: C | None) -> list[RangeMove[C]]:
        return [RangeMove(lo, hi, before, after) for lo, hi in self._arc_bounds(point)]

    # --- lookup --------------------------------------------------------------------------
    def select(self, sticky_key_hash: int) -> C | None:
        """The consumer owning ``sticky_key_hash`` (ceiling point, wrapping), or ``None``."""
        if 0 < sticky_key_hash < TABLE_SIZE:
            return self._table[sticky_key_hash]
        return self._select_on_ring(sticky_key_hash)

    def _select_on_ring(self, sticky_key_hash: int) -> C | None:
        owners = self._owners
        if not owners:
            return None
        i = bisect_left(self._points, sticky_key_hash)
        return owners[i] if i < len(owners) else owners[0]

    def select_key(self, key: bytes) -> C | None:
        """``select(sticky_key_hash(key))``."""
        return self.select(consistent_hashing_slot(key))

    def get_assignments(self) -> list[Assignment[C]]:
        """Sorted, disjoint ``(start, end, consumer)`` covering ``[1, 65535]`` (empty if none)."""
        if self._snapshot is None:
            self._snapshot = self._build_snapshot()
        return self._snapshot

    def _build_snapshot(self) -> list[Assignment[C]]:
        points, owners = self._points, self._owners
        if not points:
            return []
        result: list[Assignment[C]] = []
        start = _RANGE_START
        for point, owner in zip(points, owners, strict=True):
            if result and result[-1][2] is owner:
                result[-1] = (result[-1][0], point, owner)
            else:
                result.append((start, point, owner))
            start = point + 1
        if points[-1] < _RANGE_END:
            first = owners[0]
            if result[-1][2] is first:
                result[-1] = (result[-1][0], _RANGE_END, first)
            else:
                result.append((points[-1] + 1, _RANGE_END, first))
        return result

    def get_consumer_key_hash_ranges(self) -> dict[C, list[HashRange]]:
        """Each consumer's merged inclusive ranges (stats ``keyHashRangeArrays``)."""
        return ranges_by_consumer(self.get_assignments())

    def consumers(self) -> list[C]:
        """The consumers in the selector, in the order they were added."""
        return list(self._consumers)

    def consumer_points(self, consumer: C) -> tuple[int, ...]:
        """The distinct ring points of ``consumer`` (empty if unknown)."""
        tracked = self._consumers.get(consumer)
        return tracked[1] if tracked is not None else ()

    def name_index(self, consumer: C) -> int:
        """The name index of ``consumer`` among consumers with its name (-1 if unknown)."""
        tracked = self._consumers.get(consumer)
        return tracked[0] if tracked is not None else -1

    def __len__(self) -> int:
        return len(self._consumers)

    def __contains__(self, consumer: object) -> bool:
        return consumer in self._consumers
