"""Shared dispatch, stepped by hand: what ``make mutate`` found no test saying of
``SharedDispatcher`` and its replay queue (bench/results/mutation/report.md; the simulator runs
the Key_Shared dispatchers built on them)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from keyshared.broker.consumer import SubType
from keyshared.broker.dispatch import shared as shared_module
from keyshared.broker.dispatch.shared import ReplayQueue, SharedDispatcher
from keyshared.broker.subscription import AckItem
from keyshared.config import BrokerConfig
from keyshared.protocol import encode_payload_section, pb
from keyshared.storage.position import Position
from tests.sim.world import SimTransport, payload
from tests.unit.mutation.ks_harness import Harness


def _shared(**settings: object) -> Harness:
    config = BrokerConfig()
    for k, v in settings.items():
        setattr(config, k, v)
    return Harness(config, sub_type=SubType.Shared)


@pytest.fixture
def shared() -> Iterator[Harness]:
    with _shared() as h:
        yield h


class Clock:
    """The dispatcher's wall clock (``shared._now_ms``), moved by hand: a delayed entry due
    in 20 ms is not due yet however slowly a loaded machine runs the test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ms = int(time.time() * 1000)
        monkeypatch.setattr(shared_module, "_now_ms", lambda: self.ms)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock(monkeypatch)


def _disp(h: Harness) -> SharedDispatcher:
    disp = h.sub.dispatcher
    assert isinstance(disp, SharedDispatcher)
    return disp


def test_entries_go_round_robin_twenty_at_a_time() -> None:
    with _shared(dispatcherMinReadBatchSize=50) as h:
        h.join("c0", 100)
        h.join("c1", 100)
        sent = h.publish(*(f"k{i}" for i in range(50)))
        assert h.got("c0") == sent[:20] + sent[40:]
        assert h.got("c1") == sent[20:40]


@pytest.mark.parametrize(
    ("permits", "shares"),
    [
        # Three with permits: 20 each, in the order they joined.
        ((100, 100, 100), ([(0, 20)], [(20, 40)], [(40, 60)])),
        # The one without permits is passed over (and sent nothing, not even an empty batch).
        ((100, 0, 100), ([(0, 20), (40, 60)], [], [(20, 40)])),
        # 30 permits each: 20, 20, then the 10 each has left.
        ((30, 30, 0), ([(0, 20), (40, 50)], [(20, 40), (50, 60)], [])),
    ],
)
def test_round_robin_shares(
    permits: tuple[int, int, int], shares: tuple[list[tuple[int, int]], ...]
) -> None:
    with _shared(dispatcherMinReadBatchSize=60) as h:
        names = ("c0", "c1", "c2")
        consumers = [h.join(name, 0) for name in names]
        sent = h.publish(*(f"k{i}" for i in range(60)))
        # Permits for all before the read starts: one read of all 60 entries.
        for consumer, n in zip(consumers, permits, strict=True):
            consumer.add_permits(n)
        _disp(h).read_more()
        h.settle()
        for name, consumer, share in zip(names, consumers, shares, strict=True):
            assert h.got(name) == [p for a, b in share for p in sent[a:b]], name
            if not share:
                assert consumer.last_consumed_timestamp == 0


def test_a_consumer_gets_no_more_than_its_permits_even_one() -> None:
    with _shared(dispatcherMinReadBatchSize=10) as h:
        h.join("c0", 1)
        h.join("c1", 3)
        sent = h.publish("a", "b", "c", "d")
        assert h.got("c0") == sent[:1] and h.got("c1") == sent[1:]


@pytest.mark.parametrize("delayed_delivery", [True, False])
def test_entries_no_consumer_can_take_wait_in_the_replay_queue(delayed_delivery: bool) -> None:
    with _shared(dispatcherMinReadBatchSize=10, delayedDeliveryEnabled=delayed_delivery) as h:
        c0 = h.join("c0", 10)
        disp = _disp(h)
        assert disp.have_pending_read
        # Entries arrive while the read waits, and c0's connection fills up before it ends.
        sent = []
        for key in ("a", "b", "c"):
            pos = h.ledger.add_entry(payload(key, 1, False))
            h.keys[pos] = key
            sent.append(pos)
        transport = c0.transport
        assert isinstance(transport, SimTransport)
        transport.writable = False
        h.loop.run_ready()
        assert h.got("c0") == []
        assert list(disp.replay.iter_positions()) == sent
        # Nothing went out: the next try waits for the backoff.
        assert h.loop.next_timer_at() == h.loop.time() + 0.001
        assert [disp.replay.hash_of(p) for p in sent] == [0, 0, 0]
        transport.writable = True
        disp.on_writable()
        h.settle()
        assert h.got("c0") == sent


def test_a_replay_read_takes_no_more_than_the_permits() -> None:
    with _shared(dispatcherMinReadBatchSize=10) as h:
        h.join("c0", 10)
        sent = h.publish("a", "b", "c")
        h.join("c1", 2)
        h.leave("c0")
        assert h.got("c1") == sent[:2]
        h.flow("c1", 5)
        assert h.got("c1") == sent


def test_a_consumer_without_permits_is_skipped_and_the_rest_waits_for_permits() -> None:
    with _shared(dispatcherMinReadBatchSize=10) as h:
        h.join("c0", 3)
        h.join("c1", 0)
        sent = h.publish(*(f"k{i}" for i in range(5)))
        assert h.got("c0") == sent[:3] and h.got("c1") == []
        h.flow("c1", 10)
        assert h.got("c1") == sent[3:]


def test_what_a_leaving_consumer_held_goes_to_the_others_in_order(shared: Harness) -> None:
    h = shared
    h.join("c0", 100)
    sent = h.publish("a", "b", "c", "d")
    assert h.got("c0") == sent
    h.ack("c0", [sent[1]])
    h.join("c1", 100)
    h.leave("c0")
    assert h.got("c1") == [sent[0], sent[2], sent[3]]
    assert len(_disp(h).replay) == 0


def test_redelivery_of_some_positions_counts_them(shared: Harness) -> None:
    h = shared
    c0 = h.join("c0", 100)
    sent = h.publish("a", "b", "c")
    disp = _disp(h)
    assert c0.unacked_messages == 3
    # A position c0 does not hold is ignored.
    disp.redeliver(c0, [sent[2], sent[0], Position(99, 0)])
    h.settle()
    assert h.got("c0") == [*sent, sent[0], sent[2]]
    assert h.sub.redelivery_counts == {sent[0]: 1, sent[2]: 1}
    assert c0.msg_redeliver_counter == 2 and c0.unacked_messages == 3
    disp.redeliver(c0, None)
    h.settle()
    assert h.got("c0")[5:] == sent
    assert h.sub.redelivery_counts == {sent[0]: 2, sent[1]: 1, sent[2]: 2}
    assert c0.msg_redeliver_counter == 5


def test_without_the_redelivery_tracker_nothing_is_counted() -> None:
    with _shared(subscriptionRedeliveryTrackerEnabled=False) as h:
        c0 = h.join("c0", 100)
        sent = h.publish("a")
        _disp(h).redeliver(c0, None)
        h.settle()
        assert h.got("c0") == sent + sent
        assert h.sub.redelivery_counts == {}


def test_the_last_consumer_leaving_forgets_the_queue_and_the_next_starts_over(
    shared: Harness,
) -> None:
    h = shared
    h.join("c0", 2)
    sent = h.publish("a", "b", "c")
    h.ack("c0", [sent[0]])
    c0 = h.consumers["c0"]
    h.leave("c0")
    disp = _disp(h)
    assert len(disp.replay) == 0 and not disp.have_pending_read
    assert c0.pending_acks == {}
    h.join("c1", 100)
    assert h.got("c1") == sent[1:]


def _delayed(h: Harness, key: str, deliver_at_ms: int) -> Position:
    md = pb.MessageMetadata(
        producer_name="p",
        sequence_id=0,
        publish_time=1,
        partition_key=key,
        deliver_at_time=deliver_at_ms,
    )
    pos = h.ledger.add_entry(encode_payload_section(md, b"v"))
    h.keys[pos] = key
    return pos


def test_delayed_entries_wait_and_the_rest_goes_out() -> None:
    with _shared(dispatcherMinReadBatchSize=10) as h:
        now = int(time.time() * 1000)
        h.join("c0", 100)
        # One read gets both: the first waits, the second goes.
        later = _delayed(h, "later", now + 3_600_000)
        due = _delayed(h, "due", now - 1)
        h.settle()
        disp = _disp(h)
        assert h.got("c0") == [due]
        assert later in disp.delayed
        assert disp.stats() == {
            "msgInReplay": 0,
            "msgDelayed": 1,
            "blockedSubscriptionOnUnackedMsgs": False,
        }
        h.ack("c0", [due])
        # Acked up to past the delayed one (by hand): it is forgotten.
        disp.on_mark_delete_moved(later)
        assert len(disp.delayed) == 0


def test_an_entry_due_this_very_millisecond_is_not_held(monkeypatch: pytest.MonkeyPatch) -> None:
    # Held only when due after now (Pulsar delays deliverAt > now): an entry due at the clock's
    # own millisecond goes with the read, in order, not through the tracker and a replay after
    # the entry behind it. The clock stands still here.
    now = int(time.time() * 1000)
    monkeypatch.setattr(shared_module, "_now_ms", lambda: now)
    with _shared(dispatcherMinReadBatchSize=10) as h:
        h.join("c0", 100)
        # One read of all three.
        due = _delayed(h, "due", now)
        plain = _delayed(h, "plain", 0)
        later = _delayed(h, "later", now + 3_600_000)
        h.settle()
        assert h.got("c0") == [due, plain]
        assert later in _disp(h).delayed


def test_with_delayed_delivery_disabled_nothing_waits() -> None:
    with _shared(delayedDeliveryEnabled=False) as h:
        h.join("c0", 100)
        pos = _delayed(h, "later", int(time.time() * 1000) + 3_600_000)
        h.settle()
        assert h.got("c0") == [pos]


def test_the_subscription_unacked_limit_blocks_and_unblocks_below_half() -> None:
    with _shared(maxUnackedMessagesPerSubscription=4, dispatcherMinReadBatchSize=10) as h:
        h.join("c0", 100)
        sent = h.publish(*(f"k{i}" for i in range(10)))
        disp = _disp(h)
        # A read asks for no more than the room left: exactly the limit goes out.
        assert h.got("c0") == sent[:4]
        assert disp.stats()["blockedSubscriptionOnUnackedMsgs"] is True
        h.ack("c0", sent[:2])
        assert h.got("c0") == sent[:4]  # 2 held: not fewer than half
        h.ack("c0", sent[2:3])
        assert h.got("c0") == sent[:7]
        assert disp.stats()["blockedSubscriptionOnUnackedMsgs"] is True


def test_a_cursor_moved_by_hand_forgets_what_was_queued_and_held(shared: Harness) -> None:
    h = shared
    c0 = h.join("c0", 100)
    sent = h.publish("a", "b")
    disp = _disp(h)
    disp.replay.add(sent[0])
    disp.reset()
    assert len(disp.replay) == 0
    assert c0.pending_acks == {} and c0.unacked_messages == 0


def test_the_delayed_timer_wakes_the_dispatcher_when_the_entry_is_due(
    shared: Harness, clock: Clock
) -> None:
    h = shared
    h.join("c0", 100)
    start = h.loop.time()
    hour = _delayed(h, "hour", clock.ms + 3_600_000)
    h.loop.run_ready()
    # One timer, set for the entry's due time (the virtual clock counts the same seconds).
    at = h.loop.next_timer_at()
    assert at is not None and 3_599 <= at - start <= 3_600
    soon = _delayed(h, "soon", clock.ms + 20)
    h.loop.run_ready()
    # Re-armed for the earlier entry; the hour's timer is gone, not left to fire as well.
    at = h.loop.next_timer_at()
    assert at is not None and at - start <= 0.02
    clock.ms += 30
    assert h.loop.fire_next_timer()
    disp = _disp(h)
    while not disp.have_pending_replay_read:
        assert h.loop.run_one()
    # Due: queued for a replay read, its key not known until it is read.
    assert soon in disp.replay and disp.replay.hash_of(soon) == 0
    h.loop.run_ready()
    assert h.got("c0") == [soon]
    at = h.loop.next_timer_at()
    assert at is not None and 3_599 <= at - start <= 3_600
    assert hour in _disp(h).delayed
    h.leave("c0")
    _disp(h).close()
    assert not h.loop.has_timer()


def _due_with_its_timer_armed(h: Harness, clock: Clock) -> Position:
    """c0 joins; a delayed entry due in 20 ms is read and held with its timer armed; then 30 ms
    pass, so it is due but the timer has not fired yet."""
    h.join("c0", 100)
    soon = _delayed(h, "soon", clock.ms + 20)
    h.loop.run_ready()
    assert h.loop.has_timer()
    clock.ms += 30
    return soon


def test_the_last_delayed_entry_due_leaves_no_timer(shared: Harness, clock: Clock) -> None:
    h = shared
    soon = _due_with_its_timer_armed(h, clock)
    assert h.loop.fire_next_timer()
    h.loop.run_ready()
    assert h.got("c0") == [soon]
    assert len(_disp(h).delayed) == 0 and not h.loop.has_timer()
    # The next delayed entry arms a timer again; closing cancels it.
    _delayed(h, "hour", int(time.time() * 1000) + 3_600_000)
    h.loop.run_ready()
    assert h.loop.has_timer()
    _disp(h).close()
    assert not h.loop.has_timer()


def test_redelivering_a_partly_acked_batch_releases_only_its_unacked_messages(
    shared: Harness,
) -> None:
    h = shared
    c0 = h.join("c0", 100)
    (pos,) = h.publish("k", batch=3)
    assert c0.unacked_messages == 3
    # Index 0 acked on its own: the ack set keeps indexes 1 and 2 (set bits are unacked).
    h.sub.acknowledge(c0, False, [AckItem(pos, [0b110])])
    h.settle()
    assert c0.unacked_messages == 2
    _disp(h).redeliver(c0, None)
    assert c0.msg_redeliver_counter == 2 and c0.unacked_messages == 0


def test_shared_dispatches_a_replay_read_even_if_older_entries_were_queued_meanwhile(
    shared: Harness,
) -> None:
    # Key order is Key_Shared's (orders_by_key): Shared neither counts the queue's key hashes
    # nor reads a replay again because a leaving consumer queued older entries during it.
    h = shared
    h.join("c0", 3)
    first = h.publish("a", "b", "c")
    c1 = h.join("c1", 10)
    later = h.publish("d", "e")
    assert h.got("c0") == first and h.got("c1") == later
    disp = _disp(h)
    assert not disp.replay.track_hashes
    disp.redeliver(c1, None)
    while not disp.have_pending_replay_read:
        assert h.loop.run_one()
    h.leave("c0")
    assert h.got("c1") == later + later + first


def test_a_replay_read_takes_no_more_than_the_room_under_the_unacked_limit() -> None:
    with _shared(dispatcherMinReadBatchSize=10) as h:
        h.join("c0", 100)
        sent = h.publish(*(f"k{i}" for i in range(6)))
        c1 = h.join("c1", 100)
        # The limit comes in force now (a policy change): c0's six go back to the queue as it
        # leaves, and c1 may hold four.
        h.config.maxUnackedMessagesPerSubscription = 4
        h.leave("c0")
        assert h.got("c1") == sent[:4] and c1.unacked_messages == 4
        assert _disp(h).stats()["blockedSubscriptionOnUnackedMsgs"] is True


def test_the_replay_queue_drops_what_the_mark_delete_position_passed() -> None:
    q = ReplayQueue(track_hashes=True)
    for e in (5, 1, 3, 2, 4):
        q.add(Position(1, e), 100 + e)
    assert q.first() == Position(1, 1)
    q.remove_up_to(Position(1, 3))  # inclusive
    assert q.first() == Position(1, 4)
    assert list(q.iter_positions()) == [Position(1, 4), Position(1, 5)]
    assert not q.contains_hash(103) and q.contains_hash(104)
    q.remove_up_to(Position(0, 99))  # before them all: nothing
    assert len(q) == 2
    q.remove_up_to(Position(2, 0))
    assert len(q) == 0 and q.first() is None
    assert not q.contains_hash(104) and not q.contains_hash(105)
    # Queued again under another hash: the old one no longer counts.
    q.add(Position(3, 0), 7)
    q.add(Position(3, 0), 8)
    assert not q.contains_hash(7) and q.contains_hash(8)
    assert q.hash_of(Position(3, 0)) == 8
    # Two entries of one key: the key is held back until both are gone.
    q.add(Position(3, 1), 8)
    q.remove(Position(3, 0))
    assert q.contains_hash(8)
    q.remove(Position(3, 1))
    assert not q.contains_hash(8)


def test_a_due_entry_taken_by_a_read_before_its_timer_cancels_the_timer(
    shared: Harness, clock: Clock
) -> None:
    h = shared
    soon = _due_with_its_timer_armed(h, clock)
    # A publish wakes the dispatcher before the timer fires: the due entry goes with it.
    (plain,) = h.publish("plain")
    assert sorted(h.got("c0")) == [soon, plain]
    assert not h.loop.has_timer()
    _delayed(h, "hour", int(time.time() * 1000) + 3_600_000)
    h.loop.run_ready()
    assert h.loop.has_timer()
    _disp(h).close()
    assert not h.loop.has_timer()


def test_the_replay_queue_keeps_no_position_the_read_did_not_find(shared: Harness) -> None:
    h = shared
    c0 = h.join("c0", 2)
    sent = h.publish("a", "b")
    disp = _disp(h)
    disp.redeliver(c0, [sent[1]])
    h.settle()
    assert list(disp.replay.iter_positions()) == [sent[1]]  # no permits left to replay it
    # Acked while queued (a late ack): the replay read finds nothing there, and drops it.
    h.sub.acknowledge(c0, False, [AckItem(sent[1])])
    h.flow("c0", 1)
    assert len(disp.replay) == 0 and h.got("c0") == sent


def test_replay_queue_lookups_of_what_is_not_queued() -> None:
    q = ReplayQueue(track_hashes=True)
    q.remove(Position(1, 1))  # not queued: nothing to do
    assert q.hash_of(Position(1, 1)) == 0
    q.add(Position(1, 2), 1)  # hash 1 is a hash like any other
    assert q.contains_hash(1) and q.hash_of(Position(1, 2)) == 1
    assert not q.contains_hash(0)


def test_the_mark_delete_position_itself_is_never_queued(shared: Harness) -> None:
    h = shared
    h.join("c0", 10)
    sent = h.publish("a", "b")
    h.ack("c0", [sent[0]])
    disp = _disp(h)
    assert h.cursor.mark_delete_position == sent[0]
    disp.add_to_replay(sent[0], 0)
    assert len(disp.replay) == 0
    disp.add_to_replay(sent[1], 0)
    assert list(disp.replay.iter_positions()) == [sent[1]]


def test_a_queued_hash_is_kept_when_the_position_is_queued_again_without_one() -> None:
    q = ReplayQueue(track_hashes=True)
    q.add(Position(1, 1))  # no hash given: unknown until read
    assert q.hash_of(Position(1, 1)) == 0 and not q.contains_hash(1)
    q.add(Position(1, 2), 7)
    q.add(Position(1, 2), 0)  # again, unknown this time: the known hash stays
    assert q.hash_of(Position(1, 2)) == 7 and q.contains_hash(7)
    q.add(Position(1, 2), 7)  # again, the same: counted once
    assert q.hash_of(Position(1, 2)) == 7
    q.remove(Position(1, 2))
    assert not q.contains_hash(7)


def test_the_lowest_position_queued_with_a_known_hash_is_kept() -> None:
    q = ReplayQueue(track_hashes=True)
    q.add(Position(1, 5), 0)  # unknown hash: not counted, not the lowest with a hash
    assert q.min_added_with_hash is None
    for e, h in ((7, 70), (3, 30), (9, 90)):
        q.add(Position(1, e), h)
    assert q.min_added_with_hash == Position(1, 3)
    untracked = ReplayQueue()
    untracked.add(Position(1, 1), 10)
    assert untracked.min_added_with_hash is None and not untracked.contains_hash(10)


def test_a_non_durable_subscription_has_no_unacked_limit() -> None:
    with _shared(maxUnackedMessagesPerSubscription=2) as h:
        h.join("c0", 0)
        assert _disp(h).unacked_limit.limit == 2
        h.sub.durable = False
        assert _disp(h).unacked_limit.limit == 0


def test_no_read_without_permits_even_under_an_unacked_limit() -> None:
    # The limit's room rounds a read up to one entry: only when some consumer has permits.
    with _shared(maxUnackedMessagesPerSubscription=10) as h:
        h.join("c0", 0)
        sent = h.publish("a")
        disp = _disp(h)
        disp.read_more()  # as an ack or a policy change would
        h.settle()
        assert h.got("c0") == [] and len(disp.replay) == 0
        assert not disp.have_pending_read and not h.loop.has_timer()
        h.flow("c0", 1)
        assert h.got("c0") == sent


def test_a_lower_priority_level_is_sent_nothing_while_a_higher_one_has_permits() -> None:
    """Pulsar's getNextConsumer: round robin only among the best ``priorityLevel`` with permits
    (0 is the highest); a consumer of a lower level gets entries once those above have none."""
    with _shared(dispatcherMinReadBatchSize=100) as h:
        # Joined lowest level first, so that join order alone would favour it.
        h.join("low", 100, priority=2)
        h.join("mid", 0, priority=1)
        h.join("top1", 30, priority=0)
        h.join("top2", 30, priority=0)
        sent = h.publish(*(f"k{i}" for i in range(70)))
        # The two of level 0 share their 60 permits in turns of 20; level 2 gets the rest.
        assert sorted(h.got("top1") + h.got("top2")) == sent[:60]
        assert len(h.got("top1")) == 30 and len(h.got("top2")) == 30
        assert h.got("mid") == []
        assert h.got("low") == sent[60:]
        # Level 1 gains permits: it now comes before level 2.
        h.flow("mid", 5)
        more = h.publish("x", "y", "z")
        assert h.got("mid") == more and h.got("low") == sent[60:]


def test_an_entry_due_soon_after_a_wakeup_waits_for_the_next_tick(
    shared: Harness, clock: Clock
) -> None:
    """The delayed timer is spaced by delayedDeliveryTickTimeMillis (1,000 by default) from its
    last wake-up, as Pulsar's lastTickRun + tickTimeMillis: not re-armed 50 ms later."""
    h = shared
    soon = _due_with_its_timer_armed(h, clock)
    assert h.loop.fire_next_timer()
    h.loop.run_ready()
    assert h.got("c0") == [soon]
    start = h.loop.time()
    nxt = _delayed(h, "next", clock.ms + 50)
    h.loop.run_ready()
    at = h.loop.next_timer_at()
    assert at is not None and at - start == pytest.approx(1.0)
    clock.ms += 1_000
    assert h.loop.fire_next_timer()
    h.loop.run_ready()
    assert h.got("c0") == [soon, nxt]
