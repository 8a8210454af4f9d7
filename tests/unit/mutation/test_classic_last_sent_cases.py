"""Classic Key_Shared's last sent position and who counts as recently joined, as the stats show
them (seed pip-282), in states the simulator reaches but none of its invariants reads: each kills
mutants that survived ``make mutate`` (bench/results/mutation/report.md)."""

from __future__ import annotations

from keyshared.broker.consumer import Consumer, KeySharedMeta, SubType
from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher
from tests.sim.test_classic_timelines import KEY_A, KEY_B, Timeline
from tests.sim.world import SimTransport


def _classic(t: Timeline) -> ClassicKeySharedDispatcher:
    d = t.sub.dispatcher
    assert isinstance(d, ClassicKeySharedDispatcher)
    return d


def _recently_joined_names(t: Timeline) -> list[str]:
    """Who ``consumersAfterMarkDeletePosition`` lists, by name."""
    after = _classic(t).stats()["consumersAfterMarkDeletePosition"]
    return [k.split(",")[0].removeprefix("consumerName=") for k in after]


def test_the_last_entry_sent_becomes_the_last_sent_position_at_once() -> None:
    # Sent ranges that continue the last sent position fold into it, the topic's last entry
    # included: nothing stays listed as sent beyond it.
    t = Timeline("last_sent")
    try:
        t.join("c1", 10)
        a0 = t.publish(KEY_A)
        assert t.positions_of("c1", KEY_A) == [a0]
        st = _classic(t).stats()
        assert st["lastSentPosition"] == str(a0)
        assert st["individuallySentPositions"] == "[]"
    finally:
        t.close()


def test_a_redelivery_of_the_last_sent_entry_is_not_sent_beyond_it() -> None:
    # Only entries after the last sent position are recorded as sent beyond it (Pulsar's
    # ``compareTo(lastSentPosition) > 0``); a redelivered one at it is not.
    t = Timeline("last_sent")
    try:
        c1 = t.join("c1", 10)
        a0 = t.publish(KEY_A)
        t.sub.redeliver_unacknowledged(c1, [a0])
        t.settle()
        assert t.positions_of("c1", KEY_A) == [a0, a0]
        st = _classic(t).stats()
        assert st["lastSentPosition"] == str(a0)
        assert st["individuallySentPositions"] == "[]"
    finally:
        t.close()


def test_a_clear_backlog_moves_the_last_sent_position_up_to_the_mark_delete_position() -> None:
    # updateIfNeededAndGetLastSentPosition: behind the mark-delete position, the last sent
    # position jumps to it and forgets what was sent before it.
    t = Timeline("last_sent")
    try:
        t.join("c1", 1000)
        t.join("c2", 1)
        b0 = t.publish(KEY_B)  # -> c2, now out of permits
        t.publish(KEY_B)  # waits for c2: the last sent position stays at b0
        a0 = t.publish(KEY_A)  # -> c1, sent beyond the last sent position
        t.wait_until(lambda: t.positions_of("c1", KEY_A) == [a0])
        d = _classic(t)
        assert d.stats()["lastSentPosition"] == str(b0)
        t.sub.clear_backlog()
        assert t.sub.cursor.mark_delete_position == a0
        c3 = t.join("c3", 1000)  # asks for the last sent position: its join position
        st = d.stats()
        assert st["lastSentPosition"] == str(a0)
        assert st["individuallySentPositions"] == "[]"
        assert d.consumer_stats(c3)["lastSentPositionWhenJoining"] == str(a0)
    finally:
        t.close()


def test_a_second_consumer_joining_while_an_entry_is_out_is_recently_joined() -> None:
    t = Timeline("last_sent")
    try:
        t.join("c1", 1000)
        a0 = t.publish(KEY_A)
        assert t.positions_of("c1", KEY_A) == [a0]
        t.join("c2", 1000)
        assert _recently_joined_names(t) == ["c2"]
    finally:
        t.close()


def _join_out_of_order(t: Timeline, name: str, permits: int) -> Consumer:
    """As ``Timeline.join``, for a consumer asking for allowOutOfOrderDelivery."""
    consumer = Consumer(
        consumer_id=len(t.consumers),
        consumer_name=name,
        subscription=t.sub,
        sub_type=SubType.Key_Shared,
        transport=SimTransport(t._on_messages, lambda c: None),
        key_shared_meta=KeySharedMeta(allow_out_of_order_delivery=True),
        track_pending_acks=True,
    )
    t.consumers[name] = consumer
    t.received[name] = []
    t.sub.add_consumer(consumer)
    consumer.add_permits(permits)
    assert t.sub.dispatcher is not None
    t.sub.dispatcher.consumer_flow(consumer, permits)
    t.settle()
    return consumer


def test_with_out_of_order_delivery_allowed_nobody_is_recently_joined() -> None:
    # allowOutOfOrderDelivery: no join positions, so a consumer joining while entries are out
    # takes its keys' new entries at once.
    t = Timeline("last_sent")
    try:
        t.sub.dispatcher = None  # the first join makes the one its consumers ask for
        _join_out_of_order(t, "c1", 1)
        _join_out_of_order(t, "c2", 1000)
        assert _classic(t).allow_out_of_order
        a0 = t.publish(KEY_A)
        assert t.positions_of("c1", KEY_A) == [a0]
        _join_out_of_order(t, "c3", 1000)  # key a moves to c3 while c1 holds a0
        assert _recently_joined_names(t) == []
        a1 = t.publish(KEY_A)
        assert t.positions_of("c3", KEY_A) == [a1]
    finally:
        t.close()
