"""RangeSet cases the property tests reached only by chance: each kills a mutant that survived
``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet

P = Position


def test_a_reversed_span_inside_a_range_counts_nothing() -> None:
    rs = RangeSet([(P(1, 0), P(1, 10))])
    assert rs.cardinality(P(1, 8), P(1, 2)) == 0
    assert rs.cardinality(P(2, 0), P(1, 5)) == 0
    assert rs.cardinality(P(1, 2), P(1, 8)) == 7


def test_sets_of_the_same_ledgers_with_other_ranges_differ() -> None:
    a = RangeSet([(P(1, 0), P(1, 3))])
    b = RangeSet([(P(1, 0), P(1, 4))])
    assert a != b
    assert a == RangeSet([(P(1, 0), P(1, 3))])


def test_repr_shows_the_first_eight_ranges() -> None:
    assert repr(RangeSet()) == "RangeSet()"
    assert repr(RangeSet([(P(1, 0), P(1, 10))])) == "RangeSet([1:0..1:10])"
    many = RangeSet([(P(1, 2 * i), P(1, 2 * i)) for i in range(9)])
    assert repr(many).endswith("[1:14..1:14], ...)")
    assert repr(many).count("..") == 8 + 1
    eight = RangeSet([(P(1, 2 * i), P(1, 2 * i)) for i in range(8)])
    assert not repr(eight).endswith(", ...)")
