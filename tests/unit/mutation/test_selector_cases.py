"""Key_Shared selector cases the property tests do not pin: each kills mutants that survived
``make mutate`` (bench/results/mutation/report.md) in ``broker/dispatch/selectors/``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import pytest

from keyshared.broker.dispatch.selectors import (
    ConsistentHashingStickyKeyConsumerSelector,
    ConsumerAssignError,
    HashRangeAutoSplitStickyKeyConsumerSelector,
    HashRangeExclusiveStickyKeyConsumerSelector,
    ImpactedRanges,
    RangeMove,
    RemovedHashRanges,
    create_selector,
    merge_ranges,
    selector_for,
)
from keyshared.broker.dispatch.selectors.ranges import check_assignments
from keyshared.broker.dispatch.selectors.table import EMPTY_TABLE, TABLE_SIZE, apply_moves
from keyshared.config import BrokerConfig


@dataclass(eq=False)
class Consumer:
    """A consumer with identity semantics, as the selectors want."""

    consumer_name: str

    def __repr__(self) -> str:
        return f"<{self.consumer_name}>"


Consistent = ConsistentHashingStickyKeyConsumerSelector[Consumer]
AutoSplit = HashRangeAutoSplitStickyKeyConsumerSelector[Consumer]
Exclusive = HashRangeExclusiveStickyKeyConsumerSelector[Consumer]


# --- consistent hashing ---------------------------------------------------------------------


def test_consistent_hashing_needs_a_point_per_consumer() -> None:
    with pytest.raises(ValueError, match=r"^replica_points must be at least 1$"):
        Consistent(0)
    one = Consistent(1)
    assert one.replica_points == 1
    c = Consumer("c")
    one.add_consumer(c)
    assert len(one.consumer_points(c)) == 1


def test_adding_a_consumer_twice_names_it() -> None:
    c = Consumer("c")
    for selector in (Consistent(), AutoSplit(), Exclusive()):
        selector.add_consumer(c, [(0, 10)])
        with pytest.raises(ValueError, match=r"^consumer <c> is already in the selector$"):
            selector.add_consumer(c, [(20, 30)])


def test_hashes_outside_the_slot_table_go_round_the_ring() -> None:
    # The ring's slots are 1..65535; 0 and anything past the table take the first point (the
    # ceiling wraps), exactly as a hash just past the last point does.
    selector = Consistent(3)
    assert selector.select(0) is None
    assert selector.select(70000) is None
    a, b = Consumer("a"), Consumer("b")
    selector.add_consumer(a)
    selector.add_consumer(b)
    first = selector.get_assignments()[0][2]
    assert selector.select(0) is first
    assert selector.select(65536) is first
    assert selector.select(70000) is first
    assert selector.select(1) is first


def test_the_collisions_of_the_last_join_are_counted() -> None:
    # A join counts the points it found taken; a join after it starts the count again.
    selector = Consistent()
    first = Consumer("c0")
    selector.add_consumer(first)
    assert selector.last_add_collisions == 0
    taken = set(selector.consumer_points(first))
    seen = []
    for i in range(1, 40):
        c = Consumer(f"c{i}")
        selector.add_consumer(c)
        mine = set(selector.consumer_points(c))
        assert selector.last_add_collisions == len(mine & taken)
        seen.append(selector.last_add_collisions)
        taken |= mine
    assert max(seen) > 0, "40 consumers of 100 points each collide somewhere"


def test_unknown_consumers_have_no_points_and_no_index() -> None:
    selector = Consistent(3)
    known, unknown = Consumer("k"), Consumer("u")
    selector.add_consumer(known)
    assert selector.consumer_points(unknown) == ()
    assert selector.name_index(unknown) == -1
    assert selector.name_index(known) == 0
    assert known in selector and unknown not in selector
    assert len(selector) == 1


def test_consumers_are_listed_in_the_order_they_joined() -> None:
    cs = [Consumer(n) for n in ("z", "a", "m")]
    for selector in (Consistent(3), AutoSplit(), Exclusive()):
        for i, c in enumerate(cs):
            selector.add_consumer(c, [(10 * i, 10 * i + 5)])
        assert selector.consumers() == cs
        assert len(selector) == 3
        selector.remove_consumer(cs[1])
        assert selector.consumers() == [cs[0], cs[2]]
        assert cs[1] not in selector


# --- auto split -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 3, 65535 + 2, 2 * 65536, 48])
def test_autosplit_range_size_must_be_a_power_of_two_within_the_table(size: int) -> None:
    with pytest.raises(ValueError, match=r"^range_size must be a power of 2 within \[2, 65536\]$"):
        AutoSplit(size)


@pytest.mark.parametrize("size", [2, 4, 65536])
def test_autosplit_takes_every_power_of_two_up_to_the_table(size: int) -> None:
    selector = AutoSplit(size)
    assert selector.key_hash_range_size == size
    assert selector.key_hash_range == (0, size - 1)


def test_autosplit_refusal_says_how_many_consumers_hold_ranges() -> None:
    selector = AutoSplit(2)
    selector.add_consumer(Consumer("a"))
    selector.add_consumer(Consumer("b"))
    with pytest.raises(ConsumerAssignError) as err:
        selector.add_consumer(Consumer("c"))
    assert str(err.value) == ("No more range can assigned to new consumer, assigned consumers 2")
    assert err.value.conflicting_consumer is None


def test_autosplit_slot_formula_follows_the_range_size() -> None:
    # pulsar_hash(b"0") = 1383186559: % 65536 = 49279, % 64 = 63, % 2 = 1.
    assert AutoSplit().sticky_key_hash(b"0") == 49279
    assert AutoSplit(64).sticky_key_hash(b"0") == 63
    small = AutoSplit(64)
    a = Consumer("a")
    small.add_consumer(a)
    assert small.select_key(b"0") is a


def test_autosplit_hashes_past_the_table_are_the_top_range_up_to_its_bound() -> None:
    selector = AutoSplit()
    a, b = Consumer("a"), Consumer("b")
    selector.add_consumer(a)
    selector.add_consumer(b)
    # b took [0, 32768]; a keeps [32769, 65536], whose bound is one past the last slot.
    assert selector.select(65536) is a
    assert selector.select(65537) is None
    assert selector.select(0) is b
    assert selector.select(32768) is b and selector.select(32769) is a


def test_autosplit_top_leaver_hands_its_range_down_and_the_bound_moves_with_it() -> None:
    selector = AutoSplit(64)
    a, b, c = Consumer("a"), Consumer("b"), Consumer("c")
    selector.add_consumer(a)  # [0, 64]
    selector.add_consumer(b)  # b [0, 32], a [33, 64]
    selector.remove_consumer(a)
    assert selector.get_assignments() == [(0, 64, b)]
    # b now holds the top bound: a new consumer splits b's whole range.
    selector.add_consumer(c)
    assert selector.get_assignments() == [(0, 32, c), (33, 64, b)]
    selector.remove_consumer(b)
    assert selector.get_assignments() == [(0, 64, c)]
    selector.remove_consumer(c)
    assert selector.get_assignments() == [] and selector.select(5) is None


def test_a_joiner_splits_the_biggest_range_even_after_a_leave_left_them_uneven() -> None:
    # Pulsar's findBiggestRange measures each range as its bound less the bound below and keeps
    # the first biggest; a leave hands the range to the consumer above, so sizes are uneven.
    selector = AutoSplit()
    c = {n: Consumer(n) for n in ("c1", "c2", "c3", "c4", "c5", "c6")}

    def by_name() -> dict[str, list[tuple[int, int]]]:
        ranges = selector.get_consumer_key_hash_ranges().items()
        return {k.consumer_name: v for k, v in ranges}

    for n in ("c1", "c2", "c3", "c4", "c5"):
        selector.add_consumer(c[n])
    selector.remove_consumer(c["c4"])  # its (32768, 49152] goes to c1, the range above
    assert by_name() == {
        "c5": [(0, 8192)],
        "c3": [(8193, 16384)],
        "c2": [(16385, 32768)],
        "c1": [(32769, 65536)],
    }
    # Sizes by bound: 8192, 8192, 16384, 32768: c1's range is the biggest, and c6 takes its
    # lower half.
    selector.add_consumer(c["c6"])
    assert by_name() == {
        "c5": [(0, 8192)],
        "c3": [(8193, 16384)],
        "c2": [(16385, 32768)],
        "c6": [(32769, 49152)],
        "c1": [(49153, 65536)],
    }


# --- sticky (exclusive) ---------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 65537])
def test_sticky_range_size_is_checked(size: int) -> None:
    with pytest.raises(ValueError, match=r"^range_size must be within \[1, 65536\]$"):
        Exclusive(size)


def test_sticky_small_range_size_folds_hashes_onto_its_slots() -> None:
    selector = Exclusive(1)
    assert selector.key_hash_range == (0, 0)
    c = Consumer("c")
    selector.add_consumer(c, [(0, 0)])
    assert selector.select(0) is c
    # Past the table, a hash is taken modulo the range size, as Pulsar's select does.
    assert selector.select(70000) is c


def test_sticky_slot_formula_follows_the_range_size() -> None:
    # pulsar_hash(b"0") = 1383186559: % 65536 = 49279, % 100 = 59.
    selector = Exclusive(100)
    assert selector.sticky_key_hash(b"0") == 59
    c = Consumer("c")
    selector.add_consumer(c, [(59, 59)])
    assert selector.select_key(b"0") is c
    assert Exclusive().sticky_key_hash(b"0") == 49279


def test_sticky_hashes_past_the_table_are_taken_modulo_the_range_size() -> None:
    selector = Exclusive()
    a, b = Consumer("a"), Consumer("b")
    selector.add_consumer(a, [(0, 9)])
    selector.add_consumer(b, [(100, 200)])
    assert selector.select(65536) is a  # slot 0
    assert selector.select(65536 + 150) is b
    assert selector.select(65536 + 50) is None
    assert selector.select(65536 + 201) is None
    # The ends of a range are in it.
    assert selector.select(65536 + 9) is a and selector.select(65536 + 10) is None
    assert selector.select(65536 + 100) is b and selector.select(65536 + 200) is b


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        (None, "Must specify key shared meta for consumer."),
        ([], "Ranges for KeyShared policy must not be empty."),
        ([(5, 4)], "Fixed hash range start > end for range: [5,4]"),
        ([(-1, 3)], "Fixed hash range [-1,3] is outside [0,65536]"),
        ([(0, 65537)], "Fixed hash range [0,65537] is outside [0,65536]"),
        ([(0, 10), (10, 20)], "Consumer's own ranges conflict: [0,10] overlaps with [10,20]"),
    ],
)
def test_sticky_refusals_say_exactly_what_is_wrong(
    ranges: list[tuple[int, int]] | None, message: str
) -> None:
    selector = Exclusive()
    with pytest.raises(ConsumerAssignError) as err:
        selector.add_consumer(Consumer("c"), ranges)
    assert str(err.value) == message
    assert err.value.conflicting_consumer is None


def test_sticky_accepts_the_whole_range_up_to_65536() -> None:
    selector = Exclusive()
    c = Consumer("c")
    selector.add_consumer(c, [(0, 65536)])
    assert selector.select(0) is c and selector.select(65535) is c
    assert selector.uncovered_ranges() == []


def test_sticky_conflict_names_the_consumer_holding_the_hashes() -> None:
    selector = Exclusive()
    a, b = Consumer("a"), Consumer("b")
    selector.add_consumer(a, [(10, 20)])
    selector.add_consumer(b, [(30, 40)])
    for ranges, holder in (
        ([(20, 25)], a),
        ([(0, 10)], a),
        ([(21, 30)], b),
        ([(25, 29), (40, 50)], b),
        ([(0, 5), (15, 15)], a),
    ):
        with pytest.raises(ConsumerAssignError) as err:
            selector.add_consumer(Consumer("new"), ranges)
        assert str(err.value) == f"Range conflict with consumer {holder.consumer_name}"
        assert err.value.conflicting_consumer is holder
        assert selector.find_conflicting_consumer(ranges) is holder
    assert selector.find_conflicting_consumer([(0, 9), (21, 29), (41, 65536)]) is None


def test_sticky_uncovered_ranges_are_the_gaps() -> None:
    selector = Exclusive()
    assert selector.uncovered_ranges() == [(0, 65535)]
    a, b = Consumer("a"), Consumer("b")
    selector.add_consumer(a, [(0, 0), (5, 9)])
    selector.add_consumer(b, [(10, 10), (65535, 65536)])
    assert selector.uncovered_ranges() == [(1, 4), (11, 65534)]
    selector.remove_consumer(a)
    assert selector.uncovered_ranges() == [(0, 9), (11, 65534)]
    assert selector.get_consumer_key_hash_ranges() == {b: [(10, 10), (65535, 65536)]}
    # One-slot gaps, the last slot's included.
    c = Consumer("c")
    selector.add_consumer(c, [(0, 8), (12, 65533)])
    assert selector.uncovered_ranges() == [(9, 9), (11, 11), (65534, 65534)]


def test_sticky_last_slot_alone_is_a_gap() -> None:
    selector = Exclusive()
    selector.add_consumer(Consumer("c"), [(0, 65534)])
    assert selector.uncovered_ranges() == [(65535, 65535)]


def test_sticky_adjacent_ranges_of_a_consumer_are_merged_in_its_stats() -> None:
    selector = Exclusive()
    c, d = Consumer("c"), Consumer("d")
    selector.add_consumer(c, [(0, 4), (6, 7), (9, 10), (11, 12), (13, 13)])
    selector.add_consumer(d, [(5, 5), (8, 8)])
    assert selector.get_consumer_key_hash_ranges() == {
        c: [(0, 4), (6, 7), (9, 13)],
        d: [(5, 5), (8, 8)],
    }


def test_sticky_remove_leaves_the_other_consumers_ranges() -> None:
    selector = Exclusive()
    a, b = Consumer("a"), Consumer("b")
    selector.add_consumer(a, [(0, 4), (20, 24)])
    selector.add_consumer(b, [(10, 14), (30, 34)])
    impacted = selector.remove_consumer(a)
    assert list(impacted) == [RangeMove(0, 4, a, None), RangeMove(20, 24, a, None)]
    assert selector.get_assignments() == [(10, 14, b), (30, 34, b)]
    assert [selector.select(h) for h in (0, 12, 22, 32)] == [None, b, None, b]
    assert selector.select(65536 + 12) is b and selector.select(65536 + 22) is None


# --- shared pieces --------------------------------------------------------------------------


def test_create_selector_reads_the_mode_in_any_case_and_names_a_bad_one() -> None:
    assert isinstance(create_selector("sticky"), HashRangeExclusiveStickyKeyConsumerSelector)
    auto: object = create_selector("auto_split", replica_points=7)
    assert isinstance(auto, ConsistentHashingStickyKeyConsumerSelector)
    assert auto.replica_points == 7
    with pytest.raises(ValueError, match=r"^unknown key_shared_mode 'NOPE'$"):
        create_selector("NOPE")
    # Without a mode: AUTO_SPLIT, consistent hashing with Pulsar's 100 points.
    default: object = create_selector()
    assert isinstance(default, ConsistentHashingStickyKeyConsumerSelector)
    assert default.replica_points == 100


def test_the_broker_settings_choose_the_selector_and_its_points() -> None:
    config = BrokerConfig(subscriptionKeySharedConsistentHashingReplicaPoints=7)
    ring: object = selector_for("AUTO_SPLIT", config)
    assert isinstance(ring, ConsistentHashingStickyKeyConsumerSelector)
    assert ring.replica_points == 7
    config = BrokerConfig(subscriptionKeySharedUseConsistentHashing=False)
    split: object = selector_for("AUTO_SPLIT", config)
    assert isinstance(split, HashRangeAutoSplitStickyKeyConsumerSelector)
    sticky: object = selector_for("STICKY", config)
    assert isinstance(sticky, HashRangeExclusiveStickyKeyConsumerSelector)


def test_removed_hash_ranges_describe_themselves() -> None:
    removed = RemovedHashRanges([(5, 5), (1, 2)])
    assert repr(removed) == "RemovedHashRanges([(1, 2), (5, 5)])"
    assert len(removed) == 2
    assert 0 not in removed and 3 not in removed and 5 in removed and 6 not in removed
    assert removed.hash_count() == 3
    assert RemovedHashRanges([]).as_ranges() == [] and 0 not in RemovedHashRanges([])
    assert removed.is_fully_contained_in_ranges([(1, 2), (3, 5)])
    assert not removed.is_fully_contained_in_ranges([(2, 5)])
    assert not removed.is_fully_contained_in_ranges([(1, 4)])


def test_impacted_ranges_describe_themselves() -> None:
    a, b = Consumer("a"), Consumer("b")
    impacted = ImpactedRanges.from_moves(
        [RangeMove(10, 19, a, b), RangeMove(0, 4, None, a), RangeMove(5, 9, a, a)]
    )
    assert repr(impacted) == (
        "ImpactedRanges([RangeMove(start=0, end=4, before=None, after=<a>), "
        "RangeMove(start=10, end=19, before=<a>, after=<b>)])"
    )
    assert len(impacted) == 2 and bool(impacted) and not ImpactedRanges()
    assert impacted.hash_count() == 15
    assert list(impacted) == list(impacted.moves)
    assert impacted.added_ranges_by_consumer() == {a: [(0, 4)], b: [(10, 19)]}
    assert impacted.removed_ranges(b) is None
    removed = impacted.removed_ranges(a)
    assert removed is not None and removed.as_ranges() == [(10, 19)]
    assert impacted.owner_change(4) == (None, a) and impacted.owner_change(5) is None
    assert impacted.owner_change(19) == (a, b) and impacted.owner_change(20) is None


def test_impacted_ranges_join_only_adjacent_moves_between_the_same_consumers() -> None:
    a, b, c = Consumer("a"), Consumer("b"), Consumer("c")
    joined = ImpactedRanges.from_moves([RangeMove(5, 9, a, b), RangeMove(0, 4, a, b)])
    assert list(joined) == [RangeMove(0, 9, a, b)]
    apart = ImpactedRanges.from_moves([RangeMove(0, 4, a, b), RangeMove(6, 9, a, b)])
    assert len(apart) == 2
    for other in (RangeMove(5, 9, c, b), RangeMove(5, 9, a, c)):
        assert len(ImpactedRanges.from_moves([RangeMove(0, 4, a, b), other])) == 2
    added = ImpactedRanges.from_moves([RangeMove(0, 4, a, b), RangeMove(5, 9, c, b)])
    assert added.added_ranges_by_consumer() == {b: [(0, 9)]}


_A, _B = Consumer("a"), Consumer("b")
_NOBODY = cast(Consumer, None)


@pytest.mark.parametrize(
    ("assignments", "message"),
    [
        ([(0, 5, _NOBODY)], "invalid assignment (0, 5, None)"),
        ([(5, 4, _A)], "invalid assignment (5, 4, <a>)"),
        ([(0, 5, _A), (5, 6, _B)], "assignments must be sorted and non-overlapping"),
        ([(6, 8, _A), (0, 5, _B)], "assignments must be sorted and non-overlapping"),
    ],
)
def test_check_assignments_names_what_is_wrong(
    assignments: list[tuple[int, int, Consumer]], message: str
) -> None:
    with pytest.raises(ValueError) as err:
        check_assignments(assignments)
    assert str(err.value) == message


def test_check_assignments_accepts_sorted_disjoint_ranges() -> None:
    check_assignments([(0, 0, _A), (1, 5, _B), (7, 7, _A)])


# --- the slot table -------------------------------------------------------------------------


_OWNERS = {name: Consumer(name) for name in "abc"}


def _move(start: int, end: int, before: str | None, after: str | None) -> RangeMove[Consumer]:
    """A move between the consumers of ``_OWNERS`` named ``before`` and ``after``."""
    owner = _OWNERS.get
    return RangeMove(start, end, owner(before) if before else None, owner(after) if after else None)


def _runs(table: Sequence[Consumer | None]) -> list[tuple[int, int, str | None]]:
    """The table as maximal runs of one owner, by name."""
    runs: list[tuple[int, int, str | None]] = []
    for slot, consumer in enumerate(table):
        owner = consumer.consumer_name if consumer is not None else None
        if runs and runs[-1][2] == owner and runs[-1][1] == slot - 1:
            runs[-1] = (runs[-1][0], slot, owner)
        else:
            runs.append((slot, slot, owner))
    return runs


END = TABLE_SIZE - 1


@pytest.mark.parametrize(
    ("moves", "runs"),
    [
        ([(0, 5, "a")], [(0, 5, "a"), (6, END, None)]),
        ([(1, END, "a")], [(0, 0, None), (1, END, "a")]),
        ([(0, END - 1, "a")], [(0, END - 1, "a"), (END, END, None)]),
        ([(0, END, "a"), (5, 5, "b")], [(0, 4, "a"), (5, 5, "b"), (6, END, "a")]),
        ([(5, 9, "a"), (5, 9, None)], [(0, END, None)]),
        (
            [(20, END + 1, "c"), (0, 4, "a"), (5, 9, "b")],
            [(0, 4, "a"), (5, 9, "b"), (10, 19, None), (20, END, "c")],
        ),
    ],
)
def test_a_table_built_from_nothing_holds_exactly_the_moves(
    moves: list[tuple[int, int, str | None]], runs: list[tuple[int, int, str | None]]
) -> None:
    table = apply_moves(EMPTY_TABLE, [_move(s, e, None, a) for s, e, a in moves], False)
    assert len(table) == TABLE_SIZE
    assert _runs(table) == runs


@pytest.mark.parametrize(
    ("move", "runs"),
    [
        ((1, END, "b"), [(0, 0, "a"), (1, END, "b")]),
        ((0, END - 1, "b"), [(0, END - 1, "b"), (END, END, "a")]),
        ((0, END + 1, "b"), [(0, END, "b")]),
        ((3, 3, "b"), [(0, 2, "a"), (3, 3, "b"), (4, END, "a")]),
    ],
)
def test_a_move_on_a_built_table_changes_only_its_slots(
    move: tuple[int, int, str], runs: list[tuple[int, int, str | None]]
) -> None:
    table = apply_moves(EMPTY_TABLE, [_move(0, END, None, "a")], False)
    s, e, after = move
    table = apply_moves(table, [_move(s, e, "a", after)], False)
    assert len(table) == TABLE_SIZE
    assert _runs(table) == runs


def test_a_move_over_every_slot_makes_a_new_table_and_leaves_the_old_one() -> None:
    old = apply_moves(EMPTY_TABLE, [_move(0, 9, None, "a")], False)
    kept = list(old)
    new = apply_moves(old, [_move(0, END, "a", "b")], False)
    assert new is not old and list(old) == kept
    assert _runs(new) == [(0, END, "b")]
    # A smaller move changes the list in place.
    assert apply_moves(new, [_move(3, 3, "b", "c")], False) is new


def test_a_point_on_the_last_slot_ends_the_ring_without_a_wrapped_tail() -> None:
    # With 10 points: "edge6681" has a point on 65535, "edge3658" one on 1 (the first point).
    selector = Consistent(10)
    last, first = Consumer("edge6681"), Consumer("edge3658")
    selector.add_consumer(last)
    selector.add_consumer(first)
    assignments = selector.get_assignments()
    assert assignments[0][:2] == (1, 1) and assignments[0][2] is first
    assert assignments[-1][1:] == (65535, last)
    assert all(s <= e <= 65535 for s, e, _ in assignments)


def test_merge_ranges_keeps_a_one_slot_gap() -> None:
    assert merge_ranges([(6, 9), (0, 4)]) == [(0, 4), (6, 9)]
    assert merge_ranges([(0, 4), (5, 9), (2, 3)]) == [(0, 9)]


def test_sticky_conflict_past_the_first_range_names_the_next_consumer() -> None:
    selector = Exclusive()
    a, b, c = Consumer("a"), Consumer("b"), Consumer("c")
    selector.add_consumer(a, [(10, 20)])
    selector.add_consumer(b, [(30, 40)])
    selector.add_consumer(c, [(50, 60)])
    assert selector.find_conflicting_consumer([(21, 30)]) is b
    assert selector.find_conflicting_consumer([(41, 55)]) is c
