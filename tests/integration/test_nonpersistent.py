"""Non-persistent topics end to end with the official client.

What a Pulsar user expects of ``non-persistent://`` topics: sends are confirmed at once with id
``0:0``; a message reaches the consumers that have permits when it is published and is dropped
(``msgDropRate``) for a subscription whose consumers have no room; nothing is stored, so a
consumer never sees what was published before it came and a restart keeps nothing but
partitioned-topic metadata; acks and seek are accepted and do nothing; the last message id is
refused.
"""

from __future__ import annotations

import re
import threading
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client

pytestmark = pytest.mark.timeout(60)

NS = "public/default"


def new_topic() -> str:
    return f"non-persistent://{NS}/np-{uuid.uuid4().hex[:12]}"


def admin_path(topic: str) -> str:
    return "/admin/v2/non-persistent/" + topic[len("non-persistent://") :]


def stats(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    status, body = broker.admin("GET", admin_path(topic) + "/stats")
    assert status == 200, body
    assert isinstance(body, dict)
    return body


def wait_until(pred: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def wait_permits(broker: BrokerProcess, topic: str, sub: str, n: int = 1) -> None:
    """Wait until ``n`` consumers of ``sub`` have permits: earlier messages would be dropped."""

    def ok() -> bool:
        subs = stats(broker, topic)["subscriptions"]
        consumers = subs.get(sub, {}).get("consumers", [])
        return sum(1 for c in consumers if c["availablePermits"] > 0) >= n

    wait_until(ok, what=f"{n} consumers of {sub} with permits")


def receive_none(consumer: pulsar.Consumer, timeout_ms: int) -> pulsar.Message | None:
    try:
        return consumer.receive(timeout_millis=timeout_ms)
    except pulsar.Timeout:
        return None


def metrics(broker: BrokerProcess, topic: str) -> dict[tuple[str, str], float]:
    """``/metrics`` series of ``topic``: (name, subscription or "") -> value."""
    with urllib.request.urlopen(broker.web_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("#") or f'topic="{topic}"' not in line:
            continue
        name, _, rest = line.partition("{")
        labels, _, value = rest.rpartition("} ")
        sub = re.search(r'subscription="([^"]*)"', labels)
        out[(name, sub.group(1) if sub else "")] = float(value)
    return out


TYPES = {
    "exclusive": pulsar.ConsumerType.Exclusive,
    "failover": pulsar.ConsumerType.Failover,
    "shared": pulsar.ConsumerType.Shared,
    "key_shared": pulsar.ConsumerType.KeyShared,
}
STATS_TYPE = {"exclusive": "Exclusive", "failover": "Failover", "shared": "Shared"}
STATS_TYPE["key_shared"] = "Key_Shared"


@pytest.mark.parametrize("kind", list(TYPES))
def test_each_subscription_type_receives_what_is_published_while_it_listens(
    broker: BrokerProcess, client: pulsar.Client, kind: str
) -> None:
    topic = new_topic()
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"before")  # no subscription yet: gone
    consumer = client.subscribe(topic, "sub", consumer_type=TYPES[kind])
    wait_permits(broker, topic, "sub")
    ids = [producer.send(f"m{i}".encode(), partition_key=f"k{i % 3}") for i in range(20)]
    assert {(m.ledger_id(), m.entry_id()) for m in ids} == {(0, 0)}
    got = []
    for _ in range(20):
        msg = consumer.receive(timeout_millis=5000)
        consumer.acknowledge(msg)
        got.append(msg.data().decode())
    assert got == [f"m{i}" for i in range(20)]
    assert receive_none(consumer, 200) is None
    st = stats(broker, topic)
    sub = st["subscriptions"]["sub"]
    assert st["msgInCounter"] == 21 and st["msgOutCounter"] == 20
    assert sub["type"] == STATS_TYPE[kind]
    assert sub["msgBacklog"] == 0 and sub["unackedMessages"] == 0
    assert sub["msgDropRate"] == 0.0
    assert [p["msgInCounter"] for p in st["publishers"]] == [21]


def test_shared_spreads_over_consumers_and_each_subscription_gets_a_copy(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    topic = new_topic()
    shared = [
        client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared, consumer_name=n)
        for n in ("a", "b")
    ]
    excl = client.subscribe(topic, "excl", consumer_type=pulsar.ConsumerType.Exclusive)
    wait_permits(broker, topic, "shared", 2)
    wait_permits(broker, topic, "excl")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(str(i).encode())
    per = stats(broker, topic)["subscriptions"]["shared"]
    counts = {c["consumerName"]: c["msgOutCounter"] for c in per["consumers"]}
    assert counts == {"a": 5, "b": 5}  # round robin over the consumers with permits
    assert sorted(int(excl.receive(5000).data()) for _ in range(10)) == list(range(10))
    received = sorted(int(c.receive(5000).data()) for c in shared for _ in range(5))
    assert received == list(range(10))


def test_messages_are_dropped_while_the_consumer_has_no_permits(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    topic = new_topic()
    # One permit: the first message fills the client's queue; the broker drops the others
    # until the application takes it and the client asks for more.
    slow = client.subscribe(
        topic, "slow", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1
    )
    fast = client.subscribe(topic, "fast", consumer_type=pulsar.ConsumerType.Shared)
    wait_permits(broker, topic, "slow")
    wait_permits(broker, topic, "fast")
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(str(i).encode())
    wait_until(lambda: stats(broker, topic)["subscriptions"]["fast"]["msgOutCounter"] == 5)
    st = stats(broker, topic)
    subs = st["subscriptions"]
    assert subs["slow"]["msgOutCounter"] == 1
    assert subs["slow"]["msgDropRate"] > 0
    assert subs["fast"]["msgDropRate"] == 0.0
    assert st["msgDropRate"] == subs["slow"]["msgDropRate"]
    assert st["msgInCounter"] == 5 and st["msgOutCounter"] == 6
    assert [int(fast.receive(5000).data()) for _ in range(5)] == list(range(5))
    series = metrics(broker, topic)
    assert series[("pulsar_in_messages_total", "")] == 5
    assert series[("pulsar_subscription_msg_drop_rate", "slow")] > 0
    assert series[("pulsar_subscription_msg_drop_rate", "fast")] == 0
    assert int(slow.receive(5000).data()) == 0
    assert receive_none(slow, 300) is None  # the dropped ones never come
    wait_permits(broker, topic, "slow")
    producer.send(b"5")
    assert int(slow.receive(5000).data()) == 5


def test_exclusive_and_type_conflicts_are_refused(client: pulsar.Client) -> None:
    topic = new_topic()
    client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)


def test_subscription_types_enabled_applies_to_nonpersistent_topics(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    # A namespace of its own: the policy must not reach other tests' topics.
    ns = f"public/np-types-{uuid.uuid4().hex[:8]}"
    assert broker.admin("PUT", f"/admin/v2/namespaces/{ns}")[0] == 204
    policy = f"/admin/v2/namespaces/{ns}/subscriptionTypesEnabled"
    assert broker.admin("POST", policy, ["Shared"])[0] == 204
    topic = f"non-persistent://{ns}/t"
    with pytest.raises(pulsar.NotAllowedError):
        client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Exclusive)
    client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)


def test_failover_switches_to_the_next_consumer_when_the_active_one_leaves(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    topic = new_topic()
    kw: dict[str, Any] = {"consumer_type": pulsar.ConsumerType.Failover}
    first = client.subscribe(topic, "fo", consumer_name="a", **kw)
    second = client.subscribe(topic, "fo", consumer_name="b", **kw)
    wait_permits(broker, topic, "fo", 2)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"1")
    assert first.receive(5000).data() == b"1"
    assert receive_none(second, 200) is None
    first.close()
    producer.send(b"2")
    assert second.receive(5000).data() == b"2"


def test_seek_is_a_no_op_and_last_message_id_is_refused(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    topic = new_topic()
    consumer = client.subscribe(topic, "s")
    wait_permits(broker, topic, "s")
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"a")
    msg = consumer.receive(5000)
    consumer.seek(pulsar.MessageId.earliest)  # Pulsar answers success and moves nothing
    assert receive_none(consumer, 300) is None
    consumer.acknowledge(msg)
    with pytest.raises(pulsar.PulsarException):
        consumer.get_last_message_id()
    path = admin_path(topic)
    for method, tail in [
        ("GET", "/lastMessageId"),
        ("POST", "/subscription/s/skip_all"),
        ("POST", "/subscription/s/resetcursor/0"),
        ("POST", "/subscription/s/expireMessages/10"),
    ]:
        status, body = broker.admin(method, path + tail)
        assert status == 405, (tail, body)
        assert "non-persistent topic is not allowed" in body["reason"]


def test_partitioned_nonpersistent_topic(broker: BrokerProcess, client: pulsar.Client) -> None:
    topic = new_topic()
    path = admin_path(topic)
    assert broker.admin("PUT", path + "/partitions", 3)[0] == 204
    assert broker.admin("GET", path + "/partitions")[1] == {"partitions": 3}
    status, listed = broker.admin("GET", f"/admin/v2/non-persistent/{NS}/partitioned")
    assert status == 200 and topic in listed
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]
    consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    for i in range(3):
        wait_permits(broker, f"{topic}-partition-{i}", "s")
    producer = client.create_producer(
        topic,
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )
    for i in range(30):
        producer.send(str(i).encode())
    assert sorted(int(consumer.receive(5000).data()) for _ in range(30)) == list(range(30))
    status, agg = broker.admin("GET", path + "/partitioned-stats")
    assert status == 200
    assert agg["msgInCounter"] == 30 and agg["msgOutCounter"] == 30
    assert agg["metadata"] == {"partitions": 3}
    status, names = broker.admin("GET", f"/admin/v2/non-persistent/{NS}")
    assert {f"{topic}-partition-{i}" for i in range(3)} <= set(names)
    status, body = broker.admin("DELETE", path + "/partitions")
    assert status == 412, body  # clients attached
    consumer.close()
    producer.close()
    assert broker.admin("DELETE", path + "/partitions")[0] == 204
    assert broker.admin("GET", path + "/partitions")[1] == {"partitions": 0}


def test_a_restart_keeps_no_message_and_no_topic(fresh_broker: BrokerProcess) -> None:
    broker = fresh_broker.start()
    topic, partitioned = new_topic(), new_topic()
    assert broker.admin("PUT", admin_path(partitioned) + "/partitions", 2)[0] == 204
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "durable-sub", consumer_type=pulsar.ConsumerType.Shared)
        wait_permits(broker, topic, "durable-sub")
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(10):
            producer.send(str(i).encode())
        assert stats(broker, topic)["subscriptions"]["durable-sub"]["msgOutCounter"] == 10
        assert topic in broker.admin("GET", f"/admin/v2/non-persistent/{NS}")[1]
    finally:
        client.close()
    broker.stop()
    broker.start(same_ports=True)
    assert broker.admin("GET", admin_path(topic) + "/stats")[0] == 404
    assert topic not in broker.admin("GET", f"/admin/v2/non-persistent/{NS}")[1]
    persistent = broker.admin("GET", f"/admin/v2/persistent/{NS}")[1]
    assert not [t for t in persistent if topic.split("/")[-1] in t]
    # Partitioned metadata is metadata: kept, as Pulsar keeps it in its metadata store.
    assert broker.admin("GET", admin_path(partitioned) + "/partitions")[1] == {"partitions": 2}
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "durable-sub", consumer_type=pulsar.ConsumerType.Shared)
        assert receive_none(consumer, 500) is None
        st = stats(broker, topic)
        assert st["msgInCounter"] == 0 and list(st["subscriptions"]) == ["durable-sub"]
    finally:
        client.close()


def test_regex_subscription_in_non_persistent_mode_finds_loaded_topics(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    prefix = f"np-re-{uuid.uuid4().hex[:8]}"
    topic = f"non-persistent://{NS}/{prefix}-x"
    producer = client.create_producer(topic, batching_enabled=False)
    consumer = client.subscribe(
        re.compile(f"non-persistent://{NS}/{prefix}-.*"),
        "re",
        regex_subscription_mode=pulsar.RegexSubscriptionMode.NonPersistentOnly,
    )
    wait_permits(broker, topic, "re")
    producer.send(b"hi")
    assert consumer.receive(5000).data() == b"hi"


def test_listener_threads_and_batches(broker: BrokerProcess, client: pulsar.Client) -> None:
    topic = new_topic()
    got: list[int] = []
    lock = threading.Lock()

    def listener(c: pulsar.Consumer, m: pulsar.Message) -> None:
        with lock:
            got.append(int(m.data()))
        c.acknowledge(m)

    client.subscribe(topic, "l", message_listener=listener)
    wait_permits(broker, topic, "l")
    producer = client.create_producer(
        topic, batching_enabled=True, batching_max_messages=10, batching_max_publish_delay_ms=5
    )
    for i in range(100):
        producer.send_async(str(i).encode(), None)
    producer.flush()
    wait_until(lambda: len(got) == 100, what="100 messages")
    assert sorted(got) == list(range(100))
    st = stats(broker, topic)
    assert st["msgInCounter"] == 100
    assert st["subscriptions"]["l"]["msgOutCounter"] == 100


def test_unsubscribe_removes_the_subscription_and_an_idle_topic_is_unloaded(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    topic = new_topic()
    keep = client.subscribe(topic, "keep", consumer_type=pulsar.ConsumerType.Shared)
    gone = client.subscribe(topic, "gone", consumer_type=pulsar.ConsumerType.Shared)
    wait_permits(broker, topic, "gone")
    gone.unsubscribe()
    assert sorted(broker.admin("GET", admin_path(topic) + "/subscriptions")[1]) == ["keep"]
    keep.close()  # a durable subscription outlives its consumers, as in Pulsar
    assert sorted(broker.admin("GET", admin_path(topic) + "/subscriptions")[1]) == ["keep"]
    status, body = broker.admin("DELETE", admin_path(topic))
    assert status == 204, body
    assert broker.admin("GET", admin_path(topic) + "/stats")[0] == 404


def test_a_reader_gets_what_is_published_after_it_starts(
    broker: BrokerProcess, client: pulsar.Client
) -> None:
    topic = new_topic()
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"old")
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    wait_until(
        lambda: any(
            c["availablePermits"] > 0
            for s in stats(broker, topic)["subscriptions"].values()
            for c in s["consumers"]
        ),
        what="the reader's permits",
    )
    producer.send(b"new")
    assert reader.read_next(5000).data() == b"new"
    reader.close()
    # The reader's subscription is not durable: it goes with the reader.
    wait_until(lambda: not stats(broker, topic)["subscriptions"], what="no subscription")
