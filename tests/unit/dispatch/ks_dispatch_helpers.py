"""Shared fakes and reference models for the dispatch unit tests (selectors, draining, acks)."""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from keyshared.broker.dispatch.selectors.ranges import Assignment, RangeMove

DOMAIN_END = 65536  # arrays are indexed 0..65536 so every selector's domain fits


@dataclass(eq=False)
class FakeConsumer:
    """A consumer with identity semantics: two fakes with one name are two consumers."""

    consumer_name: str
    tag: int = 0

    def __repr__(self) -> str:
        return f"<{self.consumer_name}#{self.tag}>"


def reference_murmur3_32(data: bytes, seed: int = 0) -> int:
    """Plain-Python MurmurHash3 x86_32 (research §1.3), independent of the mmh3 package."""
    c1, c2, h, n = 0xCC9E2D51, 0x1B873593, seed, len(data)
    for i in range(n // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    k = 0
    for i, b in enumerate(data[(n // 4) * 4 :]):
        k ^= b << (8 * i)
    k = (k * c1) & 0xFFFFFFFF
    k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
    k = (k * c2) & 0xFFFFFFFF
    h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def reference_pulsar_hash(data: bytes) -> int:
    """Pulsar's Murmur3_32Hash.makeHash via the reference implementation."""
    return reference_murmur3_32(data) & 0x7FFFFFFF


def owner_array(assignments: Sequence[Assignment[FakeConsumer]]) -> list[FakeConsumer | None]:
    """Expand an assignment list into owner-by-hash for hashes 0..65536."""
    owners: list[FakeConsumer | None] = [None] * (DOMAIN_END + 1)
    for start, end, consumer in assignments:
        owners[start : end + 1] = [consumer] * (end - start + 1)
    return owners


def change_runs(
    before: Sequence[FakeConsumer | None], after: Sequence[FakeConsumer | None]
) -> list[RangeMove[FakeConsumer]]:
    """Maximal runs of hashes whose owner changed, with the same (before, after) pair."""
    runs: list[RangeMove[FakeConsumer]] = []
    run_start = -1
    run_pair: tuple[FakeConsumer | None, FakeConsumer | None] = (None, None)
    for h, (b, a) in enumerate(zip(before, after, strict=True)):
        if run_start >= 0 and (b is not run_pair[0] or a is not run_pair[1]):
            runs.append(RangeMove(run_start, h - 1, *run_pair))
            run_start = -1
        if b is not a and run_start < 0:
            run_start, run_pair = h, (b, a)
    if run_start >= 0:
        runs.append(RangeMove(run_start, len(before) - 1, *run_pair))
    return runs


def assert_exact_moves(
    before: Sequence[Assignment[FakeConsumer]],
    after: Sequence[Assignment[FakeConsumer]],
    moves: Sequence[RangeMove[FakeConsumer]],
) -> None:
    """Check ``moves`` are exactly the maximal runs of owner changes from ``before`` to ``after``.

    All three are piecewise constant with boundaries among the cuts collected below, so checking
    one hash per elementary segment checks every hash, at a fraction of a full 65536-hash scan.
    """
    owners_before = owner_array(before)
    owners_after = owner_array(after)
    cuts = {0, DOMAIN_END + 1}
    for start, end, _ in (*before, *after):
        cuts.update((start, end + 1))
    for move in moves:
        assert move.start <= move.end
        cuts.update((move.start, move.end + 1))
    starts = [m.start for m in moves]
    ordered = sorted(cuts)
    for lo, nxt in itertools.pairwise(ordered):
        b, a = owners_before[lo], owners_after[lo]
        i = bisect_right(starts, lo) - 1
        covering = moves[i] if i >= 0 and moves[i].end >= lo else None
        if b is a:
            assert covering is None, (lo, nxt - 1, covering)
        else:
            assert covering is not None, (lo, nxt - 1, b, a)
            assert covering.before is b and covering.after is a, (lo, covering, b, a)
    for m1, m2 in itertools.pairwise(moves):
        assert m1.end < m2.start
        if m1.end + 1 == m2.start:
            assert (m1.before, m1.after) != (m2.before, m2.after), "moves are not maximal"
