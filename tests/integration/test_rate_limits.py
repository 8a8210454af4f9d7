"""Publish and dispatch rate limits through the official client and the admin API.

Throttling only delays: every send is confirmed and every message delivered, in key order, and
the time taken shows the rate held. Only lower bounds on time are asserted: a loaded machine
can only make things slower. A bucket starts full (one second's worth), so N messages at R/s
take at least (N - R) / R seconds.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import new_namespace, ok, raw, tpath
from tests.integration.chromium_cdp import Chromium
from tests.integration.conftest import make_client
from tests.integration.test_dashboard import browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration


def publish_all(client: pulsar.Client, topic: str, n: int, size: int = 10) -> float:
    """Send ``n`` messages without batching (one frame each); seconds until all confirmed."""
    producer = client.create_producer(topic, batching_enabled=False, max_pending_messages=1000)
    results: list[pulsar.Result] = []
    done = threading.Event()

    def sent(res: pulsar.Result, _: object) -> None:
        results.append(res)
        if len(results) == n:
            done.set()

    start = time.monotonic()
    for i in range(n):
        producer.send_async(str(i).encode().ljust(size, b"."), sent)
    assert done.wait(60), f"{len(results)} of {n} confirmed"
    elapsed = time.monotonic() - start
    producer.close()
    assert all(r == pulsar.Result.Ok for r in results)
    return elapsed


def drain(consumer: pulsar.Consumer, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        msg = consumer.receive(10_000)
        out.append(msg.data())
        consumer.acknowledge(msg)
    return out


def test_topic_publish_rate_delays_sends_and_loses_nothing(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/pub"
    ok(broker, "PUT", tpath(topic))
    ok(broker, "POST", tpath(topic, "publishRate"), {"publishThrottlingRateInMsg": 200})
    assert ok(broker, "GET", tpath(topic, "publishRate")) == {
        "publishThrottlingRateInMsg": 200,
        "publishThrottlingRateInByte": -1,
    }
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s")
        elapsed = publish_all(client, topic, 600)
        # 200 at once, then 400 at 200/s.
        assert elapsed >= 1.8, elapsed
        got = drain(consumer, 600)
        assert sorted(int(d.rstrip(b".")) for d in got) == list(range(600))
        stats = ok(broker, "GET", tpath(topic, "stats"))
        assert stats["msgInCounter"] == 600
        assert stats["publishRateLimitedTimes"] > 0
        with urllib.request.urlopen(broker.web_url + "/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        line = next(
            m
            for m in metrics.splitlines()
            if m.startswith("pulsar_publish_rate_limit_times{") and f'topic="{topic}"' in m
        )
        assert float(line.rsplit(" ", 1)[1]) > 0
        # Without the limit the same sends are not held back.
        ok(broker, "DELETE", tpath(topic, "publishRate"))
        assert ok(broker, "GET", tpath(topic, "publishRate")) is None
        before = ok(broker, "GET", tpath(topic, "stats"))["publishRateLimitedTimes"]
        publish_all(client, topic, 600)
        after = ok(broker, "GET", tpath(topic, "stats"))["publishRateLimitedTimes"]
        assert after == before
        assert len(drain(consumer, 600)) == 600
    finally:
        client.close()


def test_namespace_byte_rate_applies_to_its_topics(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/bytes"
    ok(broker, "PUT", tpath(topic))
    ok(
        broker,
        "POST",
        f"/admin/v2/namespaces/{ns}/publishRate",
        {"publishThrottlingRateInByte": 20_000},
    )
    assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/publishRate") == {
        "publishThrottlingRateInMsg": -1,
        "publishThrottlingRateInByte": 20_000,
    }
    # The namespace keeps it as Pulsar's Policies does: by cluster.
    policies = ok(broker, "GET", f"/admin/v2/namespaces/{ns}")
    assert policies["publishMaxMessageRate"]["standalone"]["publishThrottlingRateInByte"] == 20_000
    applied = ok(broker, "GET", tpath(topic, "publishRate") + "?applied=true")
    assert applied["publishThrottlingRateInByte"] == 20_000
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s")
        # 60 KB: 20 KB at once, then 40 KB at 20 KB/s.
        elapsed = publish_all(client, topic, 60, size=1000)
        assert elapsed >= 1.6, elapsed
        assert len(drain(consumer, 60)) == 60
    finally:
        client.close()


def test_subscription_dispatch_rate_delays_a_backlog_in_key_order(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/ks"
    ok(broker, "PUT", tpath(topic))
    client = make_client(broker.service_url)
    n, keys = 300, 12
    try:
        client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared).close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(n):
            producer.send_async(str(i).encode(), None, partition_key=f"k{i % keys}")
        producer.flush()
        ok(
            broker,
            "POST",
            tpath(topic, "subscriptionDispatchRate"),
            {"dispatchThrottlingRateInMsg": 100, "ratePeriodInSecond": 1},
        )
        lock = threading.Lock()
        seen: dict[str, list[int]] = {}
        done = threading.Event()
        count = [0]

        def listener(consumer: pulsar.Consumer, msg: pulsar.Message) -> None:
            with lock:
                seen.setdefault(msg.partition_key(), []).append(int(msg.data()))
                count[0] += 1
                if count[0] == n:
                    done.set()
            consumer.acknowledge(msg)

        start = time.monotonic()
        consumers = [
            client.subscribe(
                topic,
                "ks",
                consumer_type=pulsar.ConsumerType.KeyShared,
                message_listener=listener,
                consumer_name=f"c{i}",
            )
            for i in range(2)
        ]
        assert done.wait(60), f"{count[0]} of {n} delivered"
        elapsed = time.monotonic() - start
        # 100 at once, then 200 at 100/s.
        assert elapsed >= 1.6, elapsed
        for key, seqs in seen.items():
            assert seqs == sorted(seqs), f"{key} out of order: {seqs}"
        assert sorted(s for seqs in seen.values() for s in seqs) == list(range(n))
        sub = ok(broker, "GET", tpath(topic, "stats"))["subscriptions"]["ks"]
        assert sub["dispatchThrottledMsgEventsBySubscriptionLimit"] > 0
        assert sub["dispatchThrottledMsgEventsByTopicLimit"] == 0
        for c in consumers:
            c.close()
        producer.close()
    finally:
        client.close()


def test_namespace_dispatch_rate_limits_each_topic(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/disp"
    ok(broker, "PUT", tpath(topic))
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        consumer.close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(200):
            producer.send_async(str(i).encode(), None)
        producer.flush()
        ok(
            broker,
            "POST",
            f"/admin/v2/namespaces/{ns}/dispatchRate",
            {"dispatchThrottlingRateInMsg": 100},
        )
        start = time.monotonic()
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        got = drain(consumer, 200)
        assert time.monotonic() - start >= 0.8
        assert sorted(int(d) for d in got) == list(range(200))
        sub = ok(broker, "GET", tpath(topic, "stats"))["subscriptions"]["s"]
        assert sub["dispatchThrottledMsgEventsByTopicLimit"] > 0
        with urllib.request.urlopen(broker.web_url + "/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert any(
            m.startswith("pulsar_subscription_dispatch_throttled_msg_events{")
            and 'reason="topic"' in m
            and f'topic="{topic}"' in m
            for m in metrics.splitlines()
        )
        producer.close()
    finally:
        client.close()


def test_broker_wide_limits_from_broker_conf(fresh_broker: BrokerProcess) -> None:
    fresh_broker.conf["brokerPublisherThrottlingMaxMessageRate"] = 200
    fresh_broker.conf["dispatchThrottlingRateInMsg"] = 100
    fresh_broker.conf["keepAliveIntervalSeconds"] = 1
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    try:
        topics = [f"persistent://public/default/b{i}" for i in range(2)]
        start = time.monotonic()
        threads = [threading.Thread(target=publish_all, args=(client, t, 200)) for t in topics]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # 400 sends over the two topics against one limit: 200 at once, then 200 at 200/s.
        assert time.monotonic() - start >= 0.8
        for t in topics:
            assert ok(fresh_broker, "GET", tpath(t, "stats"))["msgInCounter"] == 200

        # Every subscription's dispatch together: 100 at once, then 100 at 100/s.
        start = time.monotonic()
        late = client.subscribe(topics[0], "late", initial_position=pulsar.InitialPosition.Earliest)
        assert sorted(int(d.rstrip(b".")) for d in drain(late, 200)) == list(range(200))
        assert time.monotonic() - start >= 0.8
        sub = ok(fresh_broker, "GET", tpath(topics[0], "stats"))["subscriptions"]["late"]
        assert sub["dispatchThrottledMsgEventsByBrokerLimit"] > 0
        late.close()

        # Held for seconds without a read, the connection is not taken for a dead one (the
        # keepalive timeout waits while reading is paused, as Pulsar's does).
        slow = "persistent://public/default/slow"
        ok(fresh_broker, "PUT", tpath(slow))
        ok(fresh_broker, "POST", tpath(slow, "publishRate"), {"publishThrottlingRateInByte": 1000})
        producer = client.create_producer(slow, batching_enabled=False)
        address = ok(fresh_broker, "GET", tpath(slow, "stats"))["publishers"][0]["address"]
        # The first send overdraws the bucket by 2500 bytes: the connection is not read for
        # 2.5 s, more than twice keepAliveIntervalSeconds; the second waits behind it.
        producer.send_async(b"x" * 3500, None)
        producer.send_async(b"y", None)
        producer.flush()
        stats = ok(fresh_broker, "GET", tpath(slow, "stats"))
        assert stats["msgInCounter"] == 2
        assert stats["publishers"][0]["address"] == address
        assert "keepalive timeout" not in fresh_broker.log()
        producer.close()
    finally:
        client.close()


@pytest.mark.parametrize("policy", ["publishRate", "dispatchRate", "subscriptionDispatchRate"])
def test_rate_bodies_are_checked(broker: BrokerProcess, policy: str) -> None:
    ns = new_namespace(broker)
    path = f"/admin/v2/namespaces/{ns}/{policy}"
    field = (
        "publishThrottlingRateInMsg" if policy == "publishRate" else "dispatchThrottlingRateInMsg"
    )
    for body, status, words in [
        ([1, 2], 400, "JSON object"),
        ({field: "fast"}, 400, field),
        ({field: True}, 400, field),
        ({field: 1.5}, 400, field),
        ({"rateInMsg": 10}, 400, "rateInMsg"),
        ({field: -2}, 412, field),
    ]:
        code, _, answer = raw(broker, "POST", path, body)
        assert code == status and words in answer.decode(), (body, code, answer)
    code, _, answer = raw(broker, "POST", path)
    assert code == 400, answer
    if policy != "publishRate":
        code, _, answer = raw(broker, "POST", path, {field: 5, "ratePeriodInSecond": 0})
        assert code == 412 and b"ratePeriodInSecond" in answer
        code, _, answer = raw(broker, "POST", path, {field: 5, "relativeToPublishRate": "yes"})
        assert code == 400 and b"relativeToPublishRate" in answer
    # Nothing was stored by any of them.
    assert ok(broker, "GET", path) is None
    # Missing namespace and topic.
    assert raw(broker, "GET", f"/admin/v2/namespaces/{ns}x/{policy}")[0] == 404
    assert raw(broker, "GET", tpath(f"persistent://{ns}/missing", policy))[0] == 404


def test_dispatch_rate_round_trip_with_period(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/rt"
    ok(broker, "PUT", tpath(topic))
    body = {"dispatchThrottlingRateInByte": 4096, "ratePeriodInSecond": 10}
    ok(broker, "POST", tpath(topic, "dispatchRate"), body)
    assert ok(broker, "GET", tpath(topic, "dispatchRate")) == {
        "dispatchThrottlingRateInMsg": -1,
        "dispatchThrottlingRateInByte": 4096,
        "relativeToPublishRate": False,
        "ratePeriodInSecond": 10,
    }
    relative = {"dispatchThrottlingRateInMsg": 50, "relativeToPublishRate": True}
    ok(broker, "POST", tpath(topic, "dispatchRate"), relative)
    assert ok(broker, "GET", tpath(topic, "dispatchRate"))["relativeToPublishRate"] is True
    # Unset at the topic: the namespace's, then the broker's (no limit) apply.
    ok(broker, "DELETE", tpath(topic, "dispatchRate"))
    ok(
        broker,
        "POST",
        f"/admin/v2/namespaces/{ns}/dispatchRate",
        {"dispatchThrottlingRateInMsg": 7},
    )
    assert (
        ok(broker, "GET", tpath(topic, "dispatchRate") + "?applied=true")[
            "dispatchThrottlingRateInMsg"
        ]
        == 7
    )
    ok(broker, "DELETE", f"/admin/v2/namespaces/{ns}/dispatchRate")
    applied = ok(broker, "GET", tpath(topic, "dispatchRate") + "?applied=true")
    assert applied["dispatchThrottlingRateInMsg"] == 0


def test_cli_round_trip(broker: BrokerProcess) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tests.integration.test_cli_admin import out_json, parallel, run

    ns = new_namespace(broker)
    topic = f"persistent://{ns}/cli"
    ok(broker, "PUT", tpath(topic))
    parallel(
        broker,
        ("namespaces", "set-publish-rate", ns, "-m", "300", "-b", "4096"),
        ("namespaces", "set-dispatch-rate", ns, "-md", "50", "-dt", "2"),
        ("topics", "set-subscription-dispatch-rate", topic, "--byte-dispatch-rate", "1000"),
    )
    publish, topic_dispatch, sub_dispatch = (
        out_json(d)
        for d in parallel(
            broker,
            ("namespaces", "get-publish-rate", ns),
            ("topics", "get-dispatch-rate", topic, "--applied"),
            ("topics", "get-subscription-dispatch-rate", topic),
        )
    )
    assert publish == {"publishThrottlingRateInMsg": 300, "publishThrottlingRateInByte": 4096}
    # Inherited from the namespace.
    assert topic_dispatch == ok(broker, "GET", f"/admin/v2/namespaces/{ns}/dispatchRate")
    assert topic_dispatch["dispatchThrottlingRateInMsg"] == 50
    assert topic_dispatch["ratePeriodInSecond"] == 2
    assert sub_dispatch["dispatchThrottlingRateInByte"] == 1000
    with ThreadPoolExecutor(4) as pool:
        # A bad value is refused with the broker's reason (and stores nothing).
        bad = ("namespaces", "set-subscription-dispatch-rate", ns, "-md", "5", "-dt", "0")
        failed = pool.submit(run, broker, *bad, expect=1)
        removals = [
            pool.submit(run, broker, *args)
            for args in (
                ("namespaces", "remove-publish-rate", ns),
                ("namespaces", "remove-dispatch-rate", ns),
                ("topics", "remove-subscription-dispatch-rate", topic),
            )
        ]
        assert "ratePeriodInSecond" in failed.result().stderr
        for done in removals:
            done.result()
    for path in ("publishRate", "dispatchRate", "subscriptionDispatchRate"):
        assert ok(broker, "GET", f"/admin/v2/namespaces/{ns}/{path}") is None
    assert ok(broker, "GET", tpath(topic, "subscriptionDispatchRate")) is None


def test_dashboard_marks_a_throttled_producer(
    broker: BrokerProcess,
    browser: Chromium,  # noqa: F811 - the fixture of test_dashboard
) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/dash"
    ok(broker, "PUT", tpath(topic))
    ok(broker, "POST", tpath(topic, "publishRate"), {"publishThrottlingRateInMsg": 1})
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False, producer_name="slow")
        confirmed: list[pulsar.Result] = []
        for i in range(4):  # one a second: held for about three seconds
            producer.send_async(str(i).encode(), lambda res, _: confirmed.append(res))
        browser.goto(f"{broker.web_url}/?filter=dash")
        browser.wait_for("document.body.dataset.loaded === 'true'")
        marked = (
            f"document.querySelector('article.topic[data-topic={json.dumps(topic)}] "
            '.p.throttled[data-producer="slow"] .badge.throttled\') !== null'
        )
        browser.wait_for(marked, timeout=10)
        producer.flush()
        assert confirmed == [pulsar.Result.Ok] * 4
        browser.wait_for(f"!({marked})", timeout=10)
        producer.close()
    finally:
        client.close()


def test_one_subscriptions_own_dispatch_rate(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/own"
    ok(broker, "PUT", tpath(topic))
    client = make_client(broker.service_url)
    try:
        for sub in ("slow", "fast"):
            client.subscribe(topic, sub).close()
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(200):
            producer.send_async(str(i).encode(), None)
        producer.flush()
        ok(
            broker,
            "POST",
            tpath(topic, "slow", "dispatchRate"),
            {"dispatchThrottlingRateInMsg": 100},
        )
        assert (
            ok(broker, "GET", tpath(topic, "slow", "dispatchRate"))["dispatchThrottlingRateInMsg"]
            == 100
        )
        assert ok(broker, "GET", tpath(topic, "fast", "dispatchRate")) is None
        fast_applied = ok(broker, "GET", tpath(topic, "fast", "dispatchRate") + "?applied=true")
        assert fast_applied["dispatchThrottlingRateInMsg"] == 0  # broker.conf: no limit
        assert sorted(int(d) for d in drain(client.subscribe(topic, "fast"), 200)) == list(
            range(200)
        )
        start = time.monotonic()
        got = drain(client.subscribe(topic, "slow"), 200)
        assert time.monotonic() - start >= 0.8
        assert sorted(int(d) for d in got) == list(range(200))
        subs = ok(broker, "GET", tpath(topic, "stats"))["subscriptions"]
        assert subs["slow"]["dispatchThrottledMsgEventsBySubscriptionLimit"] > 0
        assert subs["fast"]["dispatchThrottledMsgEventsBySubscriptionLimit"] == 0
        ok(broker, "DELETE", tpath(topic, "slow", "dispatchRate"))
        assert ok(broker, "GET", tpath(topic, "slow", "dispatchRate")) is None
        code, _, answer = raw(broker, "POST", tpath(topic, "slow", "dispatchRate"), {"x": 1})
        assert code == 400 and b"x" in answer
        producer.close()
    finally:
        client.close()
