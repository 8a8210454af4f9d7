"""Pulsar's KeySharedSubscriptionTest rows 1, 2, 4 and 5 on ``non-persistent://`` topics.

Pulsar runs these rows on persistent and non-persistent topics, with batching off and on, for
both Key_Shared implementations (``impl``: PIP-379 and classic; a non-persistent subscription
uses the same dispatcher under either, as in Pulsar). A non-persistent topic delivers a message
only to a consumer that has permits when it is published, so each scenario first waits until
every consumer's first FLOW has reached the broker; after that nothing may be dropped.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

import pulsar
import pytest

from tests.integration.key_shared.helpers import (
    SUB,
    KeySharedEnv,
    consistent_slot,
    owner_by_ranges,
    receive_and_check_distribution,
    wait_until,
)
from tests.integration.key_shared.test_routing import NUMBER_OF_KEYS, send_all, three

pytestmark = pytest.mark.timeout(60)

BATCH = pytest.mark.parametrize("batch", [False, True], ids=["nobatch", "keybatch"])


@pytest.fixture
def np_env(env: KeySharedEnv) -> KeySharedEnv:
    """``env`` on a fresh non-persistent topic."""
    env.topic = f"non-persistent://public/default/ks-np-{uuid.uuid4().hex}"
    return env


def np_stats(env: KeySharedEnv) -> dict[str, Any]:
    path = "/admin/v2/non-persistent/" + env.topic[len("non-persistent://") :] + "/stats"
    status, body = env.broker.admin("GET", path)
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def ready(env: KeySharedEnv, n: int) -> None:
    """Wait until ``n`` consumers have permits (messages before that would be dropped)."""

    def all_have_permits() -> bool:
        consumers = np_stats(env)["subscriptions"][SUB]["consumers"]
        return len(consumers) == n and all(c["availablePermits"] > 0 for c in consumers)

    wait_until(all_have_permits, 10, f"{n} consumers with permits")


def keyed(rng: random.Random, n: int) -> list[tuple[int, dict[str, str]]]:
    return [(i, {"partition_key": str(rng.randrange(NUMBER_OF_KEYS))}) for i in range(n)]


def assert_nothing_dropped(env: KeySharedEnv, sent: int) -> None:
    st = np_stats(env)
    sub = st["subscriptions"][SUB]
    assert st["msgInCounter"] == sent
    assert sub["msgOutCounter"] == sent, sub
    assert sub["msgDropRate"] == 0.0
    assert sub["type"] == "Key_Shared" and sub["msgBacklog"] == 0


# --- row 1 -------------------------------------------------------------------------------------
@BATCH
def test_row01_nonpersistent_auto_split_spreads_keys_and_keeps_affinity(
    np_env: KeySharedEnv, batch: bool
) -> None:
    consumers = three(np_env)
    ready(np_env, 3)
    send_all(np_env.producer(batch), keyed(random.Random(1), 1000))
    receive_and_check_distribution(consumers, 1000)
    assert_nothing_dropped(np_env, 1000)
    consumer_stats = np_stats(np_env)["subscriptions"][SUB]["consumers"]
    ranges = {c["consumerName"]: c["keyHashRangeArrays"] for c in consumer_stats}
    assert sorted(ranges) == ["c1", "c2", "c3"] and all(ranges.values())


# --- row 2 -------------------------------------------------------------------------------------
@BATCH
def test_row02_nonpersistent_same_key_twice(np_env: KeySharedEnv, batch: bool) -> None:
    consumers = three(np_env)
    ready(np_env, 3)
    rng = random.Random(3)
    items = []
    for i in range(1000):
        key = str(rng.randrange(NUMBER_OF_KEYS))
        items += [(i, {"partition_key": key}), (i, {"partition_key": key})]
    send_all(np_env.producer(batch), items)
    receive_and_check_distribution(consumers, 2000)
    assert_nothing_dropped(np_env, 2000)


# --- row 4 -------------------------------------------------------------------------------------
@BATCH
def test_row04_nonpersistent_survivor_gets_everything(np_env: KeySharedEnv, batch: bool) -> None:
    consumers = three(np_env)
    ready(np_env, 3)
    producer = np_env.producer(batch)
    rng = random.Random(4)
    send_all(producer, keyed(rng, 1000))
    receive_and_check_distribution(consumers, 1000)
    consumers[0].close()
    consumers[1].close()
    ready(np_env, 1)
    send_all(producer, keyed(rng, 10))
    receive_and_check_distribution(consumers[2:], 10)
    assert_nothing_dropped(np_env, 1010)


# --- row 5 -------------------------------------------------------------------------------------
@BATCH
def test_row05_nonpersistent_messages_without_key_are_spread(
    np_env: KeySharedEnv, batch: bool
) -> None:
    consumers = three(np_env)
    ready(np_env, 3)
    # The name of row 5 in test_routing: its spread is within 40% of even on every run.
    producer = np_env.producer(batch, producer_name="row05-producer")
    for i in range(100):
        producer.send(str(i).encode())
    receive_and_check_distribution(consumers, 100)
    assert_nothing_dropped(np_env, 100)


def test_a_key_whose_owner_has_no_room_is_dropped_not_rerouted(np_env: KeySharedEnv) -> None:
    """Pulsar's NonPersistentStickyKeyDispatcherMultipleConsumers: the selected consumer gets
    the message if it has permits, else it is dropped; no other consumer takes the key."""
    full = np_env.consumer("full", queue=1)
    roomy = np_env.consumer("roomy", queue=1000)
    ready(np_env, 2)
    consumers = np_stats(np_env)["subscriptions"][SUB]["consumers"]
    owned = {c["consumerName"]: c["keyHashRangeArrays"] for c in consumers}
    keys = [f"k{i}" for i in range(200)]
    full_keys = [k for k in keys if owner_by_ranges(consistent_slot(k.encode()), owned) == "full"]
    assert 1 < len(full_keys) < len(keys)
    producer = np_env.producer()
    send_all(producer, [(i, {"partition_key": k}) for i, k in enumerate(keys)])
    got_roomy = []
    while (m := _receive(roomy, 300)) is not None:
        got_roomy.append(m.partition_key())
    assert sorted(got_roomy) == sorted(set(keys) - set(full_keys))
    first = _receive(full, 1000)
    assert first is not None and first.partition_key() == full_keys[0]
    sub = np_stats(np_env)["subscriptions"][SUB]
    assert sub["msgOutCounter"] == len(keys) - len(full_keys) + 1
    assert sub["msgDropRate"] > 0


def _receive(consumer: pulsar.Consumer, timeout_ms: int) -> pulsar.Message | None:
    try:
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None
