"""Selector behaviour: Pulsar's vectors and the research §8 rows 26-31 properties."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ks_dispatch_helpers import FakeConsumer, assert_exact_moves, change_runs, owner_array

from keyshared.broker.dispatch.selectors import (
    ConsistentHashingStickyKeyConsumerSelector,
    ConsumerAssignError,
    HashRangeAutoSplitStickyKeyConsumerSelector,
    HashRangeExclusiveStickyKeyConsumerSelector,
    ImpactedRanges,
    RangeMove,
    RemovedHashRanges,
    create_selector,
    diff_assignments,
    hash_range_slot,
    merge_ranges,
)
from keyshared.broker.dispatch.selectors.consistent import ring_point_hash

Consistent = ConsistentHashingStickyKeyConsumerSelector[FakeConsumer]
AutoSplit = HashRangeAutoSplitStickyKeyConsumerSelector[FakeConsumer]
Exclusive = HashRangeExclusiveStickyKeyConsumerSelector[FakeConsumer]

SETTINGS = settings(max_examples=25, deadline=None, print_blob=True)


def consumers(*names: str) -> list[FakeConsumer]:
    return [FakeConsumer(name, i) for i, name in enumerate(names)]


# --- consistent hashing ---------------------------------------------------------------------


def test_row26_exact_ranges_with_three_points() -> None:
    selector = Consistent(3)
    c1, c2, c3 = consumers("consumer1", "consumer2", "consumer3")
    for c in (c1, c2, c3):
        selector.add_consumer(c)
    ranges = selector.get_consumer_key_hash_ranges()
    assert ranges == {
        c1: [(14359, 18366), (29991, 39817), (52980, 60442)],
        c2: [(1, 6668), (39818, 52979), (60443, 63679), (65184, 65535)],
        c3: [(6669, 14358), (18367, 29990), (63680, 65183)],
    }
    assert selector.get_consumer_key_hash_ranges() == ranges  # stable on repeat
    flat = sorted(r for rs in ranges.values() for r in rs)
    assert flat[0][0] == 1 and flat[-1][1] == 65535
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(flat))
    assert selector._points == [6668, 14358, 18366, 29990, 39817, 52979, 60442, 63679, 65183]


def test_ring_point_key_uses_nul_separators() -> None:
    from keyshared.broker.dispatch.selectors.hashing import consistent_hashing_slot

    assert ring_point_hash("consumer1", 0, 7) == consistent_hashing_slot(b"consumer1\x000\x007")


def test_row27_same_named_consumers_evenly_mapped() -> None:
    selector = Consistent(200)
    cs = [FakeConsumer("consumer", i) for i in range(20)]
    for c in cs:
        selector.add_consumer(c)
    counts = Counter(selector.select_key(f"key {i}".encode()) for i in range(10000))
    assert set(counts) == set(cs)
    for c in cs:
        assert abs(counts[c] - 500) <= 100, (c, counts[c])
    for c in cs:
        selector.remove_consumer(c)
    assert selector.get_consumer_key_hash_ranges() == {}


def test_row27_consumer_select_two_to_four() -> None:
    selector = Consistent(200)
    assert selector.select_key(b"anyKey") is None
    c1, c2, c3, c4 = consumers("c1", "c2", "c3", "c4")
    selector.add_consumer(c1)
    assert selector.select_key(b"anyKey") is c1
    rng_keys = [str(uuid.UUID(int=i * 7919 + 12345)).encode() for i in range(1000)]

    def check(expected: list[FakeConsumer]) -> None:
        counts = Counter(selector.select_key(k) for k in rng_keys)
        share = 1000 / len(expected)
        for c in expected:
            assert abs(counts[c] - share) <= share * 0.2, (c, counts)

    for c in (c2, c3, c4):
        selector.add_consumer(c)
        check([x for x in (c1, c2, c3, c4) if x in selector])
    selector.remove_consumer(c1)
    check([c2, c3, c4])
    selector.remove_consumer(c2)
    check([c3, c4])
    selector.remove_consumer(c3)
    assert all(selector.select_key(k) is c4 for k in rng_keys)


@SETTINGS
@given(
    st.lists(st.text("abcxyz0123456789", min_size=1, max_size=6), min_size=2, max_size=12),
)
def test_even_spread_property(names: list[str]) -> None:
    selector = Consistent(100)
    cs = [FakeConsumer(n, i) for i, n in enumerate(names)]
    for c in cs:
        selector.add_consumer(c)
    owners = owner_array(selector.get_assignments())
    share = Counter(owners[1:65536])
    average = 65535 / len(cs)
    for c in cs:
        # 100 points per consumer: a share is a sum of ~100 arcs (relative sd ~ 0.1);
        # 0.5x..1.6x the average is > 4 sd away on either side.
        assert 0.5 * average <= share[c] <= 1.6 * average, (c, share[c], average)


def test_row30_names_ending_with_numbers_do_not_collide() -> None:
    selector = Consistent(12)
    c1, c11 = consumers("consumer1", "consumer11")
    selector.add_consumer(c1)
    selector.add_consumer(c11)
    assert not set(selector.consumer_points(c1)) & set(selector.consumer_points(c11))
    ranges = selector.get_consumer_key_hash_ranges()
    assert not set(ranges[c1]) & set(ranges[c11])


def test_same_named_consumers_get_distinct_indexes_and_rejoin_stably() -> None:
    selector = Consistent(100)
    a, b, c = (FakeConsumer("same", i) for i in range(3))
    for x in (a, b, c):
        selector.add_consumer(x)
    assert [selector.name_index(x) for x in (a, b, c)] == [0, 1, 2]
    assert not set(selector.consumer_points(a)) & set(selector.consumer_points(b))
    points_b = selector.consumer_points(b)
    selector.remove_consumer(b)
    d = FakeConsumer("same", 3)
    selector.add_consumer(d)
    # The lowest free index is reused: the newcomer takes over b's points.
    assert selector.name_index(d) == 1
    assert selector.consumer_points(d) == points_b


def _pool_with_collisions() -> tuple[list[str], int]:
    names = [f"n{i}" for i in range(8)]
    seen: dict[int, str] = {}
    collisions = 0
    for name in names:
        for p in {ring_point_hash(name, 0, i) for i in range(100)}:
            if p in seen and seen[p] != name:
                collisions += 1
            seen[p] = name
    return names, collisions


def test_collisions_first_added_keeps_point_and_next_is_promoted() -> None:
    names, collisions = _pool_with_collisions()
    assert collisions > 0
    selector = Consistent(100)
    cs = [FakeConsumer(n, i) for i, n in enumerate(names)]
    for c in cs:
        selector.add_consumer(c)
    shared = [
        (p, holders)
        for p, holders in selector._entries.items()
        if len({id(h) for h in holders}) > 1
    ]
    assert shared
    point, holders = shared[0]
    first, second = holders[0], next(h for h in holders if h is not holders[0])
    assert selector.select(point) is first
    impacted = selector.remove_consumer(first)
    assert selector.select(point) is second
    assert impacted.owner_change(point) == (first, second)


def test_triple_collision_promotes_in_arrival_order() -> None:
    # t0, t315 and t377 (name index 0, 100 points) all put a point on slot 44051.
    selector = Consistent(100)
    t0, t315, t377 = consumers("t0", "t315", "t377")
    for c in (t0, t315, t377):
        selector.add_consumer(c)
    assert [c.consumer_name for c in selector._entries[44051]] == ["t0", "t315", "t377"]
    assert selector.select(44051) is t0
    before = selector.get_assignments()
    impacted = selector.remove_consumer(t0)
    assert_exact_moves(before, selector.get_assignments(), impacted.moves)
    assert selector.select(44051) is t315
    impacted = selector.add_consumer(t0)  # a returning consumer queues behind
    assert selector.select(44051) is t315
    assert impacted.owner_change(44051) is None
    selector.remove_consumer(t315)
    assert selector.select(44051) is t377


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_ring_edges_first_and_last_slots(order: tuple[int, ...]) -> None:
    # With 10 points: edge6681 has a point on 65535, edge2590 on 65534, edge3658 on 1.
    selector = Consistent(10)
    cs = consumers("edge6681", "edge2590", "edge3658")
    for i in order:
        before = selector.get_assignments()
        impacted = selector.add_consumer(cs[i])
        assert_exact_moves(before, selector.get_assignments(), impacted.moves)
    assert 65535 in selector.consumer_points(cs[0])
    assert 65534 in selector.consumer_points(cs[1])
    assert 1 in selector.consumer_points(cs[2])
    assert selector.select(65535) is cs[0] and selector.select(1) is cs[2]
    for i in order:
        before = selector.get_assignments()
        impacted = selector.remove_consumer(cs[i])
        assert_exact_moves(before, selector.get_assignments(), impacted.moves)
    assert selector.get_assignments() == []


@SETTINGS
@given(st.integers(2, 40), st.data())
def test_row28_adding_or_removing_moves_only_that_consumer(n: int, data: st.DataObject) -> None:
    selector = Consistent(100)
    cs = [FakeConsumer("consumer", i) for i in range(n)]
    for c in cs:
        selector.add_consumer(c)
    before = owner_array(selector.get_assignments())
    newcomer = FakeConsumer(data.draw(st.sampled_from(["consumer", "other"])), 999)
    impacted = selector.add_consumer(newcomer)
    after = owner_array(selector.get_assignments())
    assert all(a is b or a is newcomer for b, a in zip(before, after, strict=True))
    assert list(impacted.moves) == change_runs(before, after)
    assert set(impacted.removed_ranges_by_consumer()) <= set(cs)

    leaver = data.draw(st.sampled_from(cs))
    before = after
    impacted = selector.remove_consumer(leaver)
    after = owner_array(selector.get_assignments())
    assert all(a is b or b is leaver for b, a in zip(before, after, strict=True))
    assert list(impacted.moves) == change_runs(before, after)
    assert set(impacted.removed_ranges_by_consumer()) == {leaver}


@SETTINGS
@given(st.integers(1, 30))
def test_row28_full_reconnect_reproduces_mapping(n: int) -> None:
    selector = Consistent(100)
    cs = [FakeConsumer("consumer", i) for i in range(n)]
    for c in cs:
        selector.add_consumer(c)
    names_before = [
        (s, e, c.consumer_name, selector.name_index(c)) for s, e, c in selector.get_assignments()
    ]
    for c in cs:
        selector.remove_consumer(c)
    assert selector.get_assignments() == []
    again = [FakeConsumer("consumer", 100 + i) for i in range(n)]
    for c in again:
        selector.add_consumer(c)
    names_after = [
        (s, e, c.consumer_name, selector.name_index(c)) for s, e, c in selector.get_assignments()
    ]
    assert names_after == names_before


@SETTINGS
@given(st.integers(2, 60), st.data())
def test_row29_leave_and_rejoin_changes_little(n: int, data: st.DataObject) -> None:
    selector = Consistent(100)
    cs = [FakeConsumer(f"consumer-{i}", i) for i in range(n)]
    for c in cs:
        selector.add_consumer(c)
    original = owner_array(selector.get_assignments())
    leaver = data.draw(st.sampled_from(cs))
    removed = selector.remove_consumer(leaver)
    assert set(removed.removed_ranges_by_consumer()) == {leaver}
    added = selector.add_consumer(leaver)
    # testShouldNotSwapExistingConsumers: a join only takes hashes, to the joiner.
    assert all(move.after is leaver for move in added)
    final = owner_array(selector.get_assignments())
    changed = sum(1 for a, b in zip(original, final, strict=True) if a is not b)
    # Only points shared by collision can change hands (the rejoiner queues behind).
    assert changed < 0.01 * 65535


# --- auto split ------------------------------------------------------------------------------


def test_row31_autosplit_ranges_for_size_64() -> None:
    selector = AutoSplit(64)
    c1, c2, c3, c4 = consumers("c1", "c2", "c3", "c4")
    for c in (c1, c2, c3, c4):
        selector.add_consumer(c)
    assert selector.get_consumer_key_hash_ranges() == {
        c3: [(0, 16)],
        c2: [(17, 32)],
        c4: [(33, 48)],
        c1: [(49, 64)],
    }


def test_autosplit_default_first_consumer_owns_everything_up_to_65536() -> None:
    selector = AutoSplit()
    (c1,) = consumers("c1")
    impacted = selector.add_consumer(c1)
    assert list(impacted) == [RangeMove(0, 65536, None, c1)]
    assert selector.select(1) is c1 and selector.select(65535) is c1


def test_autosplit_pip34_timeline() -> None:
    # PIP-34 picture: joins split, a leaver's range goes to the adjacent consumer.
    selector = AutoSplit(64)
    c1, c2, c3 = consumers("c1", "c2", "c3")
    selector.add_consumer(c1)
    impacted = selector.add_consumer(c2)
    assert selector.get_consumer_key_hash_ranges() == {c2: [(0, 32)], c1: [(33, 64)]}
    assert impacted.removed_ranges(c1) is not None
    selector.add_consumer(c3)
    assert selector.get_consumer_key_hash_ranges() == {
        c3: [(0, 16)],
        c2: [(17, 32)],
        c1: [(33, 64)],
    }
    impacted = selector.remove_consumer(c3)  # bottom range goes up to c2
    assert list(impacted) == [RangeMove(0, 16, c3, c2)]
    impacted = selector.remove_consumer(c1)  # top range: the consumer below moves up
    assert list(impacted) == [RangeMove(33, 64, c1, c2)]
    assert selector.get_consumer_key_hash_ranges() == {c2: [(0, 64)]}


def test_autosplit_refuses_when_no_range_can_be_split() -> None:
    selector = AutoSplit(4)
    cs = consumers("a", "b", "c", "d", "e")
    for c in cs[:4]:
        selector.add_consumer(c)
    with pytest.raises(ConsumerAssignError, match="No more range can assigned to new consumer"):
        selector.add_consumer(cs[4])
    assert cs[4] not in selector


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=40))
def test_autosplit_covers_everything_and_moves_exactly(ops: list[tuple[bool, int]]) -> None:
    selector = AutoSplit(1024)
    live: list[FakeConsumer] = []
    for i, (add, pick) in enumerate(ops):
        before_list = list(selector.get_assignments())
        if add or not live:
            c = FakeConsumer("c", i)
            impacted = selector.add_consumer(c)
            live.append(c)
        else:
            c = live.pop(pick % len(live))
            impacted = selector.remove_consumer(c)
        assert_exact_moves(before_list, selector.get_assignments(), impacted.moves)
        after = owner_array(selector.get_assignments())
        if live:
            assert all(after[h] is not None for h in range(1025))
            assert all(selector.select(h) is after[h] for h in range(0, 1025, 7))


# --- sticky (exclusive) ----------------------------------------------------------------------


def test_row14_hash_range_conflicts() -> None:
    selector = Exclusive()
    c1, c2, c3 = consumers("c1", "c2", "c3")
    selector.add_consumer(c1, [(0, 99), (400, 65535)])
    selector.add_consumer(c2, [(100, 399)])
    for ranges in ([(0, 65535)], [(1, 1)], [(50, 100)], [(399, 500)]):
        with pytest.raises(ConsumerAssignError, match="Range conflict with consumer") as err:
            selector.add_consumer(c3, ranges)
        assert err.value.conflicting_consumer in (c1, c2)
    selector.remove_consumer(c1)
    selector.add_consumer(c3, [(400, 600)])
    c4 = FakeConsumer("c4")
    selector.add_consumer(c4, [(50, 99)])
    assert selector.select(450) is c3 and selector.select(60) is c4
    assert selector.select(10) is None and selector.select(700) is None


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        (None, "Must specify key shared meta"),
        ([], "must not be empty"),
        ([(5, 4)], r"start > end for range: \[5,4\]"),
        ([(0, 10), (10, 20)], r"own ranges conflict: \[0,10\] overlaps with \[10,20\]"),
        ([(30, 40), (0, 35)], r"own ranges conflict: \[0,35\] overlaps with \[30,40\]"),
        ([(-1, 3)], "outside"),
        ([(0, 65537)], "outside"),
    ],
)
def test_sticky_invalid_ranges_are_refused(
    ranges: list[tuple[int, int]] | None, message: str
) -> None:
    selector = Exclusive()
    with pytest.raises(ConsumerAssignError, match=message):
        selector.add_consumer(FakeConsumer("c"), ranges)
    assert len(selector) == 0


def test_row3_sticky_ranges_route_keys_by_slot() -> None:
    selector = Exclusive()
    c1, c2, c3 = consumers("c1", "c2", "c3")
    selector.add_consumer(c1, [(0, 20000)])
    selector.add_consumer(c2, [(20001, 40000)])
    selector.add_consumer(c3, [(40001, 65535)])
    for i in range(10):
        key = str(i).encode()
        slot = hash_range_slot(key)
        expected = c1 if slot <= 20000 else c2 if slot <= 40000 else c3
        assert selector.select_key(key) is expected


range_lists = st.lists(
    st.tuples(st.integers(0, 2000), st.integers(0, 300)).map(lambda t: (t[0], t[0] + t[1])),
    min_size=1,
    max_size=3,
)


@SETTINGS
@given(st.lists(st.tuples(st.booleans(), range_lists, st.integers(0, 10)), max_size=30))
def test_sticky_overlap_refusal_and_uncovered_hashes(
    ops: list[tuple[bool, list[tuple[int, int]], int]],
) -> None:
    selector = Exclusive()
    model: dict[FakeConsumer, list[tuple[int, int]]] = {}
    for i, (add, ranges, pick) in enumerate(ops):
        before_list = selector.get_assignments()
        if add or not model:
            c = FakeConsumer("s", i)
            own_overlap = any(
                a[1] >= b[0] for a, b in zip(sorted(ranges), sorted(ranges)[1:], strict=False)
            )
            other_overlap = any(
                s <= e2 and s2 <= e for s, e in ranges for rs in model.values() for s2, e2 in rs
            )
            if own_overlap or other_overlap:
                with pytest.raises(ConsumerAssignError):
                    selector.add_consumer(c, ranges)
                assert selector.get_assignments() == before_list
                continue
            impacted = selector.add_consumer(c, ranges)
            model[c] = ranges
        else:
            c = list(model)[pick % len(model)]
            impacted = selector.remove_consumer(c)
            del model[c]
        after_list = selector.get_assignments()
        assert_exact_moves(before_list, after_list, impacted.moves)
        after = owner_array(after_list)
        for h in range(0, 2400, 3):
            expected = next((c for c, rs in model.items() if any(s <= h <= e for s, e in rs)), None)
            assert selector.select(h) is expected
            assert after[h] is expected
        # Covered ranges and uncovered gaps partition the hash space [0, 65535].
        pieces = sorted(
            [(s, min(e, 65535)) for s, e, _ in after_list if s <= 65535]
            + selector.uncovered_ranges()
        )
        assert pieces[0][0] == 0 and pieces[-1][1] == 65535
        assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(pieces))
        for s, e in selector.uncovered_ranges():
            assert after[s] is None and after[e] is None


# --- shared pieces ---------------------------------------------------------------------------


def test_create_selector_picks_pulsar_selector() -> None:
    assert isinstance(create_selector("AUTO_SPLIT"), ConsistentHashingStickyKeyConsumerSelector)
    assert isinstance(
        create_selector("AUTO_SPLIT", use_consistent_hashing=False),
        HashRangeAutoSplitStickyKeyConsumerSelector,
    )
    assert isinstance(create_selector("STICKY"), HashRangeExclusiveStickyKeyConsumerSelector)
    with pytest.raises(ValueError):
        create_selector("NOPE")


def test_adding_twice_is_a_programming_error() -> None:
    for selector in (Consistent(), AutoSplit(), Exclusive()):
        c = FakeConsumer("c")
        selector.add_consumer(c, [(0, 10)])
        with pytest.raises(ValueError):
            selector.add_consumer(c, [(20, 30)])
        assert not selector.remove_consumer(FakeConsumer("unknown"))


def test_removed_hash_ranges() -> None:
    removed = RemovedHashRanges([(10, 20), (21, 30), (50, 60)])
    assert removed.as_ranges() == [(10, 30), (50, 60)]
    assert removed.contains_sticky_key(10) and 30 in removed and 55 in removed
    assert 9 not in removed and 31 not in removed and 61 not in removed
    assert removed.is_fully_contained_in_ranges([(0, 40), (45, 70)])
    assert not removed.is_fully_contained_in_ranges([(0, 25), (45, 70)])
    assert removed.hash_count() == 32
    assert merge_ranges([(5, 9), (1, 3), (4, 4), (20, 22)]) == [(1, 9), (20, 22)]


@SETTINGS
@given(st.data())
def test_diff_assignments_is_exact_with_gaps(data: st.DataObject) -> None:
    pool = consumers("a", "b", "c")

    def assignments() -> list[tuple[int, int, FakeConsumer]]:
        cuts = sorted(data.draw(st.sets(st.integers(0, 300), max_size=12)))
        out = []
        for lo, hi in itertools.pairwise(cuts):
            owner = data.draw(st.sampled_from([None, *pool]))
            if owner is not None:
                out.append((lo, hi - 1, owner))
        return out

    before, after = assignments(), assignments()
    impacted = diff_assignments(before, after)
    assert list(impacted.moves) == change_runs(owner_array(before), owner_array(after))
    assert ImpactedRanges.from_moves(reversed(impacted.moves)).moves == impacted.moves
