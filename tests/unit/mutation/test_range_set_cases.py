"""RangeSet cases the property tests reached only by chance: each kills a mutant that survived
``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

import pytest

from keyshared.storage.cursor_codec import CursorCodecError
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


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x02\x01\x03\x01\x05\x01\x00\x03\x01\x05\x01", "range set ledgers not increasing"),
        (b"\x01\x00\x03\x01\x05", "truncated range set"),
        (b"\x01\x00\x03\x01\x05\x01\x07", "trailing data in range set"),
        (b"\x01\x00\x03\x01\x05\x00", "range set boundaries not increasing"),
        (b"\x01\x00\x03\x02\x05\x01", "corrupt range set block"),
        # A delta of 200 takes two bytes: the varint path, not the one-byte fast path.
        (b"\x01\x00\x06\x02\x05\xc8\x01\x00\x01", "range set boundaries not increasing"),
    ],
)
def test_corrupt_input_is_refused_with_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(CursorCodecError, match=f"^{message}$"):
        RangeSet.from_bytes(data)


def test_bad_positions_are_named() -> None:
    rs = RangeSet()
    with pytest.raises(ValueError, match=r"^not an entry position: 1:-1$"):
        rs.add(P(1, -1))
    with pytest.raises(ValueError, match=r"^range 1:0\.\.2:0 spans ledgers$"):
        rs.add_range(P(1, 0), P(2, 0))
    with pytest.raises(ValueError, match=r"^not an entry position: 1:-2$"):
        rs.add_range(P(1, -2), P(1, 3))


def test_one_byte_deltas_ending_at_two_to_the_31_round_trip() -> None:
    # 32 single-entry ranges whose last boundary (one past the last entry) is exactly 2**31:
    # the one-byte fast path must pack them in 8-byte fields, or the last one overflows.
    rs = RangeSet()
    for i in range(32):
        rs.add(P(1, 2**31 - 63 + 2 * i))
    data = rs.to_bytes()
    assert RangeSet.from_bytes(data) == rs
    # count, ledger id, block size; then k, the first boundary (5 bytes), 63 one-byte deltas.
    assert len(data) == 3 + 1 + 5 + 63
