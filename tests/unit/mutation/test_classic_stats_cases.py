"""Classic Key_Shared stats the simulator does not read: each kills mutants that survived ``make
mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher
from tests.sim.test_classic_timelines import KEY_A, KEY_B, Timeline
from tests.sim.world import payload


def test_stats_show_the_last_sent_position_and_what_was_sent_beyond_it() -> None:
    t = Timeline("last_sent")
    try:
        t.join("c1", 1000)
        t.join("c2", 1)
        b0 = t.publish(KEY_B)  # -> c2, now out of permits
        t.publish(KEY_B)  # waits for c2: the last sent position stays at b0
        a0 = t.publish(KEY_A)  # -> c1, sent beyond the last sent position
        t.wait_until(lambda: t.positions_of("c1", KEY_A) == [a0])
        d = t.sub.dispatcher
        assert isinstance(d, ClassicKeySharedDispatcher)
        st = d.stats()
        assert st["lastSentPosition"] == str(b0)
        assert st["individuallySentPositions"] == f"[({a0.ledger_id}:{a0.entry_id - 1}..{a0}]]"
    finally:
        t.close()


def test_stats_before_anything_was_sent_are_empty_strings() -> None:
    # The read-position rule never asks for the last sent position, so nothing sets it.
    t = Timeline("read")
    try:
        t.join("c1", 10)
        d = t.sub.dispatcher
        assert isinstance(d, ClassicKeySharedDispatcher) and d.last_sent is None
        st = d.stats()
        assert st["lastSentPosition"] == ""
        assert st["individuallySentPositions"] == "[]"
    finally:
        t.close()


def test_consumer_stats_carry_the_consumers_ranges_and_join_position() -> None:
    t = Timeline("last_sent")
    try:
        c1 = t.join("c1", 10)
        d = t.sub.dispatcher
        assert isinstance(d, ClassicKeySharedDispatcher)
        ranges = d.selector.get_consumer_key_hash_ranges()[c1]
        cs = d.consumer_stats(c1)
        assert cs["keyHashRangeArrays"] == [[s, e] for s, e in ranges] != []
        assert cs["lastSentPositionWhenJoining"] == str(d.joined_at[c1])
        t.leave("c1")
        # A consumer that left has no join position any more.
        assert d.consumer_stats(c1)["lastSentPositionWhenJoining"] == ""
    finally:
        t.close()


def test_a_consumer_removed_twice_is_let_go_quietly() -> None:
    # Removing a consumer that already left must not fail (the dispatcher's other state
    # tolerates it), and must not disturb the others.
    t = Timeline("last_sent")
    try:
        c1 = t.join("c1", 10)
        c2 = t.join("c2", 10)
        d = t.sub.dispatcher
        assert isinstance(d, ClassicKeySharedDispatcher)
        t.leave("c2")
        d.remove_consumer(c2)
        assert d.consumers == [c1] and list(d.joined_at) == [c1]
    finally:
        t.close()


def _recently_joined_names(t: Timeline) -> list[str]:
    """Who ``consumersAfterMarkDeletePosition`` lists, by name."""
    assert t.sub.dispatcher is not None
    after = t.sub.dispatcher.stats()["consumersAfterMarkDeletePosition"]
    return [k.split(",")[0].removeprefix("consumerName=") for k in after]


def _c3_joins_while_entries_are_out(t: Timeline) -> None:
    t.join("c1", 1)
    t.join("c2", 1000)
    for key in (KEY_A, KEY_A, KEY_B):
        t.ledger.add_entry(payload(key, 1, False))
    t.settle()
    t.join("c3", 1000)
    assert _recently_joined_names(t) == ["c3"]


def test_a_recently_joined_consumer_that_leaves_is_no_longer_listed() -> None:
    t = Timeline("last_sent")
    try:
        _c3_joins_while_entries_are_out(t)
        t.leave("c3")
        assert _recently_joined_names(t) == []
    finally:
        t.close()


def test_recently_joined_consumers_are_forgotten_only_when_one_consumer_is_left() -> None:
    # As Pulsar: with two consumers the join position still holds; alone, a consumer has no
    # one to wait for.
    t = Timeline("last_sent")
    try:
        _c3_joins_while_entries_are_out(t)
        t.leave("c1")
        assert _recently_joined_names(t) == ["c3"]
        t.leave("c2")
        assert _recently_joined_names(t) == []
    finally:
        t.close()
