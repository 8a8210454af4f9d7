"""Backlog quotas through the official client and the admin REST API: the three retention
policies, size and age quotas, broker.conf defaults, stats and metrics, the CLI.

One broker for the module, checking quotas every second (``backlogQuotaCheckIntervalInSeconds``)
and with a default size quota (``backlogQuotaDefaultLimitBytes``) that the namespace policies of
the tests override.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import new_namespace, ok, tpath, wait_for
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration

DEFAULT_LIMIT = 100_000
PAYLOAD = b"x" * 1000


@pytest.fixture(scope="module")
def qb() -> Iterator[BrokerProcess]:
    b = BrokerProcess(
        conf={
            "backlogQuotaCheckIntervalInSeconds": 1,
            "backlogQuotaDefaultLimitBytes": DEFAULT_LIMIT,
            "backlogQuotaDefaultRetentionPolicy": "producer_exception",
            "brokerDeleteInactiveTopicsEnabled": "false",
        }
    )
    b.start()
    yield b
    b.close()


def stats(b: BrokerProcess, topic: str) -> dict[str, Any]:
    return ok(b, "GET", tpath(topic, "stats"))  # type: ignore[no-any-return]


def ns_quota(b: BrokerProcess, ns: str, body: dict[str, Any], kind: str = "") -> None:
    query = f"?backlogQuotaType={kind}" if kind else ""
    ok(b, "POST", f"/admin/v2/namespaces/{ns}/backlogQuota{query}", body)


def metric(b: BrokerProcess, name: str, **labels: str) -> float | None:
    """The value of the series ``name`` whose labels include ``labels``."""
    with urllib.request.urlopen(b.web_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        head, value = line.rsplit(" ", 1)
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def fill(client: pulsar.Client, topic: str, n: int) -> pulsar.Producer:
    """A producer that sent ``n`` 1000-byte messages (one entry each), numbered."""
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(PAYLOAD, properties={"i": str(i)})
    return producer


def test_producer_exception(qb: BrokerProcess) -> None:
    ns = new_namespace(qb)
    topic = f"persistent://{ns}/exc"
    ns_quota(qb, ns, {"limitSize": 5000, "policy": "producer_exception"})
    client = make_client(qb.service_url)
    try:
        consumer = client.subscribe(topic, "slow")
        producer = fill(client, topic, 10)
        # The periodic check disconnects the producer; its reconnection is refused and the
        # client fails what it sends meanwhile.
        assert wait_for(lambda: not stats(qb, topic)["publishers"])
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            producer.send(b"late")
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            client.create_producer(topic)
        assert stats(qb, topic)["backlogQuotaLimitSize"] == 5000
        # Once the consumer caught up, producers are welcome again.
        for _ in range(10):
            consumer.acknowledge(consumer.receive(5000))
        assert wait_for(lambda: stats(qb, topic)["backlogSize"] < 5000)
        client.create_producer(topic).send(b"again")
    finally:
        client.close()


def test_producer_request_hold(qb: BrokerProcess) -> None:
    ns = new_namespace(qb)
    topic = f"persistent://{ns}/hold"
    ns_quota(qb, ns, {"limitSize": 5000, "policy": "producer_request_hold"})
    client = make_client(qb.service_url)
    try:
        consumer = client.subscribe(topic, "slow")
        short = client.create_producer(topic, batching_enabled=False, send_timeout_millis=1000)
        held = client.create_producer(topic, batching_enabled=False, send_timeout_millis=30000)
        for _ in range(10):
            short.send(PAYLOAD)
        assert wait_for(lambda: not stats(qb, topic)["publishers"])
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededError):
            client.create_producer(topic)
        results: list[pulsar.Result] = []
        held.send_async(b"held", lambda res, _id: results.append(res))
        # A held send waits; past its send timeout it fails.
        with pytest.raises(pulsar.Timeout):
            short.send(b"waits")
        assert results == []
        # The consumer catches up: the held send goes through.
        for _ in range(10):
            consumer.acknowledge(consumer.receive(5000))
        assert wait_for(lambda: bool(results), 25)
        assert results == [pulsar.Result.Ok]
        assert consumer.receive(10000).data() == b"held"
    finally:
        client.close()


def test_consumer_backlog_eviction_by_size(qb: BrokerProcess) -> None:
    ns = new_namespace(qb)
    topic = f"persistent://{ns}/evict"
    ns_quota(qb, ns, {"limitSize": 5000, "policy": "consumer_backlog_eviction"})
    client = make_client(qb.service_url)
    try:
        client.subscribe(topic, "slow").close()  # a durable subscription nobody reads
        fast = client.subscribe(topic, "fast")
        producer = fill(client, topic, 20)
        for _ in range(20):
            fast.acknowledge(fast.receive(5000))

        def evicted() -> bool:
            st = stats(qb, topic)
            return bool(st["subscriptions"]["slow"]["msgBacklog"] < 20 and st["backlogSize"] < 5000)

        assert wait_for(evicted)
        left = stats(qb, topic)["subscriptions"]["slow"]["msgBacklog"]
        assert 0 < left < 20
        labels = {"topic": topic, "quota_type": "size"}
        assert (
            metric(qb, "pulsar_storage_backlog_quota_exceeded_evictions_total", **labels) or 0
        ) >= 1
        # The producer was never refused, and the slow subscription lost its oldest messages.
        producer.send(b"still welcome")
        slow = client.subscribe(topic, "slow")
        first = slow.receive(5000)
        assert first.properties()["i"] == str(20 - left)
    finally:
        client.close()


def test_message_age_quotas(qb: BrokerProcess) -> None:
    ns = new_namespace(qb)
    evicting = f"persistent://{ns}/old"
    ns_quota(qb, ns, {"limitTime": 2, "policy": "consumer_backlog_eviction"}, "message_age")
    refusing = f"persistent://{ns}/old-refused"
    ok(qb, "PUT", tpath(refusing))
    # The topic's own time quota, over the namespace's eviction.
    ok(
        qb,
        "POST",
        tpath(refusing, "backlogQuota") + "?backlogQuotaType=message_age",
        {"limitTime": 1, "policy": "producer_exception"},
    )
    client = make_client(qb.service_url)
    try:
        for topic in (evicting, refusing):
            client.subscribe(topic, "slow").close()
            fill(client, topic, 3).close()
        time.sleep(1.5)
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            client.create_producer(refusing)
        # Older than the limit: dropped for the subscription, and counted.
        assert wait_for(lambda: stats(qb, evicting)["subscriptions"]["slow"]["msgBacklog"] == 0)
        labels = {"topic": evicting, "quota_type": "time"}
        assert (
            metric(qb, "pulsar_storage_backlog_quota_exceeded_evictions_total", **labels) or 0
        ) >= 1
        st = stats(qb, refusing)
        assert st["backlogQuotaLimitTime"] == 1
        assert st["oldestBacklogMessageSubscriptionName"] == "slow"
        assert wait_for(lambda: stats(qb, refusing)["oldestBacklogMessageAgeSeconds"] >= 1)
        age = metric(qb, "pulsar_storage_backlog_age_seconds", topic=refusing)
        assert age is not None and age >= 1
        assert metric(qb, "pulsar_storage_backlog_quota_limit_time", topic=refusing) == 1
    finally:
        client.close()


def test_broker_default_quota(qb: BrokerProcess) -> None:
    topic = f"persistent://public/default/quota-default-{time.monotonic_ns()}"
    client = make_client(qb.service_url)
    try:
        client.subscribe(topic, "slow").close()
        producer = client.create_producer(topic, batching_enabled=False)
        for _ in range(2):
            producer.send(b"y" * 60_000)
        # 120 kB over the broker's 100 kB: refused at once (the size is measured live).
        with pytest.raises(pulsar.ProducerBlockedQuotaExceededException):
            client.create_producer(topic)
        assert stats(qb, topic)["backlogQuotaLimitSize"] == DEFAULT_LIMIT
        assert metric(qb, "pulsar_storage_backlog_quota_limit", topic=topic) == DEFAULT_LIMIT
        overview = ok(qb, "GET", "/dashboard/api/overview")
        [shown] = [t for t in overview["topics"] if t["name"] == topic]
        assert shown["backlogQuotaExceeded"] == ["destination_storage"]
    finally:
        client.close()


def test_rest_round_trip_and_bad_input(qb: BrokerProcess) -> None:
    ns = new_namespace(qb)
    base = f"/admin/v2/namespaces/{ns}"
    assert ok(qb, "GET", base + "/backlogQuotaMap") == {}
    ns_quota(qb, ns, {"limitSize": 1024, "policy": "producer_exception"})
    ns_quota(qb, ns, {"limitTime": 30, "policy": "consumer_backlog_eviction"}, "message_age")
    storage = {"limit": 1024, "limitSize": 1024, "limitTime": -1, "policy": "producer_exception"}
    age = {"limit": -1, "limitSize": -1, "limitTime": 30, "policy": "consumer_backlog_eviction"}
    assert ok(qb, "GET", base + "/backlogQuotaMap") == {
        "destination_storage": storage,
        "message_age": age,
    }
    # Bad input is refused by name.
    status, body = qb.admin("POST", base + "/backlogQuota?backlogQuotaType=size", storage)
    assert status == 404 and "size" in body["reason"]
    status, body = qb.admin("POST", base + "/backlogQuota", {"limitSize": 1, "policy": "drop"})
    assert status == 412 and "drop" in body["reason"]
    status, body = qb.admin(
        "POST", base + "/backlogQuota", {"limitSize": "big", "policy": "producer_exception"}
    )
    assert status == 412 and "limitSize" in body["reason"]
    assert qb.admin("POST", base + "/backlogQuota", [1])[0] == 400
    assert qb.admin("GET", "/admin/v2/namespaces/public/nope/backlogQuotaMap")[0] == 404
    # A size quota must stay under the namespace's retention, as Pulsar requires.
    ok(qb, "POST", base + "/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 1})
    status, body = qb.admin(
        "POST", base + "/backlogQuota", {"limitSize": 2 << 20, "policy": "producer_exception"}
    )
    assert status == 412 and "retention" in body["reason"]
    # And the retention may not go under the size quota.
    ok(qb, "DELETE", base + "/retention")
    ns_quota(qb, ns, {"limitSize": 3 << 20, "policy": "producer_exception"})
    status, body = qb.admin(
        "POST", base + "/retention", {"retentionTimeInMinutes": 60, "retentionSizeInMB": 2}
    )
    assert (status, body["reason"]) == (
        412,
        "Retention Quota must exceed configured backlog quota for namespace.",
    )
    ns_quota(qb, ns, {"limitSize": 1024, "policy": "producer_exception"})
    ok(qb, "DELETE", base + "/backlogQuota?backlogQuotaType=message_age")
    assert ok(qb, "GET", base + "/backlogQuotaMap") == {"destination_storage": storage}

    # Topic level: its own map, and with applied the quotas in force.
    topic = f"persistent://{ns}/t"
    assert qb.admin("GET", tpath(topic, "backlogQuotaMap"))[0] == 404  # no such topic
    ok(qb, "PUT", tpath(topic))
    assert ok(qb, "GET", tpath(topic, "backlogQuotaMap")) == {}
    applied = ok(qb, "GET", tpath(topic, "backlogQuotaMap") + "?applied=true")
    assert applied["destination_storage"] == storage
    assert applied["message_age"] == {  # the broker's default
        "limit": DEFAULT_LIMIT,
        "limitSize": DEFAULT_LIMIT,
        "limitTime": -1,
        "policy": "producer_exception",
    }
    mine = {"limitSize": 10, "limitTime": -1, "policy": "producer_request_hold"}
    ok(qb, "POST", tpath(topic, "backlogQuota"), mine)
    assert ok(qb, "GET", tpath(topic, "backlogQuotaMap"))["destination_storage"]["limitSize"] == 10
    assert stats(qb, topic)["backlogQuotaLimitSize"] == 10
    ok(qb, "DELETE", tpath(topic, "backlogQuota"))
    assert stats(qb, topic)["backlogQuotaLimitSize"] == 1024

    # On a partitioned topic, the quota reaches every partition.
    partitioned = f"persistent://{ns}/p"
    ok(qb, "PUT", tpath(partitioned, "partitions"), 2)
    ok(
        qb,
        "POST",
        tpath(partitioned, "backlogQuota"),
        {"limitSize": 77, "policy": "producer_exception"},
    )
    assert stats(qb, partitioned + "-partition-1")["backlogQuotaLimitSize"] == 77

    # Both in a namespace's Policies body, as Pulsar's Java admin client sends them.
    quota = {"destination_storage": {"limit": 10, "policy": "producer_request_hold"}}
    ok(
        qb,
        "PUT",
        base + "-whole",
        {"backlog_quota_map": quota, "inactive_topic_policies": {"deleteWhileInactive": True}},
    )
    assert ok(qb, "GET", base + "-whole/backlogQuotaMap") == {
        "destination_storage": {
            "limit": 10,
            "limitSize": 10,
            "limitTime": -1,
            "policy": "producer_request_hold",
        }
    }
    view = ok(qb, "GET", base + "-whole")
    assert view["inactive_topic_policies"]["deleteWhileInactive"] is True
    bad = {"backlog_quota_map": {"size": quota["destination_storage"]}}
    status, body = qb.admin("PUT", base + "-bad", bad)
    assert status == 400 and "size" in body["reason"]

    # Inactive-topic policies.
    policy = {
        "inactiveTopicDeleteMode": "delete_when_subscriptions_caught_up",
        "maxInactiveDurationSeconds": 120,
        "deleteWhileInactive": True,
    }
    assert ok(qb, "GET", base + "/inactiveTopicPolicies") is None
    ok(qb, "POST", base + "/inactiveTopicPolicies", policy)
    assert ok(qb, "GET", base + "/inactiveTopicPolicies") == policy
    assert ok(qb, "GET", tpath(topic, "inactiveTopicPolicies")) is None
    assert ok(qb, "GET", tpath(topic, "inactiveTopicPolicies") + "?applied=true") == policy
    status, body = qb.admin(
        "POST", base + "/inactiveTopicPolicies", {"inactiveTopicDeleteMode": "never"}
    )
    assert status == 412 and "never" in body["reason"]
    ok(qb, "DELETE", base + "/inactiveTopicPolicies")
    # The broker's: deletion switched off in this module's broker.conf.
    in_force = ok(qb, "GET", tpath(topic, "inactiveTopicPolicies") + "?applied=true")
    assert in_force["deleteWhileInactive"] is False


def cli(b: BrokerProcess, *args: str, expect: int = 0) -> str:
    cmd = [sys.executable, "-m", "keyshared.cli", "admin", "--admin-url", b.web_url, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == expect, (args, done.stdout, done.stderr)
    return done.stdout


def in_parallel(b: BrokerProcess, *commands: tuple[Any, ...]) -> list[str]:
    """Independent CLI commands at once (each a tuple of arguments, an int last for the exit
    status expected); their outputs in order."""

    def one(c: tuple[Any, ...]) -> str:
        if isinstance(c[-1], int):
            return cli(b, *c[:-1], expect=c[-1])
        return cli(b, *c)

    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(one, commands))


def test_cli_round_trip(qb: BrokerProcess) -> None:
    ns = new_namespace(qb)
    topic = f"persistent://{ns}/cli"
    ok(qb, "PUT", tpath(topic))
    age_quota = ("-lt", "1h", "-p", "consumer_backlog_eviction", "-t", "message_age")
    inactive = ("-e", "-t", "5m", "-m", "delete_when_no_subscriptions")
    in_parallel(
        qb,
        ("namespaces", "set-backlog-quota", ns, "-l", "10M", "-p", "producer_exception"),
        ("namespaces", "set-backlog-quota", ns, *age_quota),
        # pulsar-admin's rule: a size quota needs --limit.
        ("namespaces", "set-backlog-quota", ns, "-p", "producer_exception", 2),
        ("topics", "set-backlog-quota", topic, "-l", "4k", "-p", "producer_request_hold"),
        ("namespaces", "set-inactive-topic-policies", ns, *inactive),
    )
    _, shown_inactive = in_parallel(
        qb,
        ("namespaces", "remove-backlog-quota", ns),
        ("namespaces", "get-inactive-topic-policies", ns),
    )
    assert json.loads(shown_inactive) == {
        "inactiveTopicDeleteMode": "delete_when_no_subscriptions",
        "maxInactiveDurationSeconds": 300,
        "deleteWhileInactive": True,
    }
    shown, applied, _ = in_parallel(
        qb,
        ("namespaces", "get-backlog-quotas", ns),
        ("topics", "get-backlog-quotas", topic, "--applied"),
        ("namespaces", "remove-inactive-topic-policies", ns),
    )
    assert json.loads(shown) == {
        "message_age": {
            "limit": -1,
            "limitSize": -1,
            "limitTime": 3600,
            "policy": "consumer_backlog_eviction",
        }
    }
    assert json.loads(applied)["destination_storage"]["limitSize"] == 4096
    assert json.loads(applied)["message_age"]["limitTime"] == 3600
    assert ok(qb, "GET", f"/admin/v2/namespaces/{ns}/inactiveTopicPolicies") is None
