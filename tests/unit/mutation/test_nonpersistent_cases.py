"""Non-persistent dispatch, stepped by hand: what ``make mutate`` found no test saying of the
``dispatch.nonpersistent`` dispatchers (bench/results/mutation/report.md). The rules are Pulsar's
``broker/service/nonpersistent`` dispatchers; tests/unit/dispatch/test_nonpersistent_dispatch.py
holds the main cases."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType
from keyshared.broker.dispatch.nonpersistent import (
    KeySharedDispatcher,
    SharedDispatcher,
    SingleActiveDispatcher,
    new_dispatcher,
)
from keyshared.broker.entry_meta import EntryMeta
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.nonpersistent_topic import MESSAGE_ID, np_consumer_stats
from keyshared.config import BrokerConfig
from keyshared.protocol import sticky_key_hash
from keyshared.storage.entry import Entry


class Transport:
    """Records the messages written and the active-consumer changes told."""

    address = "/127.0.0.1:1"
    client_version = "test"

    def __init__(self) -> None:
        self.sent: list[tuple[str, OutboundMessage]] = []
        self.active: list[tuple[str, bool]] = []

    def send_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        self.sent += [(consumer.consumer_name, m) for m in messages]

    def close_consumer(self, consumer: Consumer) -> None:
        pass

    def active_consumer_change(self, consumer: Consumer, is_active: bool) -> None:
        self.active.append((consumer.consumer_name, is_active))

    def is_writable(self) -> bool:
        return True


def _consumer(
    name: str,
    t: Transport,
    sub_type: SubType,
    *,
    permits: int = 1000,
    key_shared_meta: KeySharedMeta | None = None,
) -> Consumer:
    c = Consumer(
        consumer_id=len(name),
        consumer_name=name,
        subscription=SimpleNamespace(dispatcher=None),  # type: ignore[arg-type]
        sub_type=sub_type,
        transport=t,
        key_shared_meta=key_shared_meta,
    )
    c.add_permits(permits)
    return c


def _meta(messages: int = 1, key: str = "k") -> EntryMeta:
    return EntryMeta(messages, sticky_key_hash(key.encode()), 0, 0, 0)


ENTRY = Entry(MESSAGE_ID, b"x", 0)


def test_a_key_shared_consumer_without_key_shared_meta_is_auto_split() -> None:
    # Pulsar's ServerCnx gives a Key_Shared subscribe without keySharedMeta the AUTO_SPLIT meta.
    t = Transport()
    bare = _consumer("c1", t, SubType.Key_Shared)
    d = new_dispatcher(SubType.Key_Shared, bare, partition_index=-1, config=BrokerConfig())
    assert d.stats() == {"keySharedMode": "AUTO_SPLIT"}
    d.add_consumer(bare)
    auto = _consumer("c2", t, SubType.Key_Shared, key_shared_meta=KeySharedMeta("AUTO_SPLIT"))
    assert d.fits(auto)
    d.add_consumer(auto)
    assert d.dispatch(ENTRY, _meta()) in (bare, auto)

    sticky = KeySharedDispatcher("STICKY", BrokerConfig())
    sticky.add_consumer(
        _consumer("s1", t, SubType.Key_Shared, key_shared_meta=KeySharedMeta("STICKY", [(0, 9)]))
    )
    with pytest.raises(BrokerError) as err:
        sticky.add_consumer(_consumer("c3", t, SubType.Key_Shared))
    assert err.value.code is ServerError.ConsumerBusy
    assert err.value.message.endswith("cannot attach a AUTO_SPLIT consumer")


def test_a_key_shared_dispatcher_holds_exactly_its_attached_consumers() -> None:
    # The subscription lists (and counts in its stats) the dispatcher's consumers.
    t = Transport()
    d = KeySharedDispatcher("AUTO_SPLIT", BrokerConfig())
    a = _consumer("a", t, SubType.Key_Shared, key_shared_meta=KeySharedMeta("AUTO_SPLIT"))
    b = _consumer("b", t, SubType.Key_Shared, key_shared_meta=KeySharedMeta("AUTO_SPLIT"))
    d.add_consumer(a)
    d.add_consumer(b)
    assert d.consumers == [a, b]
    d.remove_consumer(a)
    assert d.consumers == [b]
    d.remove_consumer(b)
    assert d.consumers == []


def test_exclusive_consumers_are_never_told_of_an_active_consumer_change() -> None:
    # Pulsar sends ACTIVE_CONSUMER_CHANGE to Failover consumers only.
    t = Transport()
    d = SingleActiveDispatcher(SubType.Exclusive, -1)
    a = _consumer("a", t, SubType.Exclusive)
    d.add_consumer(a)
    assert d.active is a
    d.remove_consumer(a)
    d.add_consumer(_consumer("b", t, SubType.Exclusive))
    assert t.active == []


def test_failover_removing_an_inactive_consumer_tells_no_one() -> None:
    t = Transport()
    d = SingleActiveDispatcher(SubType.Failover, -1)
    a, b = _consumer("a", t, SubType.Failover), _consumer("b", t, SubType.Failover)
    d.add_consumer(a)
    d.add_consumer(b)
    assert t.active == [("a", True), ("b", False)]
    d.remove_consumer(b)
    assert d.active is a
    assert t.active == [("a", True), ("b", False)]


def test_avg_messages_per_entry_follows_the_batches_sent() -> None:
    # Pulsar's Consumer.sendMessages moves avgMessagesPerEntry toward messages / entries sent.
    t = Transport()
    d = SharedDispatcher()
    c = _consumer("c", t, SubType.Shared, permits=10_000)
    d.add_consumer(c)
    assert np_consumer_stats(c)["avgMessagesPerEntry"] == 1
    for _ in range(40):
        assert d.dispatch(ENTRY, _meta(messages=10)) is c
    assert np_consumer_stats(c)["avgMessagesPerEntry"] == 10
    assert np_consumer_stats(c)["msgOutCounter"] == 400


def test_a_non_persistent_message_goes_out_as_a_first_delivery() -> None:
    # Nothing is redelivered on a non-persistent topic: every MESSAGE has redelivery count 0.
    t = Transport()
    for d in (SharedDispatcher(), SingleActiveDispatcher(SubType.Failover, -1)):
        d.add_consumer(_consumer("c", t, d.sub_type))
        for _ in range(3):
            d.dispatch(ENTRY, _meta())
    assert len(t.sent) == 6
    assert [m.redelivery_count for _, m in t.sent] == [0] * 6
    assert all(m.entry is ENTRY and m.ack_set is None for _, m in t.sent)
