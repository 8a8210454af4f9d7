"""Classic Key_Shared's replay filter (Pulsar's filterOutEntriesWillBeDiscarded), where a queued
entry that the dispatch would hold back anyway is read again: no ordering invariant sees it, but
it takes the place of what could go, round after round. Each test kills mutants that survived
``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from collections.abc import Sequence

from keyshared.broker.consumer import Consumer, OutboundMessage
from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher
from keyshared.broker.dispatch.selectors import ConsistentHashingStickyKeyConsumerSelector
from keyshared.storage.position import Position
from tests.sim.test_classic_timelines import KEY_A, KEY_B, Timeline


class _Named:
    def __init__(self, name: str) -> None:
        self.consumer_name = name


def _key(d: ClassicKeySharedDispatcher, prefix: str, owners: dict[tuple[str, ...], str]) -> str:
    """A key whose owner among each set of consumer names is the one given (Timeline's
    selector: consistent hashing, 100 points, keyed by consumer name)."""
    selectors = {}
    for names in owners:
        sel: ConsistentHashingStickyKeyConsumerSelector[_Named] = (
            ConsistentHashingStickyKeyConsumerSelector(100)
        )
        for n in names:
            sel.add_consumer(_Named(n))
        selectors[names] = sel

    def fits(key: str) -> bool:
        h = d.slot_of_key(key.encode())
        for names, owner in owners.items():
            got = selectors[names].select(h)
            if got is None or got.consumer_name != owner:
                return False
        return True

    return next(k for k in (f"{prefix}{i}" for i in range(10_000)) if fits(k))


def _record(t: Timeline) -> dict[str, list[Position]]:
    """Positions each consumer received, whatever the key."""
    received: dict[str, list[Position]] = {}

    def on_messages(consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        for m in messages:
            received.setdefault(consumer.consumer_name, []).append(m.entry.position)

    t._on_messages = on_messages  # type: ignore[method-assign]
    return received


def _classic(t: Timeline) -> ClassicKeySharedDispatcher:
    d = t.sub.dispatcher
    assert isinstance(d, ClassicKeySharedDispatcher)
    return d


def test_a_queued_entry_of_a_moved_key_does_not_take_the_permit_of_one_that_can_go() -> None:
    # c3 takes key a over while c1 still holds a0, so a1 waits (queued) for c1 to finish with
    # a0; behind it, k (a key c3 owns) is queued too, as c3 had no permits. Given one permit,
    # c3 must get k: replaying a1 sends nothing, and taking a1 as the candidate left k queued
    # round after round until c1 acked.
    t = Timeline("last_sent")
    try:
        received = _record(t)
        d = _classic(t)
        key_k = _key(d, "k", {("c1", "c2", "c3"): "c3"})
        t.join("c1", 1000)
        t.join("c2", 1)
        t.publish(KEY_B)  # -> c2, now out of permits
        t.publish(KEY_B)  # queued for c2
        a0 = t.publish(KEY_A)  # -> c1, sent beyond the last sent position
        t.wait_until(lambda: received.get("c1") == [a0])
        t.ack_all("c2")  # mark-delete position = the last sent position
        c3 = t.join("c3", 0)  # key a moves to c3, not held back by its join position
        a1 = t.publish(KEY_A)
        k0 = t.publish(key_k)
        assert a1 in set(d.replay.iter_positions()) and k0 in set(d.replay.iter_positions())
        c3.add_permits(1)
        d.consumer_flow(c3, 1)
        t.settle()
        assert received.get("c3") == [k0]
        t.ack_all("c1")
        c3.add_permits(1)
        d.consumer_flow(c3, 1)
        t.wait_until(lambda: received.get("c3") == [k0, a1])
    finally:
        t.close()


def test_a_replay_beyond_the_earliest_join_position_does_not_stop_the_reads() -> None:
    # c3 joins at x0 and c4 later at y1, both while x0 is out; y1 comes back (a nack) for c4.
    # A replay is held to the earliest join position of all (x0), as Pulsar's classic
    # dispatcher: replaying y1 would send nothing, and while it is a candidate no normal read
    # starts, so c1 never got z (Key_Shared row 22 with two join positions).
    t = Timeline("last_sent")
    try:
        received = _record(t)
        d = _classic(t)
        key_x = _key(d, "x", {("c1",): "c1", ("c1", "c3"): "c1", ("c1", "c3", "c4"): "c1"})
        key_y = _key(d, "y", {("c1", "c3"): "c1", ("c1", "c3", "c4"): "c4"})
        c1 = t.join("c1", 2)
        x0 = t.publish(key_x)  # -> c1, never acked: the mark-delete position stays before it
        t.join("c3", 1000)  # recently joined at x0
        y1 = t.publish(key_y)  # -> c1, now out of permits
        assert received.get("c1") == [x0, y1]
        c4 = t.join("c4", 1000)  # recently joined at y1; key y moves to it
        assert d.recently_joined == {t.consumers["c3"]: x0, c4: y1}
        t.sub.redeliver_unacknowledged(c1, [y1])
        t.settle()
        assert received.get("c4") is None, "y1 is after c3's join position"
        z = t.publish(key_x)  # nobody reads it: only recently joined consumers have permits
        c1.add_permits(1)
        d.consumer_flow(c1, 1)
        t.settle()
        assert received.get("c1") == [x0, y1, z]
    finally:
        t.close()
