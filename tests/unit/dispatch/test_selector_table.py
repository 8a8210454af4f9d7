"""The selectors' slot table (``selectors/table.py``) against applying each move slot by slot."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from keyshared.broker.dispatch.selectors.ranges import RangeMove
from keyshared.broker.dispatch.selectors.table import EMPTY_TABLE, TABLE_SIZE, apply_moves

OWNERS = ["c1", "c2", "c3", None]

_bound = st.one_of(
    st.sampled_from([0, 1, TABLE_SIZE // 2, TABLE_SIZE - 2, TABLE_SIZE - 1, TABLE_SIZE]),
    st.integers(0, TABLE_SIZE + 10),
)


@st.composite
def _moves(draw: st.DrawFn) -> list[RangeMove[str]]:
    out = []
    for _ in range(draw(st.integers(0, 5))):
        a, b = sorted((draw(_bound), draw(_bound)))
        out.append(RangeMove(a, b, draw(st.sampled_from(OWNERS)), draw(st.sampled_from(OWNERS))))
    return out


def _reference(table: list[str | None], moves: list[RangeMove[str]]) -> list[str | None]:
    slots = list(table)
    for m in moves:
        for h in range(m.start, min(m.end, TABLE_SIZE - 1) + 1):
            slots[h] = m.after
    return slots


@settings(max_examples=60, deadline=None)
@given(first=_moves(), second=_moves())
def test_the_table_is_every_move_applied_in_order(
    first: list[RangeMove[str]], second: list[RangeMove[str]]
) -> None:
    # Overlapping moves included (the selectors never make them, but the later must win), from
    # the shared empty table and from a table already built.
    table = apply_moves(EMPTY_TABLE, first, False)
    expected = _reference(list(EMPTY_TABLE), first)
    assert list(table) == expected
    assert EMPTY_TABLE == (None,) * TABLE_SIZE, "the shared empty table is never written"
    assert list(apply_moves(table, second, False)) == _reference(expected, second)


def test_no_consumer_left_is_the_shared_empty_table() -> None:
    table = apply_moves(EMPTY_TABLE, [RangeMove(0, TABLE_SIZE - 1, None, "c1")], False)
    assert table is not EMPTY_TABLE and set(table) == {"c1"}
    assert apply_moves(table, [RangeMove(0, TABLE_SIZE - 1, "c1", None)], True) is EMPTY_TABLE
