"""Non-persistent dispatch decisions: who gets a message at publish time, and what is dropped.

The rules are Pulsar's ``..svc/nonpersistent`` dispatchers (see ``dispatch.nonpersistent``):
a consumer with permits and a writable connection receives, anything else drops, and nothing is
kept for later.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from keyshared.broker.consumer import Consumer, SubType
from keyshared.broker.dispatch.base import LoopScheduler
from keyshared.broker.dispatch.nonpersistent import (
    KeySharedDispatcher,
    SharedDispatcher,
    SingleActiveDispatcher,
    new_dispatcher,
    pick_active,
)
from keyshared.broker.entry_meta import parse_entry_meta
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.nonpersistent_topic import NonPersistentTopic, NonPersistentTopics
from keyshared.broker.policies import PolicyService
from keyshared.broker.rate_limits import BrokerRateLimits
from keyshared.broker.topic import Producer
from keyshared.broker.topic_name import TopicName
from keyshared.config import BrokerConfig
from keyshared.protocol import pb
from keyshared.protocol.metadata import encode_payload_section
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.position import Position
from tests.unit.dispatch.nonpersistent_support import ENTRY, FakeTransport, consumer, meta


def receivers(t: FakeTransport) -> list[str]:
    return [c.consumer_name for c, _ in t.sent]


# --- Shared ---------------------------------------------------------------------------------------
def test_shared_round_robin_skips_consumers_without_permits_and_drops_when_none_has_any() -> None:
    t = FakeTransport()
    d = SharedDispatcher()
    a, b, c = consumer("a", 2, t), consumer("b", 0, t), consumer("c", 1, t)
    for x in (a, b, c):
        d.add_consumer(x)
    for _ in range(5):
        d.dispatch(ENTRY, meta())
    assert receivers(t) == ["a", "c", "a"]
    assert d.msg_drop_counter == 2
    assert (a.available_permits, b.available_permits, c.available_permits) == (0, 0, 0)


def test_shared_prefers_the_best_priority_level_that_has_permits() -> None:
    t = FakeTransport()
    d = SharedDispatcher()
    low = consumer("low", 5, t, priority=1)
    high1, high2 = consumer("h1", 1, t, priority=0), consumer("h2", 1, t, priority=0)
    for x in (low, high1, high2):
        d.add_consumer(x)
    for _ in range(4):
        d.dispatch(ENTRY, meta())
    assert receivers(t) == ["h1", "h2", "low", "low"]


def test_a_batch_costs_its_messages_and_goes_out_while_any_permit_is_left() -> None:
    t = FakeTransport()
    d = SharedDispatcher()
    a = consumer("a", 3, t)
    d.add_consumer(a)
    d.dispatch(ENTRY, meta(messages=2))
    d.dispatch(ENTRY, meta(messages=5))  # one permit left: Pulsar sends the whole batch
    d.dispatch(ENTRY, meta(messages=4))
    assert receivers(t) == ["a", "a"]
    assert a.available_permits == -4
    assert a.msg_out_counter == 7
    assert d.msg_drop_counter == 4


def test_a_consumer_whose_connection_is_full_gets_nothing() -> None:
    full, ok = FakeTransport(), FakeTransport()
    full.writable = False
    d = SharedDispatcher()
    d.add_consumer(consumer("full", 10, full))
    d.add_consumer(consumer("ok", 10, ok))
    for _ in range(3):
        d.dispatch(ENTRY, meta())
    assert not full.sent
    assert receivers(ok) == ["ok"] * 3


# --- Exclusive / Failover -----------------------------------------------------------------------
def test_exclusive_refuses_a_second_consumer_and_drops_without_permits() -> None:
    t = FakeTransport()
    d = SingleActiveDispatcher(SubType.Exclusive, -1)
    a = consumer("a", 1, t, sub_type=SubType.Exclusive)
    d.add_consumer(a)
    with pytest.raises(BrokerError) as err:
        d.add_consumer(consumer("b", 1, t, sub_type=SubType.Exclusive))
    assert err.value.code is ServerError.ConsumerBusy
    d.dispatch(ENTRY, meta())
    d.dispatch(ENTRY, meta(messages=3))
    assert receivers(t) == ["a"]
    assert d.msg_drop_counter == 3


def test_failover_sends_only_to_the_active_consumer_even_when_it_has_no_permits() -> None:
    t = FakeTransport()
    d = SingleActiveDispatcher(SubType.Failover, -1)
    b = consumer("b", 5, t, sub_type=SubType.Failover)
    a = consumer("a", 0, t, sub_type=SubType.Failover)
    d.add_consumer(b)
    d.add_consumer(a)  # "a" sorts first: it becomes active, and both are told
    assert d.active is a
    assert t.active == [("b", True), ("b", False), ("a", True)]
    d.dispatch(ENTRY, meta())
    assert not t.sent and d.msg_drop_counter == 1
    d.remove_consumer(a)
    assert d.active is b
    d.dispatch(ENTRY, meta())
    assert receivers(t) == ["b"]


def test_failover_partition_i_picks_the_i_mod_n_th_consumer_of_the_best_level() -> None:
    t = FakeTransport()
    cs = [consumer(n, 1, t, sub_type=SubType.Failover) for n in ("c", "a", "b")]
    cs.append(consumer("z", 1, t, sub_type=SubType.Failover, priority=1))
    assert [pick_active(cs, i).consumer_name for i in range(4)] == ["a", "b", "c", "a"]  # type: ignore[union-attr]
    assert pick_active([], 0) is None


# --- Key_Shared ---------------------------------------------------------------------------------
def key_shared(mode: str = "AUTO_SPLIT", **conf: Any) -> KeySharedDispatcher:
    return KeySharedDispatcher(mode, BrokerConfig(**conf))


@pytest.mark.parametrize("consistent", [True, False], ids=["consistent", "autosplit"])
def test_key_shared_routes_each_key_to_its_owner_only(consistent: bool) -> None:
    t = FakeTransport()
    d = key_shared(subscriptionKeySharedUseConsistentHashing=consistent)
    for n in ("c1", "c2", "c3"):
        d.add_consumer(consumer(n, 10_000, t, sub_type=SubType.Key_Shared))
    owners: dict[str, set[str]] = {}
    for i in range(3000):
        key = f"key-{i % 300}"
        got = d.dispatch(ENTRY, meta(key))
        assert got is not None
        owners.setdefault(key, set()).add(got.consumer_name)
    assert all(len(v) == 1 for v in owners.values())
    per = {n: sum(1 for v in owners.values() if n in v) for n in ("c1", "c2", "c3")}
    assert all(per.values()), per
    assert d.msg_drop_counter == 0


def test_key_shared_drops_when_the_owner_has_no_permits_even_if_others_have() -> None:
    t = FakeTransport()
    d = key_shared()
    full = consumer("c1", 0, t, sub_type=SubType.Key_Shared)
    other = consumer("c2", 1000, t, sub_type=SubType.Key_Shared)
    d.add_consumer(full)
    d.add_consumer(other)
    keys = [f"k{i}" for i in range(200)]
    full_keys = [k for k in keys if d.selector.select(d.slot_of(meta(k))) is full]
    assert full_keys
    for k in keys:
        d.dispatch(ENTRY, meta(k, messages=2))
    assert d.msg_drop_counter == 2 * len(full_keys)
    assert len(t.sent) == len(keys) - len(full_keys)
    assert {c.consumer_name for c, _ in t.sent} == {"c2"}


def test_key_shared_hashes_move_at_once_when_the_owner_leaves() -> None:
    t = FakeTransport()
    d = key_shared()
    a = consumer("c1", 100, t, sub_type=SubType.Key_Shared)
    b = consumer("c2", 100, t, sub_type=SubType.Key_Shared)
    d.add_consumer(a)
    d.add_consumer(b)
    key = next(f"k{i}" for i in range(1000) if d.select(meta(f"k{i}")) is a)
    d.remove_consumer(a)
    assert d.dispatch(ENTRY, meta(key)) is b


def test_key_shared_sticky_gap_drops_and_conflict_is_refused() -> None:
    t = FakeTransport()
    d = key_shared("STICKY")
    d.add_consumer(
        consumer("c1", 100, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(0, 100)])
    )
    with pytest.raises(BrokerError) as err:
        d.add_consumer(
            consumer("c2", 100, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(50, 60)])
        )
    assert err.value.code is ServerError.ConsumerAssignError
    assert len(d.consumers) == 1
    inside = next(k for k in (f"k{i}" for i in range(100_000)) if d.slot_of(meta(k)) <= 100)
    outside = next(k for k in (f"k{i}" for i in range(1000)) if d.slot_of(meta(k)) > 100)
    assert d.dispatch(ENTRY, meta(inside)) is not None
    assert d.dispatch(ENTRY, meta(outside)) is None
    assert d.msg_drop_counter == 1


def test_key_shared_refuses_another_mode_while_consumers_are_attached() -> None:
    t = FakeTransport()
    d = key_shared()
    first = consumer("c1", 1, t, sub_type=SubType.Key_Shared)
    d.add_consumer(first)
    sticky = consumer("c2", 1, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(0, 9)])
    with pytest.raises(BrokerError) as err:
        d.add_consumer(sticky)
    assert err.value.code is ServerError.ConsumerBusy
    assert not d.fits(sticky) and d.fits(first)
    assert isinstance(
        new_dispatcher(SubType.Key_Shared, sticky, partition_index=-1, config=BrokerConfig()),
        KeySharedDispatcher,
    )


# --- the topic: receipt first, then one offer per subscription ----------------------------------
def entry_bytes(key: str, batch: int = 0) -> bytes:
    md = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1, partition_key=key)
    if batch:
        md.num_messages_in_batch = batch
    return encode_payload_section(md, b"payload")


def new_topic() -> NonPersistentTopic:
    config = BrokerConfig()
    policies = PolicyService(MetadataStore(":memory:"), config)
    service: Any = SimpleNamespace(
        config=config,
        partitions_of=lambda _name: 0,
        namespace_exists=lambda _ns: True,
        policies=policies,
        rate_limits=BrokerRateLimits(config, policies, LoopScheduler()),
    )
    registry = NonPersistentTopics(service)
    return registry.get(TopicName.parse("non-persistent://public/default/t"), create=True)


def test_publish_confirms_with_0_0_and_offers_the_entry_to_every_subscription() -> None:
    topic = new_topic()
    t = FakeTransport()

    def join(sub: str, name: str, sub_type: SubType, permits: int) -> Consumer:
        def factory(s: Any) -> Consumer:
            c = consumer(name, permits, t, sub_type=sub_type)
            c.subscription = s
            return c

        return topic.subscribe(
            factory,
            subscription=sub,
            sub_type=sub_type,
            durable=True,
            initial_position_earliest=True,
            start_message_id=None,
        )

    join("shared", "s1", SubType.Shared, 10)
    join("excl", "e1", SubType.Exclusive, 0)
    producer = Producer(producer_id=1, producer_name="p", topic=topic, transport=FakeTransport())  # type: ignore[arg-type]
    topic.add_producer(producer)
    receipts: list[tuple[Position | None, BaseException | None]] = []
    topic.publish(producer, 1, 1, entry_bytes("k", batch=3), lambda p, e: receipts.append((p, e)))
    assert receipts == [(Position(0, 0), None)]
    assert receivers(t) == ["s1"]
    st = topic.stats()
    assert st["msgInCounter"] == 3 and st["msgOutCounter"] == 3
    assert st["subscriptions"]["excl"]["msgDropRate"] > 0
    assert st["subscriptions"]["shared"]["msgDropRate"] == 0
    assert st["subscriptions"]["excl"]["type"] == "Exclusive"
    assert parse_entry_meta(t.sent[0][1]).num_messages == 3


def test_an_idle_topic_is_forgotten_and_a_reader_subscription_goes_with_its_consumer() -> None:
    topic = new_topic()
    registry = topic._registry
    t = FakeTransport()

    def factory(s: Any) -> Consumer:
        c = consumer("r", 1, t, sub_type=SubType.Exclusive)
        c.subscription = s
        return c

    c = topic.subscribe(
        factory,
        subscription="reader-1",
        sub_type=SubType.Exclusive,
        durable=False,
        initial_position_earliest=False,
        start_message_id=None,
    )
    assert registry.loaded(topic.name) is topic
    c.subscription.remove_consumer(c)
    assert not topic.subscriptions
    assert registry.loaded(topic.name) is None


# --- what make mutate found unpinned (bench/results/mutation/report.md) -------------------------
def test_a_closed_dispatcher_drops_and_counts_every_message() -> None:
    t = FakeTransport()
    for d in (SharedDispatcher(), key_shared(), SingleActiveDispatcher(SubType.Failover, -1)):
        sub_type = d.sub_type
        d.add_consumer(consumer("a", 100, t, sub_type=sub_type))
        d.close()
        assert d.dispatch(ENTRY, meta(messages=3)) is None
        assert d.msg_drop_counter == 3
    assert not t.sent


def test_a_single_active_dispatcher_without_a_consumer_drops() -> None:
    d = SingleActiveDispatcher(SubType.Exclusive, -1)
    assert d.active is None
    assert d.dispatch(ENTRY, meta()) is None and d.msg_drop_counter == 1


def test_exclusive_refusal_says_a_consumer_is_connected() -> None:
    t = FakeTransport()
    d = SingleActiveDispatcher(SubType.Exclusive, -1)
    d.add_consumer(consumer("a", 1, t, sub_type=SubType.Exclusive))
    with pytest.raises(BrokerError) as err:
        d.add_consumer(consumer("b", 1, t, sub_type=SubType.Exclusive))
    assert err.value.message == "Exclusive consumer is already connected"


def test_failover_tells_a_joiner_that_does_not_take_over_that_it_is_inactive() -> None:
    t = FakeTransport()
    d = SingleActiveDispatcher(SubType.Failover, -1)
    d.add_consumer(consumer("a", 1, t, sub_type=SubType.Failover))
    d.add_consumer(consumer("b", 1, t, sub_type=SubType.Failover))
    assert t.active == [("a", True), ("b", False)]


def test_a_dispatcher_fits_consumers_of_its_type_only() -> None:
    t = FakeTransport()
    d = SharedDispatcher()
    assert d.fits(consumer("s", 1, t))
    assert not d.fits(consumer("f", 1, t, sub_type=SubType.Failover))


def test_key_shared_stats_show_the_mode_and_each_consumers_ranges() -> None:
    t = FakeTransport()
    d = key_shared("STICKY")
    c = consumer("c", 1, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(0, 9), (20, 29)])
    d.add_consumer(c)
    assert d.stats() == {"keySharedMode": "STICKY"}
    assert d.consumer_stats(c) == {
        "keyHashRangeArrays": [[0, 9], [20, 29]],
        "keyHashRanges": ["[0, 9]", "[20, 29]"],
    }
    other = consumer("o", 1, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(40, 49)])
    assert d.consumer_stats(other) == {"keyHashRangeArrays": [], "keyHashRanges": []}
    assert SharedDispatcher().stats() == {} and SharedDispatcher().consumer_stats(c) == {}


def test_shared_round_robin_goes_to_the_next_consumer_each_time() -> None:
    t = FakeTransport()
    d = SharedDispatcher()
    for n in ("a", "b", "c"):
        d.add_consumer(consumer(n, 10, t))
    for _ in range(7):
        d.dispatch(ENTRY, meta())
    assert receivers(t) == ["a", "b", "c", "a", "b", "c", "a"]


def test_key_shared_refusals_say_why() -> None:
    t = FakeTransport()
    d = key_shared()
    d.add_consumer(consumer("c1", 1, t, sub_type=SubType.Key_Shared))
    sticky = consumer("c2", 1, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(0, 9)])
    with pytest.raises(BrokerError) as err:
        d.add_consumer(sticky)
    assert err.value.message == (
        "Subscription is of key_shared mode AUTO_SPLIT, cannot attach a STICKY consumer"
    )
    s = key_shared("STICKY")
    s.add_consumer(sticky)
    with pytest.raises(BrokerError) as err:
        s.add_consumer(
            consumer("c3", 1, t, sub_type=SubType.Key_Shared, mode="STICKY", ranges=[(5, 6)])
        )
    assert err.value.message == "Range conflict with consumer c2"
