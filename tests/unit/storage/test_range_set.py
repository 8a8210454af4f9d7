"""RangeSet against a plain set of positions, plus its binary form."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from keyshared.storage.cursor_codec import CursorCodecError
from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet

P = Position
LEDGERS = st.integers(min_value=0, max_value=3)
ENTRIES = st.integers(min_value=0, max_value=40)
POSITIONS = st.builds(Position, LEDGERS, ENTRIES)


def model_ranges(model: set[Position]) -> list[tuple[Position, Position]]:
    """Maximal runs of consecutive entry ids within a ledger."""
    out: list[tuple[Position, Position]] = []
    for p in sorted(model):
        if out and out[-1][1].ledger_id == p.ledger_id and out[-1][1].entry_id + 1 == p.entry_id:
            out[-1] = (out[-1][0], p)
        else:
            out.append((p, p))
    return out


class RangeSetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.rs = RangeSet()
        self.model: set[Position] = set()

    @rule(pos=POSITIONS)
    def add(self, pos: Position) -> None:
        expected = 0 if pos in self.model else 1
        assert self.rs.add(pos) == expected
        self.model.add(pos)

    @rule(ledger=LEDGERS, a=ENTRIES, n=st.integers(min_value=0, max_value=12))
    def add_range(self, ledger: int, a: int, n: int) -> None:
        new = {P(ledger, e) for e in range(a, a + n)}
        expected = len(new - self.model)
        assert self.rs.add_range(P(ledger, a), P(ledger, a + n - 1)) == expected
        self.model |= new

    @rule(pos=st.builds(Position, st.integers(-1, 4), st.integers(-1, 42)))
    def remove_up_to(self, pos: Position) -> None:
        gone = {p for p in self.model if p <= pos}
        assert self.rs.remove_up_to(pos) == len(gone)
        self.model -= gone

    @rule()
    def clear_sometimes(self) -> None:
        if len(self.model) > 60:
            self.rs.clear()
            self.model.clear()

    @rule(a=POSITIONS, b=POSITIONS)
    def cardinality(self, a: Position, b: Position) -> None:
        first, last = min(a, b), max(a, b)
        assert self.rs.cardinality(first, last) == sum(1 for p in self.model if first <= p <= last)
        if first != last:
            assert self.rs.cardinality(last, first) == 0

    @rule(pos=POSITIONS)
    def lookups(self, pos: Position) -> None:
        assert (pos in self.rs) == (pos in self.model)
        assert self.rs.contains(pos) == (pos in self.model)
        containing = [r for r in model_ranges(self.model) if r[0] <= pos <= r[1]]
        assert self.rs.range_containing(pos) == (containing[0] if containing else None)
        after = [r for r in model_ranges(self.model) if r[0] > pos]
        assert self.rs.next_range(pos) == (after[0] if after else None)

    @rule(n=st.integers(min_value=0, max_value=10))
    def truncated_round_trip(self, n: int) -> None:
        data = self.rs.to_bytes(n)
        back = RangeSet.from_bytes(data)
        assert list(back) == self.rs.first_n(n)
        assert len(back) == min(n, len(self.rs))

    @invariant()
    def matches_model(self) -> None:
        ranges = model_ranges(self.model)
        assert list(self.rs) == ranges
        assert len(self.rs) == len(ranges)
        assert self.rs.count == len(self.model)
        assert set(self.rs.positions()) == self.model
        assert self.rs.first_range() == (ranges[0] if ranges else None)
        assert self.rs.last_range() == (ranges[-1] if ranges else None)
        assert RangeSet.from_bytes(self.rs.to_bytes()) == self.rs


TestRangeSetMachine = RangeSetMachine.TestCase
TestRangeSetMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


@given(st.lists(st.tuples(LEDGERS, ENTRIES, st.integers(0, 6)), max_size=30))
@settings(max_examples=200, deadline=None)
def test_round_trip_and_copy(items: list[tuple[int, int, int]]) -> None:
    rs = RangeSet()
    for ledger, a, n in items:
        rs.add_range(P(ledger, a), P(ledger, a + n))
    back = RangeSet.from_bytes(rs.to_bytes())
    assert back == rs
    assert back.count == rs.count
    assert len(back) == len(rs)
    cp = rs.copy()
    cp.add(P(9, 9))
    assert cp != rs


def test_adjacent_ranges_merge_within_a_ledger_only() -> None:
    rs = RangeSet()
    rs.add_range(P(1, 0), P(1, 4))
    rs.add_range(P(1, 6), P(1, 9))
    assert len(rs) == 2
    rs.add(P(1, 5))
    assert list(rs) == [(P(1, 0), P(1, 9))]
    rs.add(P(2, 0))
    # (1, 9) and (2, 0) may be neighbours in a ledger, but the set cannot know it.
    assert list(rs) == [(P(1, 0), P(1, 9)), (P(2, 0), P(2, 0))]


def test_pulsar_string_is_open_closed() -> None:
    rs = RangeSet([(P(3, 5), P(3, 5)), (P(3, 8), P(3, 10)), (P(4, 0), P(4, 0))])
    assert rs.to_pulsar_string() == "[(3:4..3:5], (3:7..3:10], (4:-1..4:0]]"
    assert rs.to_pulsar_string(1) == "[(3:4..3:5]]"
    assert RangeSet().to_pulsar_string() == "[]"


def test_rejects_bad_input() -> None:
    rs = RangeSet()
    with pytest.raises(ValueError):
        rs.add(P(1, -1))
    with pytest.raises(ValueError):
        rs.add_range(P(1, 0), P(2, 0))
    assert rs.add_range(P(1, 5), P(1, 4)) == 0


@pytest.mark.parametrize(
    "data",
    [
        b"\x01\x00\x03\x01\x05",  # block shorter than its length
        b"\x01\x00\x03\x01\x05\x00",  # zero delta (not increasing)
        b"\x01\x00\x03\x01\x05\x01\x07",  # trailing data
        b"\x02\x01\x03\x01\x05\x01\x00\x03\x01\x05\x01",  # ledger ids not increasing
        b"\x01\x00\x03\x02\x05\x01",  # two ranges announced, one given
        b"\x01\x00\x01\xff",  # truncated varint in a block
        b"\xff",  # truncated varint
    ],
)
def test_corrupt_input_is_refused(data: bytes) -> None:
    with pytest.raises(CursorCodecError):
        RangeSet.from_bytes(data)


def test_known_encoding() -> None:
    rs = RangeSet([(P(0, 5), P(0, 5))])
    assert rs.to_bytes() == b"\x01\x00\x03\x01\x05\x01"
    assert RangeSet.from_bytes(b"") == RangeSet()
    assert RangeSet().to_bytes() == b"\x00"


def test_encoding_cache_follows_changes() -> None:
    rs = RangeSet()
    for ledger in range(3):
        rs.add_range(P(ledger, 0), P(ledger, 3))
        rs.add(P(ledger, 9))
    first = rs.to_bytes()
    assert rs.to_bytes() == first
    back = RangeSet.from_bytes(first)
    back.add(P(1, 5))
    rs.add(P(1, 5))
    assert back.to_bytes() == rs.to_bytes() != first
    rs.remove_up_to(P(0, 9))
    assert RangeSet.from_bytes(rs.to_bytes()) == rs
    assert RangeSet.from_bytes(rs.to_bytes(1)).first_n(5) == rs.first_n(1)


def test_every_other_entry_costs_two_bytes_a_range() -> None:
    rs = RangeSet()
    for e in range(0, 20_000, 2):
        rs.add(P(7, e))
    assert len(rs) == 10_000
    data = rs.to_bytes()
    assert len(data) < 2 * 10_000 + 16
    assert RangeSet.from_bytes(data) == rs
