"""Routing by key: Pulsar's KeySharedSubscriptionTest rows 1-7, 9, 14, 17, 18 (research §8).

Every scenario runs on both dispatchers (``impl``: PIP-379 and classic), as Pulsar runs them.
Rows 1, 2, 4 and 5 on non-persistent topics, which Pulsar also runs, are in
``test_nonpersistent_routing``.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pulsar
import pytest

from tests.integration.key_shared.helpers import (
    SUB,
    KeySharedEnv,
    range_slot,
    receive_and_check,
    receive_and_check_distribution,
    receive_in_threads,
    receive_none,
    value,
    wait_until,
)

pytestmark = pytest.mark.timeout(60)

NUMBER_OF_KEYS = 300
KEYS = [str(i) for i in range(10)]
STICKY_THIRDS = [(0, 20000), (20001, 40000), (40001, 65535)]


def send_all(producer: pulsar.Producer, items: list[tuple[int, dict[str, str]]]) -> None:
    """Send asynchronously (payload = the int), then flush; every send must succeed."""
    results: list[pulsar.Result] = []
    for v, kw in items:
        producer.send_async(str(v).encode(), lambda res, _mid: results.append(res), **kw)
    producer.flush()
    wait_until(lambda: len(results) == len(items), 10, "send receipts")
    assert all(r == pulsar.Result.Ok for r in results)


def three(env: KeySharedEnv, **kw: object) -> list[pulsar.Consumer]:
    return [env.consumer(f"c{i}", **kw) for i in (1, 2, 3)]  # type: ignore[arg-type]


def sticky_three(env: KeySharedEnv) -> list[pulsar.Consumer]:
    return [env.consumer(f"c{i + 1}", sticky=[r]) for i, r in enumerate(STICKY_THIRDS)]


def sticky_owner(slot: int) -> int:
    return next(i for i, (s, e) in enumerate(STICKY_THIRDS) if s <= slot <= e)


# --- row 1 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row01_auto_split_spreads_keys_and_keeps_affinity(env: KeySharedEnv, batch: bool) -> None:
    consumers = three(env)
    rng = random.Random(1)
    send_all(
        env.producer(batch),
        [(i, {"partition_key": str(rng.randrange(NUMBER_OF_KEYS))}) for i in range(1000)],
    )
    receive_and_check_distribution(consumers, 1000)


def test_row01_hash_range_auto_split_selector_ranges_and_routing(
    make_env: Callable[..., KeySharedEnv], impl: str
) -> None:
    """The auto-split selector (consistent hashing off): ranges as Pulsar computes them
    (new consumer takes the lower half of the biggest range) and routing by ``hash % 65536``."""
    env = make_env(impl, {"subscriptionKeySharedUseConsistentHashing": False})
    consumers = three(env)
    ranges = env.ranges()
    assert ranges == {"c3": [[0, 16384]], "c2": [[16385, 32768]], "c1": [[32769, 65536]]}
    rng = random.Random(2)
    send_all(
        env.producer(),
        [(i, {"partition_key": str(rng.randrange(NUMBER_OF_KEYS))}) for i in range(600)],
    )
    got: dict[int, list[str]] = defaultdict(list)

    def handle(i: int, c: pulsar.Consumer, msg: pulsar.Message) -> None:
        c.acknowledge(msg)
        got[i].append(msg.partition_key())

    receive_in_threads(consumers, handle)
    assert sum(len(v) for v in got.values()) == 600
    bounds = [(32769, 65536), (16385, 32768), (0, 16384)]
    for i, keys in got.items():
        lo, hi = bounds[i]
        for k in keys:
            assert lo <= range_slot(k.encode()) <= hi, (i, k)


# --- row 2 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row02_same_key_twice_forms_batches(env: KeySharedEnv, batch: bool) -> None:
    consumers = three(env)
    rng = random.Random(3)
    items = []
    for i in range(1000):
        key = str(rng.randrange(NUMBER_OF_KEYS))
        items += [(i, {"partition_key": key}), (i, {"partition_key": key})]
    send_all(env.producer(batch), items)
    receive_and_check_distribution(consumers, 2000)


# --- row 3 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row03_sticky_ranges_get_exactly_their_keys(env: KeySharedEnv, batch: bool) -> None:
    consumers = sticky_three(env)
    producer = env.producer(batch)
    expected = [0, 0, 0]
    for i in range(10):
        for key in KEYS:
            expected[sticky_owner(range_slot(key.encode()))] += 1
            producer.send(str(i).encode(), partition_key=key)
    receive_and_check(env, zip(consumers, expected, strict=True))


# --- row 4 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row04_survivor_gets_everything_after_others_close(env: KeySharedEnv, batch: bool) -> None:
    consumers = three(env)
    producer = env.producer(batch)
    rng = random.Random(4)
    send_all(
        producer, [(i, {"partition_key": str(rng.randrange(NUMBER_OF_KEYS))}) for i in range(1000)]
    )
    receive_and_check_distribution(consumers, 1000)
    consumers[0].close()
    consumers[1].close()
    send_all(
        producer, [(i, {"partition_key": str(rng.randrange(NUMBER_OF_KEYS))}) for i in range(10)]
    )
    receive_and_check_distribution(consumers[2:], 10)


# --- row 5 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row05_messages_without_key_are_spread(env: KeySharedEnv, batch: bool) -> None:
    consumers = three(env)
    # Un-keyed messages are routed by "producerName-sequenceId": a fixed producer name makes
    # the spread (checked to within 40% of even) the same on every run.
    producer = env.producer(batch, producer_name="row05-producer")
    for i in range(100):
        producer.send(str(i).encode())
    receive_and_check_distribution(consumers, 100)


# --- row 6 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row06_sticky_without_key_routes_by_producer_and_sequence(
    env: KeySharedEnv, batch: bool
) -> None:
    consumers = sticky_three(env)
    producer = env.producer(batch)
    expected = [0, 0, 0]
    for i in range(100):
        producer.send(str(i).encode(), sequence_id=i)
        fallback = f"{producer.producer_name()}-{i}".encode()
        expected[sticky_owner(range_slot(fallback))] += 1
    assert all(expected), expected
    receive_and_check(env, zip(consumers, expected, strict=True))


# --- row 7 -------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row07_ordering_key_routes_auto_split(env: KeySharedEnv, batch: bool) -> None:
    consumers = three(env)
    rng = random.Random(7)
    items = [
        (i, {"partition_key": "any key", "ordering_key": str(rng.randrange(NUMBER_OF_KEYS))})
        for i in range(1000)
    ]
    send_all(env.producer(batch), items)
    receive_and_check_distribution(consumers, 1000)


@pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])
def test_row07_ordering_key_routes_sticky(env: KeySharedEnv, batch: bool) -> None:
    consumers = sticky_three(env)
    producer = env.producer(batch)
    expected = [0, 0, 0]
    for i in range(10):
        for key in KEYS:
            expected[sticky_owner(range_slot(key.encode()))] += 1
            producer.send(str(i).encode(), partition_key="any key", ordering_key=key)
    receive_and_check(env, zip(consumers, expected, strict=True))


# --- row 8 -------------------------------------------------------------------------------------
def test_row08_key_shared_can_be_disabled(impl: str, make_env: Any) -> None:
    """subscriptionTypesEnabled without Key_Shared: subscribing is refused (NotAllowed) and
    nothing is created; the other types still subscribe."""
    env = make_env(impl, {"subscriptionTypesEnabled": "Exclusive,Shared,Failover"})
    with pytest.raises(pulsar.NotAllowedError):
        env.consumer("c1")
    status, subs = env.broker.admin("GET", env.path + "/subscriptions")
    assert status != 200 or SUB not in subs, subs
    shared = env.client.subscribe(env.topic, "shared-sub", consumer_type=pulsar.ConsumerType.Shared)
    env.producer().send(b"m")
    assert shared.receive(timeout_millis=5000).data() == b"m"


def test_row08_subscription_types_follow_topic_over_namespace_policy(env: KeySharedEnv) -> None:
    """The namespace and topic policies of Pulsar's admin API narrow the broker setting."""
    # A namespace of its own: the policy must not reach other tests' topics.
    tenant_ns = "public/types-" + env.topic.rsplit("-", 1)[1][:8]
    assert env.broker.admin("PUT", f"/admin/v2/namespaces/{tenant_ns}")[0] == 204
    env.topic = f"persistent://{tenant_ns}/t"
    other = env.topic + "-other"
    ns_path = f"/admin/v2/namespaces/{tenant_ns}/subscriptionTypesEnabled"
    topic_path = env.path + "/subscriptionTypesEnabled"
    env.producer().send(b"m")  # the topic exists
    try:
        assert env.broker.admin("POST", ns_path, ["Exclusive", "Shared"])[0] == 204
        assert sorted(env.broker.admin("GET", ns_path)[1]) == ["Exclusive", "Shared"]
        with pytest.raises(pulsar.NotAllowedError):
            env.consumer("c1")
        with pytest.raises(pulsar.NotAllowedError):
            env.consumer("c1", topic=other)
        # The topic's own policy wins over the namespace's, for that topic only.
        assert env.broker.admin("POST", topic_path, ["Key_Shared"])[0] == 204
        assert env.broker.admin("GET", topic_path)[1] == ["Key_Shared"]
        env.consumer("c1").close()
        with pytest.raises(pulsar.NotAllowedError):
            env.client.subscribe(env.topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
        with pytest.raises(pulsar.NotAllowedError):
            env.consumer("c1", topic=other)
        # Unknown type names are refused and change nothing.
        assert env.broker.admin("POST", topic_path, ["Key_Shared", "Nope"])[0] == 412
        assert env.broker.admin("GET", topic_path)[1] == ["Key_Shared"]
        assert env.broker.admin("DELETE", topic_path)[0] == 204
        assert env.broker.admin("GET", topic_path)[1] is None
        with pytest.raises(pulsar.NotAllowedError):
            env.consumer("c1")
    finally:
        assert env.broker.admin("DELETE", ns_path)[0] == 204
    assert env.broker.admin("GET", ns_path)[1] is None
    env.consumer("c1", topic=other).close()
    env.consumer("c2").close()


# --- row 9 -------------------------------------------------------------------------------------
def test_row09_cumulative_ack_is_refused(env: KeySharedEnv) -> None:
    producer = env.producer()
    consumer = env.consumer("c1")
    for i in range(10):
        producer.send(str(i).encode())
    for i in range(10):
        msg = consumer.receive(timeout_millis=5000)
        if i == 9:
            with pytest.raises(pulsar.CumulativeAcknowledgementNotAllowedError):
                consumer.acknowledge_cumulative(msg)


# --- row 14 ------------------------------------------------------------------------------------
def test_row14_sticky_range_conflicts_are_refused(env: KeySharedEnv) -> None:
    def subscribe(*ranges: tuple[int, int]) -> pulsar.Consumer:
        return env.consumer(sub="test", sticky=list(ranges))

    def consumers() -> int:
        return len(env.sub_stats("test")["consumers"])

    c1 = subscribe((0, 99), (400, 65535))
    c2 = subscribe((100, 399))
    assert c1.is_connected() and c2.is_connected()
    assert consumers() == 2
    for bad in [(0, 65535), (1, 1)]:
        with pytest.raises(pulsar.ConsumerAssignError):
            subscribe(bad)
    assert consumers() == 2
    c1.close()
    assert consumers() == 1
    for bad in [(0, 65535), (50, 100), (399, 500)]:
        with pytest.raises(pulsar.ConsumerAssignError):
            subscribe(bad)
    c3 = subscribe((400, 600))
    c4 = subscribe((50, 99))
    assert c3.is_connected() and c4.is_connected()
    assert consumers() == 3
    for c in (c2, c3, c4):
        c.close()
    assert consumers() == 0


# --- row 17 ------------------------------------------------------------------------------------
def test_row17_selector_changes_after_all_consumers_left(env: KeySharedEnv) -> None:
    c1 = env.consumer("first-consumer", sub="my-sub")
    assert env.sub_stats("my-sub")["keySharedMode"] == "AUTO_SPLIT"
    c1.close()
    c2 = env.consumer("second-consumer", sub="my-sub", sticky=[(0, 65535)])
    assert env.sub_stats("my-sub")["keySharedMode"] == "STICKY"
    c2.close()


def test_row17_allow_out_of_order_changes_after_all_consumers_left(env: KeySharedEnv) -> None:
    producer = env.producer()
    c1 = env.consumer(sub="my-sub", allow_ooo=True)
    producer.send(b"1")
    assert receive_none(c1, 5000) is not None
    assert env.sub_stats("my-sub")["allowOutOfOrderDelivery"] is True
    c1.close()
    c2 = env.consumer(sub="my-sub", allow_ooo=False)
    producer.send(b"2")
    assert receive_none(c2, 5000) is not None
    assert env.sub_stats("my-sub")["allowOutOfOrderDelivery"] is False
    c2.close()


# --- row 18 ------------------------------------------------------------------------------------
def test_row18_consumers_with_the_same_name(env: KeySharedEnv) -> None:
    c1, c2, c3 = (env.consumer("name", sub="my-sub") for _ in range(3))
    # Same name, different ring points (Pulsar #23327): three distinct range sets.
    ranges = [c["keyHashRangeArrays"] for c in env.sub_stats("my-sub")["consumers"]]
    assert len(ranges) == 3 and all(ranges)
    assert len({str(r) for r in ranges}) == 3
    producer = env.producer()
    for i in range(100):
        producer.send(str(i).encode(), partition_key=str(i))
    for _ in range(5):
        c1.receive(timeout_millis=5000)  # received, never acked
    c1.close()
    values: set[int] = set()

    def handle(_i: int, c: pulsar.Consumer, msg: pulsar.Message) -> None:
        c.acknowledge(msg)
        values.add(value(msg))

    receive_in_threads([c2, c3], handle, idle_ms=500)
    assert values == set(range(100))
