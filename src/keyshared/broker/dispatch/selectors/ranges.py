"""Hash-range bookkeeping for the selectors: merged ranges, assignment diffs, impacted ranges.

``ImpactedRanges`` plays the part of Pulsar's ``ImpactedConsumersResult``: what one consumer join or
leave moved, from which consumer to which. Pulsar computes it by diffing two
``ConsumerHashAssignmentsSnapshot`` lists; :func:`diff_assignments` does the same, but exactly even
when the assignments have gaps (STICKY mode), where Pulsar's two-pointer sweep can miss the part of
a range that lies before an overlap.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, NamedTuple

from keyshared.broker.dispatch.selectors.base import C, HashRange

Assignment = tuple[int, int, C]
"""``(start, end, consumer)``: one inclusive range and its owner, in a sorted, disjoint list."""


def merge_ranges(ranges: Iterable[HashRange]) -> list[HashRange]:
    """Sort ``ranges`` and join the overlapping and adjacent ones (Pulsar's mergeOverlappingRanges)."""
    merged: list[HashRange] = []
    for start, end in sorted(ranges):
        if merged and merged[-1][1] >= start - 1:
            last_start, last_end = merged[-1]
            if end > last_end:
                merged[-1] = (last_start, end)
        else:
            merged.append((start, end))
    return merged


def ranges_by_consumer(assignments: Iterable[Assignment[C]]) -> dict[C, list[HashRange]]:
    """Group a sorted assignment list by consumer, adjacent ranges merged, in ring order."""
    grouped: dict[C, list[HashRange]] = {}
    for start, end, consumer in assignments:
        ranges = grouped.get(consumer)
        if ranges is None:
            grouped[consumer] = [(start, end)]
        elif ranges[-1][1] == start - 1:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    return grouped


class RemovedHashRanges:
    """The merged hash ranges one consumer lost in a change; answers "is this hash in them"."""

    __slots__ = ("_ends", "_starts")

    def __init__(self, ranges: Iterable[HashRange]) -> None:
        merged = merge_ranges(ranges)
        self._starts = [start for start, _ in merged]
        self._ends = [end for _, end in merged]

    def contains_sticky_key(self, sticky_key_hash: int) -> bool:
        """Whether ``sticky_key_hash`` lies in one of the ranges."""
        i = bisect_right(self._starts, sticky_key_hash) - 1
        return i >= 0 and sticky_key_hash <= self._ends[i]

    __contains__ = contains_sticky_key

    def as_ranges(self) -> list[HashRange]:
        """The merged, sorted, inclusive ranges."""
        return list(zip(self._starts, self._ends, strict=True))

    def is_fully_contained_in_ranges(self, ranges: Iterable[HashRange]) -> bool:
        """Whether every range here lies inside one of ``ranges`` (merged first)."""
        outer = RemovedHashRanges(ranges)
        for start, end in zip(self._starts, self._ends, strict=True):
            i = bisect_right(outer._starts, start) - 1
            if i < 0 or end > outer._ends[i]:
                return False
        return True

    def hash_count(self) -> int:
        """How many hashes the ranges cover."""
        return sum(end - start + 1 for start, end in zip(self._starts, self._ends, strict=True))

    def __len__(self) -> int:
        return len(self._starts)

    def __repr__(self) -> str:
        return f"RemovedHashRanges({self.as_ranges()!r})"


class RangeMove(NamedTuple, Generic[C]):
    """Hashes ``[start, end]`` moved from ``before`` to ``after`` (``None`` = no consumer)."""

    start: int
    end: int
    before: C | None
    after: C | None


class ImpactedRanges(Generic[C]):
    """What one selector change moved: disjoint, sorted, maximal :class:`RangeMove` runs.

    A hash appears in a move exactly when its owner differs before and after the change.
    """

    __slots__ = ("_removed", "moves")

    def __init__(self, moves: Sequence[RangeMove[C]] = ()) -> None:
        self.moves: tuple[RangeMove[C], ...] = tuple(moves)
        self._removed: dict[C, RemovedHashRanges] | None = None

    @classmethod
    def from_moves(cls, moves: Iterable[RangeMove[C]]) -> ImpactedRanges[C]:
        """Build from disjoint moves in any order: sort, drop no-ops, join adjacent equal moves."""
        joined: list[RangeMove[C]] = []
        for move in sorted(moves, key=_move_start):
            if move.before is move.after:
                continue
            if joined:
                last = joined[-1]
                if (
                    last.end + 1 == move.start
                    and last.before is move.before
                    and last.after is move.after
                ):
                    joined[-1] = RangeMove(last.start, move.end, last.before, last.after)
                    continue
            joined.append(move)
        return cls(joined)

    def removed_ranges_by_consumer(self) -> dict[C, RemovedHashRanges]:
        """Per consumer that lost hashes, the ranges it lost (Pulsar's processRemovedHashRanges)."""
        if self._removed is None:
            lost: dict[C, list[HashRange]] = {}
            for move in self.moves:
                if move.before is not None:
                    lost.setdefault(move.before, []).append((move.start, move.end))
            self._removed = {c: RemovedHashRanges(r) for c, r in lost.items()}
        return self._removed

    def removed_ranges(self, consumer: C) -> RemovedHashRanges | None:
        """The ranges ``consumer`` lost, or ``None`` if it lost nothing."""
        return self.removed_ranges_by_consumer().get(consumer)

    def added_ranges_by_consumer(self) -> dict[C, list[HashRange]]:
        """Per consumer that gained hashes, the merged ranges it gained."""
        gained: dict[C, list[HashRange]] = {}
        for move in self.moves:
            if move.after is not None:
                gained.setdefault(move.after, []).append((move.start, move.end))
        return {c: merge_ranges(r) for c, r in gained.items()}

    def owner_change(self, sticky_key_hash: int) -> tuple[C | None, C | None] | None:
        """``(before, after)`` if the hash moved in this change, else ``None``."""
        i = bisect_right(self.moves, sticky_key_hash, key=_move_start) - 1
        if i >= 0 and sticky_key_hash <= self.moves[i].end:
            move = self.moves[i]
            return (move.before, move.after)
        return None

    def hash_count(self) -> int:
        """How many hashes changed owner."""
        return sum(move.end - move.start + 1 for move in self.moves)

    def __iter__(self) -> Iterator[RangeMove[C]]:
        return iter(self.moves)

    def __len__(self) -> int:
        return len(self.moves)

    def __bool__(self) -> bool:
        return bool(self.moves)

    def __repr__(self) -> str:
        return f"ImpactedRanges({list(self.moves)!r})"


def _move_start(move: RangeMove[C]) -> int:
    return move.start


def diff_assignments(
    before: Sequence[Assignment[C]], after: Sequence[Assignment[C]]
) -> ImpactedRanges[C]:
    """The exact owner changes between two sorted, disjoint assignment lists (gaps allowed)."""
    cuts: set[int] = set()
    for start, end, _ in before:
        cuts.add(start)
        cuts.add(end + 1)
    for start, end, _ in after:
        cuts.add(start)
        cuts.add(end + 1)
    points = sorted(cuts)
    moves: list[RangeMove[C]] = []
    bi = ai = 0
    nb, na = len(before), len(after)
    # Every range boundary is a cut, so each owner is constant between two consecutive cuts.
    for k in range(len(points) - 1):
        lo = points[k]
        while bi < nb and before[bi][1] < lo:
            bi += 1
        while ai < na and after[ai][1] < lo:
            ai += 1
        owner_before = before[bi][2] if bi < nb and before[bi][0] <= lo else None
        owner_after = after[ai][2] if ai < na and after[ai][0] <= lo else None
        if owner_before is owner_after:
            continue
        hi = points[k + 1] - 1
        if moves:
            last = moves[-1]
            if last.end + 1 == lo and last.before is owner_before and last.after is owner_after:
                moves[-1] = RangeMove(last.start, hi, owner_before, owner_after)
                continue
        moves.append(RangeMove(lo, hi, owner_before, owner_after))
    return ImpactedRanges(moves)


def check_assignments(assignments: Sequence[Assignment[C]]) -> None:
    """Raise ``ValueError`` unless the list is sorted, disjoint and every range is valid."""
    previous_end: int | None = None
    for start, end, consumer in assignments:
        if consumer is None or end < start:
            raise ValueError(f"invalid assignment ({start}, {end}, {consumer!r})")
        if previous_end is not None and start <= previous_end:
            raise ValueError("assignments must be sorted and non-overlapping")
        previous_end = end
