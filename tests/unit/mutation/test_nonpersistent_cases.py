"""Non-persistent dispatch, stepped by hand: what ``make mutate`` found no test saying of the
``dispatch.nonpersistent`` dispatchers (bench/results/mutation/report.md). The rules are Pulsar's
``broker/service/nonpersistent`` dispatchers; tests/unit/dispatch/test_nonpersistent_dispatch.py
holds the main cases."""

from __future__ import annotations

import pytest

from keyshared.broker.consumer import SubType
from keyshared.broker.dispatch.nonpersistent import (
    KeySharedDispatcher,
    SharedDispatcher,
    SingleActiveDispatcher,
    new_dispatcher,
)
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.nonpersistent_topic import np_consumer_stats
from keyshared.config import BrokerConfig
from tests.unit.dispatch.nonpersistent_support import ENTRY, FakeTransport, consumer, meta


def test_a_key_shared_consumer_without_key_shared_meta_is_auto_split() -> None:
    # Pulsar's ServerCnx gives a Key_Shared subscribe without keySharedMeta the AUTO_SPLIT meta.
    t = FakeTransport()
    bare = consumer("c1", 1000, t, sub_type=SubType.Key_Shared, mode=None)
    d = new_dispatcher(SubType.Key_Shared, bare, partition_index=-1, config=BrokerConfig())
    assert d.stats() == {"keySharedMode": "AUTO_SPLIT"}
    d.add_consumer(bare)
    auto = consumer("c2", 1000, t, sub_type=SubType.Key_Shared)
    assert d.fits(auto)
    d.add_consumer(auto)
    assert d.dispatch(ENTRY, meta()) in (bare, auto)

    sticky = KeySharedDispatcher("STICKY", BrokerConfig())
    sticky.add_consumer(
        consumer("s1", 1000, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(0, 9)])
    )
    with pytest.raises(BrokerError) as err:
        sticky.add_consumer(consumer("c3", 1000, t, sub_type=SubType.Key_Shared, mode=None))
    assert err.value.code is ServerError.ConsumerBusy
    assert err.value.message.endswith("cannot attach a AUTO_SPLIT consumer")


def test_a_key_shared_dispatcher_holds_exactly_its_attached_consumers() -> None:
    # The subscription lists (and counts in its stats) the dispatcher's consumers.
    t = FakeTransport()
    d = KeySharedDispatcher("AUTO_SPLIT", BrokerConfig())
    a = consumer("a", 1000, t, sub_type=SubType.Key_Shared)
    b = consumer("b", 1000, t, sub_type=SubType.Key_Shared)
    d.add_consumer(a)
    d.add_consumer(b)
    assert d.consumers == [a, b]
    d.remove_consumer(a)
    assert d.consumers == [b]
    d.remove_consumer(b)
    assert d.consumers == []


def test_exclusive_consumers_are_never_told_of_an_active_consumer_change() -> None:
    # Pulsar sends ACTIVE_CONSUMER_CHANGE to Failover consumers only.
    t = FakeTransport()
    d = SingleActiveDispatcher(SubType.Exclusive, -1)
    a = consumer("a", 1000, t, sub_type=SubType.Exclusive)
    d.add_consumer(a)
    assert d.active is a
    d.remove_consumer(a)
    d.add_consumer(consumer("b", 1000, t, sub_type=SubType.Exclusive))
    assert t.active == []


def test_failover_removing_an_inactive_consumer_tells_no_one() -> None:
    t = FakeTransport()
    d = SingleActiveDispatcher(SubType.Failover, -1)
    a, b = (
        consumer("a", 1000, t, sub_type=SubType.Failover),
        consumer("b", 1000, t, sub_type=SubType.Failover),
    )
    d.add_consumer(a)
    d.add_consumer(b)
    assert t.active == [("a", True), ("b", False)]
    d.remove_consumer(b)
    assert d.active is a
    assert t.active == [("a", True), ("b", False)]


def test_avg_messages_per_entry_follows_the_batches_sent() -> None:
    # Pulsar's Consumer.sendMessages moves avgMessagesPerEntry toward messages / entries sent.
    t = FakeTransport()
    d = SharedDispatcher()
    c = consumer("c", 10_000, t)
    d.add_consumer(c)
    assert np_consumer_stats(c)["avgMessagesPerEntry"] == 1
    for _ in range(40):
        assert d.dispatch(ENTRY, meta(messages=10)) is c
    assert np_consumer_stats(c)["avgMessagesPerEntry"] == 10
    assert np_consumer_stats(c)["msgOutCounter"] == 400


def test_a_non_persistent_message_goes_out_as_a_first_delivery() -> None:
    # Nothing is redelivered on a non-persistent topic: every MESSAGE has redelivery count 0.
    t = FakeTransport()
    for d in (SharedDispatcher(), SingleActiveDispatcher(SubType.Failover, -1)):
        d.add_consumer(consumer("c", 1000, t, sub_type=d.sub_type))
        for _ in range(3):
            d.dispatch(ENTRY, meta())
    assert len(t.outbound) == 6
    assert [m.redelivery_count for m in t.outbound] == [0] * 6
    assert all(m.entry is ENTRY and m.ack_set is None for m in t.outbound)
