"""Stateful tests: random joins and leaves against each selector.

Invariants after every step: each hash maps to exactly one current consumer (or to none, for
STICKY gaps), ``select`` agrees with the published ranges, and the returned ``ImpactedRanges`` are
exactly the hashes whose owner changed. The consistent-hashing ring is also compared with an
independent model (plain-Python Murmur3, first-added-keeps-the-point collisions, lowest free name
index). A failure prints a reproduction blob; the local example database replays it.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from ks_dispatch_helpers import (
    FakeConsumer,
    assert_exact_moves,
    owner_array,
    reference_pulsar_hash,
)

from keyshared.broker.dispatch.selectors import (
    ConsistentHashingStickyKeyConsumerSelector,
    ConsumerAssignError,
    HashRangeAutoSplitStickyKeyConsumerSelector,
    HashRangeExclusiveStickyKeyConsumerSelector,
    ImpactedRanges,
)
from keyshared.broker.dispatch.selectors.ranges import check_assignments

MACHINE_SETTINGS = settings(
    max_examples=20,
    stateful_step_count=20,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)

# Names chosen so the stateful runs see same-named consumers and ring-point collisions
# (test_dispatch_selectors checks that this pool does collide at 100 points).
NAMES = ["n0", "n1", "n2", "n3", "consumer1", "consumer11"]


class SelectorMachine(RuleBasedStateMachine):
    """Shared rules and invariants; subclasses build the selector and say how it covers hashes."""

    covered: tuple[int, int] | None = None  # inclusive hash range every consumer set covers

    def __init__(self) -> None:
        super().__init__()
        self.selector: Any = self.make_selector()
        self.live: list[FakeConsumer] = []
        self.owners: list[FakeConsumer | None] = owner_array([])
        self.assignments: list[tuple[int, int, FakeConsumer]] = []
        self.counter = 0

    def make_selector(self) -> Any:
        raise NotImplementedError

    def _apply(self, impacted: ImpactedRanges[FakeConsumer]) -> None:
        after = list(self.selector.get_assignments())
        assert_exact_moves(self.assignments, after, impacted.moves)
        self.assignments = after
        self.owners = owner_array(after)

    def _new_consumer(self, name: str) -> FakeConsumer:
        self.counter += 1
        return FakeConsumer(name, self.counter)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(self.live))
        self.live.remove(consumer)
        impacted = self.selector.remove_consumer(consumer)
        self._apply(impacted)
        assert all(move.before is consumer for move in impacted)
        self.after_remove(consumer)

    def after_remove(self, consumer: FakeConsumer) -> None:
        pass

    @invariant()
    def every_hash_has_one_current_owner(self) -> None:
        assignments = self.selector.get_assignments()
        check_assignments(assignments)
        live = set(self.live)
        assert {c for _, _, c in assignments} <= live
        if self.covered is not None and self.live:
            lo, hi = self.covered
            assert assignments[0][0] == lo and assignments[-1][1] == hi
            assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(assignments))
        if not self.live:
            assert assignments == []
        assert set(self.selector.consumers()) == live

    def teardown(self) -> None:
        # Once per run, every hash: select() (a table lookup) against the published ranges.
        lo, hi = self.selector.key_hash_range
        select, owners = self.selector.select, self.owners
        wrong = [h for h in range(lo, hi + 1) if select(h) is not owners[h]]
        assert not wrong, wrong[:10]

    @invariant()
    def select_agrees_with_ranges(self) -> None:
        probes = set(range(0, 65536, 257))
        for start, end, _ in self.selector.get_assignments():
            probes.update((start - 1, start, end, end + 1))
        lo, hi = self.selector.key_hash_range
        for h in probes:
            if lo <= h <= hi:
                assert self.selector.select(h) is self.owners[h], h


class ConsistentHashingMachine(SelectorMachine):
    """Consistent hashing, 100 points, a small name pool (same names, collisions)."""

    covered = (1, 65535)

    def __init__(self) -> None:
        super().__init__()
        self.order: list[FakeConsumer] = []  # live consumers in the order they were (re)added
        self.index_of: dict[FakeConsumer, int] = {}
        self.left: list[FakeConsumer] = []

    def make_selector(self) -> Any:
        return ConsistentHashingStickyKeyConsumerSelector[FakeConsumer](100)

    def _model_index(self, name: str) -> int:
        used = {self.index_of[c] for c in self.order if c.consumer_name == name}
        index = 0
        while index in used:
            index += 1
        return index

    def _add(self, consumer: FakeConsumer) -> None:
        self.index_of[consumer] = self._model_index(consumer.consumer_name)
        impacted = self.selector.add_consumer(consumer)
        self.live.append(consumer)
        self.order.append(consumer)
        self._apply(impacted)
        assert all(move.after is consumer for move in impacted)

    @rule(name=st.sampled_from(NAMES))
    def add(self, name: str) -> None:
        self._add(self._new_consumer(name))

    @precondition(lambda self: self.left)
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(self.left))
        self.left.remove(consumer)
        self._add(consumer)

    def after_remove(self, consumer: FakeConsumer) -> None:
        self.order.remove(consumer)
        self.left.append(consumer)

    @invariant()
    def ring_matches_independent_model(self) -> None:
        holder: dict[int, FakeConsumer] = {}
        for consumer in self.order:
            index = self.index_of[consumer]
            assert self.selector.name_index(consumer) == index
            for i in range(100):
                point = _model_point(consumer.consumer_name, index, i)
                holder.setdefault(point, consumer)  # first added keeps a collided point
        if not holder:
            return
        points = sorted(holder)
        expected: list[FakeConsumer | None] = [None] * 65537
        previous = 0
        for p in points:
            expected[previous + 1 : p + 1] = [holder[p]] * (p - previous)
            previous = p
        expected[previous + 1 : 65536] = [holder[points[0]]] * (65535 - previous)
        assert expected == self.owners


_POINT_CACHE: dict[tuple[str, int, int], int] = {}


def _model_point(name: str, index: int, i: int) -> int:
    key = (name, index, i)
    point = _POINT_CACHE.get(key)
    if point is None:
        data = f"{name}\0{index}\0{i}".encode()
        point = _POINT_CACHE[key] = reference_pulsar_hash(data) % 65535 + 1
    return point


class AutoSplitMachine(SelectorMachine):
    """Auto-split: one contiguous range each; joins take from one consumer, leaves give to one."""

    covered = (0, 65536)

    def make_selector(self) -> Any:
        return HashRangeAutoSplitStickyKeyConsumerSelector[FakeConsumer]()

    @rule(name=st.sampled_from(NAMES))
    def add(self, name: str) -> None:
        consumer = self._new_consumer(name)
        impacted = self.selector.add_consumer(consumer)
        self.live.append(consumer)
        self._apply(impacted)
        if len(self.live) > 1:
            assert len(impacted) == 1 and impacted.moves[0].after is consumer
            assert impacted.moves[0].before in self.live

    @invariant()
    def one_range_per_consumer(self) -> None:
        ranges = self.selector.get_consumer_key_hash_ranges()
        assert all(len(r) == 1 for r in ranges.values())


class StickyMachine(SelectorMachine):
    """STICKY: client ranges; overlapping ones are refused, gaps select nobody."""

    def make_selector(self) -> Any:
        return HashRangeExclusiveStickyKeyConsumerSelector[FakeConsumer]()

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[FakeConsumer, list[tuple[int, int]]] = {}

    @rule(
        name=st.sampled_from(NAMES),
        ranges=st.lists(
            st.tuples(st.integers(0, 65535), st.integers(0, 9000)).map(
                lambda t: (t[0], min(t[0] + t[1], 65536))
            ),
            min_size=1,
            max_size=3,
        ),
    )
    def add(self, name: str, ranges: list[tuple[int, int]]) -> None:
        consumer = self._new_consumer(name)
        ordered = sorted(ranges)
        own = any(a[1] >= b[0] for a, b in itertools.pairwise(ordered))
        other = any(
            s <= e2 and s2 <= e for s, e in ranges for rs in self.model.values() for s2, e2 in rs
        )
        if own or other:
            try:
                self.selector.add_consumer(consumer, ranges)
            except ConsumerAssignError:
                return
            raise AssertionError(f"overlapping ranges accepted: {ranges}")
        impacted = self.selector.add_consumer(consumer, ranges)
        self.live.append(consumer)
        self.model[consumer] = ranges
        self._apply(impacted)

    def after_remove(self, consumer: FakeConsumer) -> None:
        del self.model[consumer]

    @invariant()
    def owners_match_model(self) -> None:
        expected: list[FakeConsumer | None] = [None] * 65537
        for consumer, ranges in self.model.items():
            for s, e in ranges:
                expected[s : e + 1] = [consumer] * (e - s + 1)
        assert expected == self.owners


TestConsistentHashingMachine = ConsistentHashingMachine.TestCase
TestConsistentHashingMachine.settings = MACHINE_SETTINGS
TestAutoSplitMachine = AutoSplitMachine.TestCase
TestAutoSplitMachine.settings = MACHINE_SETTINGS
TestStickyMachine = StickyMachine.TestCase
TestStickyMachine.settings = MACHINE_SETTINGS
