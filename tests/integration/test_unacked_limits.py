"""Unacked limits through the official client: ``maxUnackedMessagesPerConsumer`` and
``maxUnackedMessagesPerSubscription`` on Shared and Key_Shared, from broker.conf, namespace and
topic policies; blocked at the limit, unblocked at half; the stats fields; REST and CLI.

Messages are sent unbatched, so one entry is one message and the counts are exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import new_namespace, ok, tpath, wait_for
from tests.integration.conftest import make_client
from tests.integration.test_metrics import one, scrape

pytestmark = pytest.mark.integration

QUIET_MS = 600  # how long "receives nothing more" waits


def _types() -> list[Any]:
    return [
        pytest.param(pulsar.ConsumerType.Shared, id="Shared"),
        pytest.param(pulsar.ConsumerType.KeyShared, id="Key_Shared"),
    ]


def _publish(client: pulsar.Client, topic: str, n: int, keys: int = 1) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(f"{i}".encode(), partition_key=f"k{i % keys}")
    producer.close()


def _drain(consumer: pulsar.Consumer, first_ms: int = 5000) -> list[pulsar.Message]:
    """Everything ``consumer`` receives until it has been quiet for a while."""
    got: list[pulsar.Message] = []
    timeout = first_ms
    while True:
        try:
            got.append(consumer.receive(timeout_millis=timeout))
        except pulsar.Timeout:
            return got
        timeout = QUIET_MS


def _sub_stats(broker: BrokerProcess, topic: str, sub: str) -> dict[str, Any]:
    stats = ok(broker, "GET", tpath(topic, "stats"))
    found: dict[str, Any] = stats["subscriptions"][sub]
    return found


def _consumer_stats(broker: BrokerProcess, topic: str, sub: str, name: str) -> dict[str, Any]:
    for c in _sub_stats(broker, topic, sub)["consumers"]:
        if c["consumerName"] == name:
            return dict(c)
    raise AssertionError(f"no consumer {name} on {sub}")


def _until_unacked(broker: BrokerProcess, topic: str, sub: str, n: int) -> dict[str, Any]:
    """The subscription's stats once the broker counts ``n`` unacked (acks are grouped)."""
    assert wait_for(lambda: _sub_stats(broker, topic, sub)["unackedMessages"] == n)
    return _sub_stats(broker, topic, sub)


@pytest.mark.parametrize("sub_type", _types())
def test_consumer_blocks_at_its_limit_and_unblocks_at_half(
    broker: BrokerProcess, sub_type: Any
) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/t"
    ok(broker, "POST", f"/admin/v2/namespaces/{ns}/maxUnackedMessagesPerConsumer", 10)
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=sub_type, consumer_name="slow")
        _publish(client, topic, 40, keys=4)
        held = _drain(consumer)
        assert len(held) == 10  # stopped at the limit, the rest waits
        stats = _consumer_stats(broker, topic, "s", "slow")
        assert stats["blockedConsumerOnUnackedMsgs"] is True
        assert stats["unackedMessages"] == 10
        for msg in held[:4]:
            consumer.acknowledge(msg)
        st = _until_unacked(broker, topic, "s", 6)
        assert st["consumers"][0]["blockedConsumerOnUnackedMsgs"] is True  # 6 > 10 / 2
        assert _drain(consumer, first_ms=QUIET_MS) == []
        consumer.acknowledge(held[4])  # 5 left: half the limit
        more = _drain(consumer)
        assert len(more) == 5  # up to the limit again
        stats = _consumer_stats(broker, topic, "s", "slow")
        assert stats["blockedConsumerOnUnackedMsgs"] is True
        # Everything arrives in the end, each message once.
        for msg in held[5:] + more:
            consumer.acknowledge(msg)
        seen = {m.data() for m in held + more}
        while len(seen) < 40:
            msg = consumer.receive(timeout_millis=10_000)
            assert msg.data() not in seen
            seen.add(msg.data())
            consumer.acknowledge(msg)
    finally:
        client.close()


@pytest.mark.parametrize("dispatcher", ["pip379", "classic"])
def test_key_shared_blocked_consumer_keys_wait_others_flow_in_order(
    request: pytest.FixtureRequest, dispatcher: str
) -> None:
    if dispatcher == "classic":
        fresh: BrokerProcess = request.getfixturevalue("fresh_broker")
        fresh.conf["subscriptionKeySharedUseClassicPersistentImplementation"] = True
        broker = fresh.start()
    else:
        broker = request.getfixturevalue("broker")
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/ks"
    ok(broker, "PUT", tpath(topic))
    ok(broker, "POST", tpath(topic, "maxUnackedMessagesOnConsumer"), 5)
    client = make_client(broker.service_url)
    try:

        def key_shared(name: str) -> pulsar.Consumer:
            return client.subscribe(
                topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=name
            )

        stuck, busy = key_shared("stuck"), key_shared("busy")
        keys, per_key = 16, 12
        _publish(client, topic, keys * per_key, keys=keys)
        got: dict[str, dict[str, list[int]]] = {
            "stuck": defaultdict(list),
            "busy": defaultdict(list),
        }

        def take(name: str, msgs: list[pulsar.Message]) -> None:
            for m in msgs:
                got[name][m.partition_key()].append(int(m.data()))

        held = _drain(stuck)
        take("stuck", held)
        assert len(held) == 5
        # The other consumer's keys keep flowing while "stuck" holds its five: all of them.
        timeout = 5000
        while True:
            try:
                m = busy.receive(timeout_millis=timeout)
            except pulsar.Timeout:
                break
            take("busy", [m])
            busy.acknowledge(m)
            timeout = 1500  # acks are grouped (100 ms): "busy" may wait for its own briefly
        assert got["busy"], "every key hashed to one consumer: pick other keys"
        assert not set(got["busy"]) & set(got["stuck"])
        for key, values in got["busy"].items():
            assert len(values) == per_key, (key, values)
        stats = _consumer_stats(broker, topic, "ks", "stuck")
        assert stats["blockedConsumerOnUnackedMsgs"] is True and stats["unackedMessages"] == 5
        # "stuck" resumes as it acks, and its keys arrive complete and in order.
        total = keys * per_key
        received = 5 + sum(len(v) for v in got["busy"].values())
        for m in held:
            stuck.acknowledge(m)
        while received < total:
            m = stuck.receive(timeout_millis=10_000)
            take("stuck", [m])
            received += 1
            stuck.acknowledge(m)
        assert not set(got["busy"]) & set(got["stuck"])
        for name in ("stuck", "busy"):
            for key, values in got[name].items():
                assert values == sorted(values) and len(values) == per_key, (name, key, values)
    finally:
        client.close()


@pytest.mark.parametrize("sub_type", _types())
def test_subscription_limit_across_two_consumers(broker: BrokerProcess, sub_type: Any) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/t"
    ok(broker, "PUT", tpath(topic))
    ok(broker, "POST", tpath(topic, "maxUnackedMessagesOnSubscription"), 10)
    assert ok(broker, "GET", tpath(topic, "maxUnackedMessagesOnSubscription")) == 10
    client = make_client(broker.service_url)
    try:
        a = client.subscribe(topic, "s", consumer_type=sub_type, consumer_name="a")
        b = client.subscribe(topic, "s", consumer_type=sub_type, consumer_name="b")
        _publish(client, topic, 60, keys=12)
        held = [(a, m) for m in _drain(a, first_ms=3000)]
        held += [(b, m) for m in _drain(b, first_ms=QUIET_MS)]
        assert len(held) == 10
        st = _sub_stats(broker, topic, "s")
        assert st["blockedSubscriptionOnUnackedMsgs"] is True and st["unackedMessages"] == 10
        # No consumer is blocked on its own limit (50,000): the subscription is.
        assert not any(c["blockedConsumerOnUnackedMsgs"] for c in st["consumers"])
        _, samples, _ = scrape(broker)
        labels = {"topic": topic, "subscription": "s"}
        assert one(samples, "pulsar_subscription_blocked_on_unacked_messages", **labels) == 1
        for consumer, m in held[:5]:
            consumer.acknowledge(m)
        st = _until_unacked(broker, topic, "s", 5)
        assert st["blockedSubscriptionOnUnackedMsgs"] is True  # resumes below half only
        assert _drain(a, first_ms=QUIET_MS) + _drain(b, first_ms=QUIET_MS) == []
        held[5][0].acknowledge(held[5][1])  # 4 left: below half
        more = _drain(a, first_ms=3000) + _drain(b, first_ms=QUIET_MS)
        assert len(more) == 6  # up to the limit again
        st = _sub_stats(broker, topic, "s")
        assert st["blockedSubscriptionOnUnackedMsgs"] is True and st["unackedMessages"] == 10
    finally:
        client.close()


def test_broker_conf_namespace_and_topic_levels(fresh_broker: BrokerProcess) -> None:
    fresh_broker.conf["maxUnackedMessagesPerConsumer"] = 3
    broker = fresh_broker.start()
    ok(broker, "PUT", "/admin/v2/tenants/t", {"adminRoles": [], "allowedClusters": []})
    ok(broker, "PUT", "/admin/v2/namespaces/t/ns")
    ok(broker, "POST", "/admin/v2/namespaces/t/ns/maxUnackedMessagesPerConsumer", 5)
    ok(broker, "PUT", tpath("persistent://t/ns/own"))
    ok(broker, "POST", tpath("persistent://t/ns/own", "maxUnackedMessagesOnConsumer"), 7)
    client = make_client(broker.service_url)
    shared = pulsar.ConsumerType.Shared
    try:
        counts = {}
        consumers = {}
        for topic in (
            "persistent://public/default/conf",
            "persistent://t/ns/ns",
            "persistent://t/ns/own",
        ):
            consumers[topic] = client.subscribe(topic, "s", consumer_type=shared)
            _publish(client, topic, 12)
        for topic, consumer in consumers.items():
            counts[topic] = len(_drain(consumer))
        assert counts == {
            "persistent://public/default/conf": 3,  # broker.conf
            "persistent://t/ns/ns": 5,  # namespace policy
            "persistent://t/ns/own": 7,  # topic policy over the namespace's
        }
        applied = tpath("persistent://t/ns/own", "maxUnackedMessagesOnConsumer") + "?applied=true"
        assert ok(broker, "GET", applied) == 7
        # A policy change reaches a live, blocked consumer: 0 lifts the limit at once.
        own = "persistent://t/ns/own"
        assert _consumer_stats(broker, own, "s", consumers[own].consumer_name())[
            "blockedConsumerOnUnackedMsgs"
        ]
        ok(broker, "POST", tpath(own, "maxUnackedMessagesOnConsumer"), 0)
        assert len(_drain(consumers[own])) == 5
        ok(broker, "DELETE", tpath(own, "maxUnackedMessagesOnConsumer"))
        assert ok(broker, "GET", applied) == 5  # the namespace's again
    finally:
        client.close()


def test_rest_round_trip_and_bad_input(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/t"
    ok(broker, "PUT", tpath(topic))
    for ns_path, topic_path in (
        ("maxUnackedMessagesPerConsumer", "maxUnackedMessagesOnConsumer"),
        ("maxUnackedMessagesPerSubscription", "maxUnackedMessagesOnSubscription"),
    ):
        path = f"/admin/v2/namespaces/{ns}/{ns_path}"
        assert ok(broker, "GET", path) is None
        ok(broker, "POST", path, 1000)
        assert ok(broker, "GET", path) == 1000
        field = "max_unacked_messages_per_" + ns_path.removeprefix("maxUnackedMessagesPer").lower()
        assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}")[field] == 1000
        assert broker.admin("POST", path, -1) == (412, {"reason": f"{ns_path} must be 0 or more"})
        status, body = broker.admin("POST", path, "many")
        assert status in (400, 422), (status, body)
        assert ok(broker, "GET", path) == 1000  # refused input changed nothing
        ok(broker, "DELETE", path)
        assert ok(broker, "GET", path) is None
        tp = tpath(topic, topic_path)
        assert ok(broker, "GET", tp) is None
        ok(broker, "POST", tp, 0)
        assert ok(broker, "GET", tp) == 0
        assert broker.admin("POST", tp, -5) == (412, {"reason": "maxUnackedNum must be 0 or more"})
        ok(broker, "DELETE", tp)
        defaults = {
            "maxUnackedMessagesOnConsumer": 50000,
            "maxUnackedMessagesOnSubscription": 200000,
        }
        assert ok(broker, "GET", tp + "?applied=true") == defaults[topic_path]
    status, _ = broker.admin(
        "GET", "/admin/v2/namespaces/nobody/none/maxUnackedMessagesPerConsumer"
    )
    assert status == 404


def _cli(broker: BrokerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``keyshared admin ARGS``; a last argument ``EXPECT-1`` wants exit status 1 and
    Pulsar's refusal on stderr."""
    expect = 0
    if args[-1] == "EXPECT-1":
        args, expect = args[:-1], 1
    cmd = [sys.executable, "-m", "keyshared.cli", "admin", "--admin-url", broker.web_url, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == expect, (args, done.returncode, done.stdout, done.stderr)
    if expect:
        assert "maxUnackedNum must be 0 or more" in done.stderr
    return done


def test_cli_round_trip(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/t"
    ok(broker, "PUT", tpath(topic))

    def cli(*commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
        # Independent commands run at once (each is a Python start-up).
        with ThreadPoolExecutor(len(commands)) as pool:
            return list(pool.map(lambda c: _cli(broker, *c), commands))

    cli(
        ("namespaces", "set-max-unacked-messages-per-consumer", ns, "-c", "42"),
        ("topics", "set-max-unacked-messages-per-subscription", topic, "-m", "9"),
    )
    got, applied, _ = cli(
        ("namespaces", "get-max-unacked-messages-per-consumer", ns),
        ("topics", "get-max-unacked-messages-per-consumer", topic, "--applied"),
        ("topics", "set-max-unacked-messages-per-consumer", topic, "-m", "-1", "EXPECT-1"),
    )
    assert json.loads(got.stdout) == 42
    assert json.loads(applied.stdout) == 42  # the namespace's, inherited
    assert ok(broker, "GET", tpath(topic, "maxUnackedMessagesOnSubscription")) == 9
    cli(
        ("namespaces", "remove-max-unacked-messages-per-consumer", ns),
        ("topics", "remove-max-unacked-messages-per-subscription", topic),
    )
    assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/maxUnackedMessagesPerConsumer") is None
    assert ok(broker, "GET", tpath(topic, "maxUnackedMessagesOnSubscription")) is None
