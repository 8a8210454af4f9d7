"""Stateful test: selector + draining tracker + pending acks, driven like the PIP-379 dispatcher.

Random joins, leaves, dispatches, replays, acks and mark-delete jumps. A plain model keeps each
consumer's pending entries. After every step:

* no hash is pending on two consumers at once (Key_Shared's guarantee);
* every draining entry's ref count equals its consumer's pending entries for that hash (> 0);
* a consumer holding a hash that is now selected elsewhere is draining it;
* a hash is blocked for its selected consumer X iff another consumer still holds it;
* the unblocking callback fires exactly when a refused hash drains without its owner leaving;
* stats agree with the entries, and pending maps iterate in position order.
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from ks_dispatch_helpers import FakeConsumer

from keyshared.broker.dispatch.draining import BATCH_UNBLOCKED, DrainingHashesTracker
from keyshared.broker.dispatch.pending_acks import PendingAcksMap
from keyshared.broker.dispatch.selectors import (
    ConsistentHashingStickyKeyConsumerSelector,
    HashRangeAutoSplitStickyKeyConsumerSelector,
    StickyKeyConsumerSelector,
)

Pos = tuple[int, int]

# A few keys, so hashes repeat and move between consumers as they come and go.
HASHES = [(k * 2654435761) % 65535 + 1 for k in range(1, 9)]
NAMES = ["a", "b", "c", "a"]


class DrainingMachine(RuleBasedStateMachine):
    """The dispatcher's use of the three structures, minus I/O."""

    def __init__(self) -> None:
        super().__init__()
        self.selector = self.make_selector()
        self.unblocked: list[int] = []
        self.tracker = DrainingHashesTracker[FakeConsumer](self.unblocked.append, "sub")
        self.acks: dict[FakeConsumer, PendingAcksMap[FakeConsumer, Pos]] = {}
        self.model: dict[FakeConsumer, dict[Pos, int]] = {}
        self.replay: dict[Pos, int] = {}
        self.next_entry = 0
        self.counter = 0
        self.cleared: dict[FakeConsumer, int] = {}

    def make_selector(self) -> StickyKeyConsumerSelector[FakeConsumer]:
        return ConsistentHashingStickyKeyConsumerSelector[FakeConsumer](4)

    # --- helpers -------------------------------------------------------------------------
    def _hashes_of(self, consumer: FakeConsumer) -> list[int]:
        return list(self.acks[consumer].sticky_hashes())

    def _holders(self, sticky_hash: int) -> list[FakeConsumer]:
        return [c for c, pend in self.model.items() if sticky_hash in pend.values()]

    def _expect_unblock(self, consumer: FakeConsumer, positions: list[Pos]) -> set[int]:
        """Hashes that a non-closing removal of ``positions`` should report as unblocked."""
        gone: dict[int, int] = {}
        for pos in positions:
            h = self.model[consumer][pos]
            gone[h] = gone.get(h, 0) + 1
        result = set()
        for h, n in gone.items():
            entry = self.tracker.get_entry(h)
            if entry is not None and entry.consumer is consumer:
                assert entry.ref_count >= n
                if entry.ref_count == n and entry.blocked_count > 0:
                    result.add(h)
        return result

    def _send(self, pos: Pos, sticky_hash: int) -> bool:
        """Try to deliver one entry as the dispatcher does; True if it became pending."""
        consumer = self.selector.select(sticky_hash)
        if consumer is None:
            return False
        others = [c for c in self._holders(sticky_hash) if c is not consumer]
        blocked = self.tracker.should_block_sticky_key_hash(consumer, sticky_hash)
        assert blocked == bool(others), (sticky_hash, consumer, others)
        if blocked:
            event("delivery blocked by a draining hash")
            return False
        assert self.acks[consumer].add_pending_ack_if_allowed(pos, 1, sticky_hash)
        self.model[consumer][pos] = sticky_hash
        return True

    # --- rules ---------------------------------------------------------------------------
    @initialize(name=st.sampled_from(NAMES))
    def first_join(self, name: str) -> None:
        self.join(name)

    @rule(name=st.sampled_from(NAMES))
    def join(self, name: str) -> None:
        self.counter += 1
        consumer = FakeConsumer(name, self.counter)
        impacted = self.selector.add_consumer(consumer)
        tracker = self.tracker
        self.acks[consumer] = PendingAcksMap(
            consumer, lambda c, _pos, h: tracker.may_add_pending_ack(c, h), tracker
        )
        self.model[consumer] = {}
        self.cleared[consumer] = 0
        tracker.register_draining_hashes(impacted, self._hashes_of, skip=consumer)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        consumer = data.draw(st.sampled_from(sorted(self.model, key=lambda c: c.tag)))
        before_calls = len(self.unblocked)
        impacted = self.selector.remove_consumer(consumer)
        if not self.selector.consumers():
            # Pulsar's clearComponentsAfterRemovedAllConsumers: everything is forgotten.
            self.acks[consumer].for_each_and_close()
            self.tracker.clear()
            self.replay.clear()
        else:
            for ack in self.acks[consumer].for_each_and_close():
                self.replay[ack.position] = ack.sticky_hash
            self.tracker.register_draining_hashes(impacted, self._hashes_of, skip=consumer)
            self.tracker.consumer_removed(consumer)
        assert len(self.unblocked) == before_calls  # closing never wakes the dispatcher
        del self.acks[consumer], self.model[consumer], self.cleared[consumer]

    @precondition(lambda self: self.model)
    @rule(hashes=st.lists(st.sampled_from(HASHES), min_size=1, max_size=8))
    def dispatch(self, hashes: list[int]) -> None:
        for sticky_hash in hashes:
            self.next_entry += 1
            pos = (1, self.next_entry)
            if sticky_hash in self.replay.values() or not self._send(pos, sticky_hash):
                # A normal read never overtakes a replay-queued entry of the same hash.
                self.replay[pos] = sticky_hash

    @precondition(lambda self: self.replay and self.model)
    @rule()
    def replay_read(self) -> None:
        # Replays go out oldest first; a blocked hash keeps its later entries queued behind it.
        waiting: set[int] = set()
        for pos in sorted(self.replay):
            h = self.replay[pos]
            if h in waiting:
                continue
            if self._send(pos, h):
                del self.replay[pos]
            else:
                waiting.add(h)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        holders = sorted((c for c, p in self.model.items() if p), key=lambda c: c.tag)
        consumer = data.draw(st.sampled_from(holders))
        pos = data.draw(st.sampled_from(sorted(self.model[consumer])))
        expected = self._expect_unblock(consumer, [pos])
        before_calls = len(self.unblocked)
        assert self.acks[consumer].remove(pos)
        del self.model[consumer][pos]
        if expected:
            event("ack unblocked a hash")
        assert set(self.unblocked[before_calls:]) == expected
        assert len(self.unblocked) - before_calls == len(expected)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def ack_whole_key(self, data: st.DataObject) -> None:
        """A consumer finishes one key: acks every entry it holds for that hash, in order."""
        holders = sorted((c for c, p in self.model.items() if p), key=lambda c: c.tag)
        consumer = data.draw(st.sampled_from(holders))
        h = data.draw(st.sampled_from(sorted(set(self.model[consumer].values()))))
        for pos in sorted(p for p, v in self.model[consumer].items() if v == h):
            expected = self._expect_unblock(consumer, [pos])
            before_calls = len(self.unblocked)
            assert self.acks[consumer].remove(pos)
            del self.model[consumer][pos]
            if expected:
                event("ack unblocked a hash")
            assert self.unblocked[before_calls:] == sorted(expected)

    @precondition(lambda self: self.next_entry > 0)
    @rule(data=st.data())
    def mark_delete_jump(self, data: st.DataObject) -> None:
        bound = (1, data.draw(st.integers(0, self.next_entry)))
        for consumer in sorted(self.model, key=lambda c: c.tag):
            positions = [p for p in self.model[consumer] if p <= bound]
            expected = self._expect_unblock(consumer, positions)
            before_calls = len(self.unblocked)
            assert self.acks[consumer].remove_all_up_to(bound) == len(positions)
            for p in positions:
                del self.model[consumer][p]
            assert self.unblocked[before_calls:] == ([BATCH_UNBLOCKED] if expected else [])
        for p in [p for p in self.replay if p <= bound]:
            del self.replay[p]

    # --- invariants ----------------------------------------------------------------------
    @invariant()
    def one_consumer_per_hash(self) -> None:
        for h in HASHES:
            assert len(self._holders(h)) <= 1, (h, self._holders(h))

    @invariant()
    def ref_counts_equal_pending_counts(self) -> None:
        for h, entry in self.tracker.items():
            assert entry.consumer in self.model
            held = sum(1 for v in self.model[entry.consumer].values() if v == h)
            assert entry.ref_count == held > 0, (h, entry, held)

    @invariant()
    def nobody_drains_a_hash_it_owns(self) -> None:
        for h, entry in self.tracker.items():
            assert self.selector.select(h) is not entry.consumer, (h, entry)

    @invariant()
    def moved_hashes_are_draining(self) -> None:
        for consumer, pend in self.model.items():
            for h in set(pend.values()):
                if self.selector.select(h) is not consumer:
                    entry = self.tracker.get_entry(h)
                    assert entry is not None and entry.consumer is consumer, (h, consumer)

    @invariant()
    def blocked_iff_held_elsewhere(self) -> None:
        for h in HASHES:
            selected = self.selector.select(h)
            if selected is None:
                continue
            held_elsewhere = any(c is not selected for c in self._holders(h))
            assert self.tracker.would_block(selected, h) == held_elsewhere, h

    @invariant()
    def stats_and_maps_agree(self) -> None:
        for consumer, pend in self.model.items():
            acks = self.acks[consumer]
            assert acks.positions() == sorted(pend)
            assert dict((a.position, a.sticky_hash) for a in acks) == pend
            stats = self.tracker.consumer_stats(consumer)
            mine = {h: e for h, e in self.tracker.items() if e.consumer is consumer}
            assert [row.hash for row in stats.draining_hashes] == sorted(mine)
            assert stats.draining_hashes_unacked_messages == sum(e.ref_count for e in mine.values())
            assert stats.draining_hashes_count == len(mine)
            assert stats.draining_hashes_cleared_total >= self.cleared[consumer]
            self.cleared[consumer] = stats.draining_hashes_cleared_total


class AutoSplitDrainingMachine(DrainingMachine):
    """The same rules over the auto-split selector (consistent hashing off)."""

    def make_selector(self) -> StickyKeyConsumerSelector[FakeConsumer]:
        return HashRangeAutoSplitStickyKeyConsumerSelector[FakeConsumer]()


MACHINE_SETTINGS = settings(
    max_examples=70,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)

TestDrainingMachine = DrainingMachine.TestCase
TestDrainingMachine.settings = MACHINE_SETTINGS
TestAutoSplitDrainingMachine = AutoSplitDrainingMachine.TestCase
TestAutoSplitDrainingMachine.settings = MACHINE_SETTINGS
