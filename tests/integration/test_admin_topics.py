"""Admin REST: topics (create, delete, list, partitioned, stats, internalStats, partitioned-stats,
subscriptions, unload, lastMessageId, messageid) and topic policies on Pulsar's paths."""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.admin_support import new_namespace, ok, tpath, wait_for
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration


def test_create_list_delete(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/t1"
    assert broker.admin("PUT", tpath(topic)) == (204, None)
    status, body = broker.admin("PUT", tpath(topic))
    assert status == 409 and body == {"reason": "This topic already exists"}
    assert ok(broker, "GET", f"/admin/v2/persistent/{ns}") == [topic]
    assert broker.admin("PUT", "/admin/v2/persistent/public/no-ns/x")[0] == 404
    assert broker.admin("PUT", f"/admin/v2/persistent/{ns}/bad%20name")[0] == 412
    # A topic with a connected producer is deleted only when forced.
    client = make_client(broker.service_url)
    try:
        client.create_producer(topic)
        assert broker.admin("DELETE", tpath(topic))[0] == 412
        assert broker.admin("DELETE", tpath(topic) + "?force=true") == (204, None)
    finally:
        client.close()
    assert broker.admin("DELETE", tpath(topic))[0] == 404
    assert broker.admin("GET", tpath(topic, "stats"))[0] == 404


def test_partitioned_topics(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/pt"
    assert broker.admin("PUT", tpath(topic, "partitions"), 0)[0] == 406
    assert broker.admin("PUT", tpath(topic, "partitions"), 3) == (204, None)
    assert broker.admin("PUT", tpath(topic, "partitions"), 3)[0] == 409
    assert ok(broker, "GET", tpath(topic, "partitions")) == {"partitions": 3}
    assert ok(broker, "GET", f"/admin/v2/persistent/{ns}/partitioned") == [topic]
    assert len(ok(broker, "GET", f"/admin/v2/persistent/{ns}")) == 3
    assert broker.admin("POST", tpath(topic, "partitions"), 4) == (204, None)
    assert broker.admin("POST", tpath(topic, "partitions"), 2)[0] == 409
    assert ok(broker, "GET", tpath(topic, "partitions")) == {"partitions": 4}
    ok(broker, "PUT", f"/admin/v2/persistent/{ns}/plain")
    assert ok(broker, "GET", f"/admin/v2/persistent/{ns}/plain/partitions") == {"partitions": 0}
    # A partitioned topic's name is not a topic: its stats are per partition.
    assert broker.admin("GET", tpath(topic, "stats"))[0] == 404
    client = make_client(broker.service_url)
    try:
        client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(8):
            producer.send(str(i).encode(), partition_key=f"k{i}")
        stats = ok(broker, "GET", tpath(topic, "partitioned-stats"))
        assert stats["metadata"] == {"partitions": 4}
        assert stats["msgInCounter"] == 8
        assert stats["subscriptions"]["s"]["msgBacklog"] == 8
        assert sum(p["msgInCounter"] for p in stats["partitions"].values()) == 8
        brief = ok(broker, "GET", tpath(topic, "partitioned-stats") + "?perPartition=false")
        assert brief["partitions"] == {} and brief["msgInCounter"] == 8
        assert ok(broker, "GET", tpath(topic, "subscriptions")) == ["s"]
        assert broker.admin("DELETE", tpath(topic, "partitions"))[0] == 412
    finally:
        client.close()
    assert broker.admin("DELETE", tpath(topic, "partitions") + "?force=true") == (204, None)
    assert ok(broker, "GET", tpath(topic, "partitions")) == {"partitions": 0}
    assert broker.admin("GET", tpath(topic, "partitioned-stats"))[0] == 404
    assert broker.admin("DELETE", tpath(topic, "partitions"))[0] == 404


def test_stats_and_internal_stats(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "sub", consumer_type=pulsar.ConsumerType.Shared)
        producer = client.create_producer(topic, producer_name="prod", batching_enabled=False)
        for i in range(3):
            producer.send(str(i).encode())
        consumer.acknowledge(consumer.receive(timeout_millis=5000))
        # acks are grouped by the client: wait until the broker has it
        assert wait_for(
            lambda: (
                ok(broker, "GET", tpath(topic, "stats"))["subscriptions"]["sub"]["msgBacklog"] == 2
            )
        )
        stats = ok(broker, "GET", tpath(topic, "stats"))
        assert stats["msgInCounter"] == 3
        assert [p["producerName"] for p in stats["publishers"]] == ["prod"]
        sub = stats["subscriptions"]["sub"]
        assert sub["type"] == "Shared" and len(sub["consumers"]) == 1
        assert sub["msgBacklog"] == 2
        internal = ok(broker, "GET", tpath(topic, "internalStats"))
        assert internal["numberOfEntries"] == 3
        assert set(internal["cursors"]) == {"sub"}
        assert "markDeletePosition" in internal["cursors"]["sub"]
        assert ok(broker, "GET", tpath(topic, "subscriptions")) == ["sub"]
    finally:
        client.close()
    missing = topic + "-missing"
    for what in ("stats", "internalStats", "subscriptions"):
        assert broker.admin("GET", tpath(missing, what))[0] == 404


def test_unload_topic(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s")
        producer = client.create_producer(topic, batching_enabled=False)
        producer.send(b"before")
        first = consumer.receive(timeout_millis=5000)
        assert first.data() == b"before"
        consumer.acknowledge(first)
        assert wait_for(
            lambda: (
                ok(broker, "GET", tpath(topic, "stats"))["subscriptions"]["s"]["msgBacklog"] == 0
            )
        )
        assert broker.admin("PUT", tpath(topic, "unload")) == (204, None)
        # Producer and consumer reconnect to the reloaded topic on their own.
        producer.send(b"after")
        msg = consumer.receive(timeout_millis=10000)
        assert msg.data() == b"after"
        consumer.acknowledge(msg)
        stats = ok(broker, "GET", tpath(topic, "stats"))
        assert len(stats["publishers"]) == 1
        assert len(stats["subscriptions"]["s"]["consumers"]) == 1
    finally:
        client.close()
    assert broker.admin("PUT", tpath(topic + "-missing", "unload"))[0] == 404


def test_last_message_id_and_message_id_by_time(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        before = int(time.time() * 1000) - 1
        producer = client.create_producer(topic, batching_enabled=False)
        ids = [producer.send(str(i).encode()) for i in range(3)]
    finally:
        client.close()
    last = ok(broker, "GET", tpath(topic, "lastMessageId"))
    assert (last["ledgerId"], last["entryId"]) == (ids[-1].ledger_id(), ids[-1].entry_id())
    first = ok(broker, "GET", tpath(topic, "messageid", str(before)))
    assert (first["ledgerId"], first["entryId"]) == (ids[0].ledger_id(), ids[0].entry_id())
    future = int(time.time() * 1000) + 3_600_000
    assert broker.admin("GET", tpath(topic, "messageid", str(future)))[0] == 404


def test_topic_policies_over_namespace_policies(broker: BrokerProcess) -> None:
    ns = new_namespace(broker)
    topic = f"persistent://{ns}/pol"
    ok(broker, "PUT", tpath(topic))
    # deduplicationEnabled: body true/false; applied resolves topic > namespace > broker
    assert ok(broker, "GET", tpath(topic, "deduplicationEnabled")) is None
    assert ok(broker, "GET", tpath(topic, "deduplicationEnabled") + "?applied=true") is False
    ok(broker, "POST", f"/admin/v2/namespaces/{ns}/deduplication", True)
    assert ok(broker, "GET", tpath(topic, "deduplicationEnabled") + "?applied=true") is True
    assert broker.admin("POST", tpath(topic, "deduplicationEnabled"), False) == (204, None)
    assert ok(broker, "GET", tpath(topic, "deduplicationEnabled")) is False
    assert ok(broker, "GET", tpath(topic, "deduplicationEnabled") + "?applied=true") is False
    ok(broker, "DELETE", tpath(topic, "deduplicationEnabled"))
    assert ok(broker, "GET", tpath(topic, "deduplicationEnabled")) is None
    # retention
    ok(
        broker,
        "POST",
        f"/admin/v2/namespaces/{ns}/retention",
        {"retentionTimeInMinutes": 5, "retentionSizeInMB": 1},
    )
    applied = ok(broker, "GET", tpath(topic, "retention") + "?applied=true")
    assert applied == {"retentionTimeInMinutes": 5, "retentionSizeInMB": 1}
    own = {"retentionTimeInMinutes": -1, "retentionSizeInMB": 100}
    assert broker.admin("POST", tpath(topic, "retention"), own) == (204, None)
    assert ok(broker, "GET", tpath(topic, "retention")) == own
    assert ok(broker, "GET", tpath(topic, "retention") + "?applied=true") == own
    bad = {"retentionTimeInMinutes": 10, "retentionSizeInMB": 0}
    assert broker.admin("POST", tpath(topic, "retention"), bad)[0] == 412
    ok(broker, "DELETE", tpath(topic, "retention"))
    assert ok(broker, "GET", tpath(topic, "retention")) is None
    # messageTTL: a query parameter on topics, as in Pulsar
    ok(broker, "POST", f"/admin/v2/namespaces/{ns}/messageTTL", 30)
    assert ok(broker, "GET", tpath(topic, "messageTTL")) is None
    assert ok(broker, "GET", tpath(topic, "messageTTL") + "?applied=true") == 30
    assert broker.admin("POST", tpath(topic, "messageTTL") + "?messageTTL=90") == (204, None)
    assert ok(broker, "GET", tpath(topic, "messageTTL")) == 90
    assert broker.admin("POST", tpath(topic, "messageTTL") + "?messageTTL=-1")[0] == 412
    ok(broker, "DELETE", tpath(topic, "messageTTL"))
    assert ok(broker, "GET", tpath(topic, "messageTTL") + "?applied=true") == 30
    assert broker.admin("GET", tpath(topic + "-missing", "retention"))[0] == 404
