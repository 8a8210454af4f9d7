"""Exclusive and Failover dispatch, stepped by hand: what ``make mutate`` found no test saying
of ``SingleActiveDispatcher`` (bench/results/mutation/report.md; the simulator runs Key_Shared)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from keyshared.broker.consumer import SubType
from keyshared.broker.dispatch.single_active import SingleActiveDispatcher
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.subscription import AckItem
from keyshared.broker.throttle import DispatchThrottle, Rate, SharedDispatchLimiters
from keyshared.config import BrokerConfig
from keyshared.protocol.markers import SnapshotRequest, marker_entry
from tests.sim.world import SimTopicName
from tests.unit.mutation.ks_harness import Harness


@pytest.fixture
def failover() -> Iterator[Harness]:
    h = Harness(sub_type=SubType.Failover)
    yield h
    h.close()


@pytest.fixture
def exclusive() -> Iterator[Harness]:
    h = Harness(sub_type=SubType.Exclusive)
    yield h
    h.close()


def _disp(h: Harness) -> SingleActiveDispatcher:
    disp = h.sub.dispatcher
    assert isinstance(disp, SingleActiveDispatcher)
    return disp


def test_exclusive_refuses_a_second_consumer_and_sends_in_order(exclusive: Harness) -> None:
    h = exclusive
    sent = h.publish("a", "b", "c", "d", "e")
    h.join("one", 3)
    assert h.got("one") == sent[:3]
    with pytest.raises(BrokerError) as info:
        h.join("two", 5)
    assert info.value.code == ServerError.ConsumerBusy
    assert info.value.message == "Exclusive consumer is already connected"
    h.flow("one", 10)
    assert h.got("one") == sent
    more = h.publish("f")
    assert h.got("one") == sent + more
    # Exclusive tells nobody of an active consumer: that is Failover's.
    assert h.active_changes == []


def test_failover_makes_the_first_by_priority_then_name_active(failover: Harness) -> None:
    h = failover
    h.join("b", 0)
    assert _disp(h).active is h.consumers["b"]
    assert h.active_changes == [("b", True)]
    h.join("a", 0)
    # A change: everyone hears of it, in the order they joined.
    assert _disp(h).active is h.consumers["a"]
    assert h.active_changes[1:] == [("b", False), ("a", True)]
    h.join("c", 0)
    # No change: only the one that joined learns where it stands.
    assert h.active_changes[3:] == [("c", False)]
    h.join("z", 0, priority=-1)
    assert _disp(h).active is h.consumers["z"]
    h.leave("c")
    # A passive consumer leaving changes nothing and tells nobody.
    assert _disp(h).active is h.consumers["z"]
    assert h.active_changes[-1] == ("z", True)
    assert len(h.active_changes) == 8


def test_failover_on_partition_i_picks_the_i_mod_n_th_of_the_top_priority() -> None:
    h = Harness(sub_type=SubType.Failover)
    try:
        h.topic.name = SimTopicName("persistent://public/default/sim-partition-4", 4)
        h.join("c", 0)
        h.join("a", 0)
        h.join("low", 0, priority=1)
        h.join("b", 0)
        # Top priority: a, b, c; partition 4 mod 3 = 1: b. The lower priority one is not counted.
        assert _disp(h).active is h.consumers["b"]
        h.leave("b")
        # a, c: 4 mod 2 = 0: a.
        assert _disp(h).active is h.consumers["a"]
    finally:
        h.close()


def test_a_new_active_consumer_gets_everything_unacked_from_the_start(failover: Harness) -> None:
    h = failover
    sent = h.publish("k1", "k2", "k3", "k4")
    h.join("b", 10)
    assert h.got("b") == sent
    h.sub.acknowledge(h.consumers["b"], True, [AckItem(sent[0])])
    h.settle()
    h.join("a", 10)
    assert h.got("a") == sent[1:]
    # Only the active consumer's FLOW reads: b's permits bring it nothing.
    h.flow("b", 10)
    assert h.got("b") == sent
    h.leave("a")
    # The active one left: b takes over from the first unacked entry.
    assert h.got("b") == sent + sent[1:]


def test_redelivery_rewinds_for_the_active_consumer_only(failover: Harness) -> None:
    h = failover
    sent = h.publish("k1", "k2")
    h.join("a", 10)
    h.join("b", 10)
    disp = _disp(h)
    disp.redeliver(h.consumers["b"], None)
    h.settle()
    assert h.got("a") == sent and h.got("b") == []
    disp.redeliver(h.consumers["a"], None)
    h.settle()
    assert h.got("a") == sent + sent


def test_the_last_consumer_leaving_rewinds_for_the_next(exclusive: Harness) -> None:
    h = exclusive
    sent = h.publish("k1", "k2", "k3")
    h.join("one", 2)
    assert h.got("one") == sent[:2]
    h.leave("one")
    assert _disp(h).active is None
    h.join("two", 10)
    assert h.got("two") == sent


@pytest.mark.parametrize(("max_batch", "sizes"), [(100, [4, 8, 8]), (5, [4, 5, 5])])
def test_a_full_read_doubles_the_read_batch_up_to_the_max(max_batch: int, sizes: list[int]) -> None:
    config = BrokerConfig()
    config.dispatcherMinReadBatchSize = 2
    config.dispatcherMaxReadBatchSize = max_batch
    h = Harness(config, sub_type=SubType.Exclusive)
    try:
        sent = h.publish("k0", "k1", "k2")
        seen = []
        h.join("one", 1)  # asked 1 (its permits), got 1: a full read
        seen.append(_disp(h).read_batch_size)
        h.flow("one", 1)  # full again
        seen.append(_disp(h).read_batch_size)
        h.flow("one", 100)  # asked the whole batch, got the last entry: no growth
        seen.append(_disp(h).read_batch_size)
        assert seen == sizes
        assert h.got("one") == sent
    finally:
        h.close()


def test_a_dispatcher_without_a_consumer_reads_nothing(failover: Harness) -> None:
    disp = SingleActiveDispatcher(failover.sub, failover.loop, SubType.Failover)
    assert disp.active is None
    disp.read_more_now()
    assert not disp.have_pending_read


def test_a_throttled_read_waits_for_tokens_and_a_consumer_without_permits_arms_no_timer(
    exclusive: Harness,
) -> None:
    h = exclusive
    clock = h.loop.time
    h.sub.dispatch_throttle = DispatchThrottle(
        clock, lambda: (Rate(msgs=1), Rate()), SharedDispatchLimiters(clock), "sim"
    )
    sent = h.publish("k1", "k2", "k3")
    # One message a second: the three come one by one as the tokens refill, each read taking
    # one (a read of nothing while throttled would spin the loop).
    h.join("one", 3)
    assert h.got("one") == sent
    assert h.loop.time() >= 2.0
    # Permits used up: nothing to read, so no retry timer either (it would fire forever).
    assert not h.loop.has_timer()


def test_a_read_of_markers_only_sends_nothing_and_consumes_nothing(exclusive: Harness) -> None:
    h = exclusive
    # A replicated-subscription marker: acknowledged by dispatch, never delivered.
    h.ledger.add_entry(marker_entry(SnapshotRequest("s", "a"), publish_time_ms=1))
    consumer = h.join("one", 5)
    assert h.got("one") == []
    assert consumer.last_consumed_timestamp == 0 and consumer.msg_out_counter == 0
    sent = h.publish("k1")
    assert h.got("one") == sent and consumer.last_consumed_timestamp > 0
