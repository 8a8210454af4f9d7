"""Admin REST on subscriptions: create and delete, skip, clear-backlog (skip_all), reset-cursor to
a time or a message id, peek, examine and get-by-id, on Pulsar's paths and with its headers."""

from __future__ import annotations

import time

import pulsar
import pytest

from keyshared.admin_cli.http import HttpResult
from keyshared.admin_cli.messages import decode_messages
from tests.broker_process import BrokerProcess
from tests.integration.admin_support import ok, raw, tpath, wait_for
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration

EARLIEST = {"ledgerId": -1, "entryId": -1, "partitionIndex": -1}


def backlog(broker: BrokerProcess, topic: str, sub: str) -> int:
    return int(ok(broker, "GET", tpath(topic, "stats"))["subscriptions"][sub]["msgBacklog"])


def produce(broker: BrokerProcess, topic: str, n: int, **kwargs: object) -> list[pulsar.MessageId]:
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        ids = []
        for i in range(n):
            ids.append(producer.send(f"m{i}".encode(), **kwargs))  # type: ignore[arg-type]
            time.sleep(0.002)  # distinct publish times for reset-by-time
        return ids
    finally:
        client.close()


def mid(msg_id: pulsar.MessageId, **extra: object) -> dict[str, object]:
    return {"ledgerId": msg_id.ledger_id(), "entryId": msg_id.entry_id(), **extra}


def drain(consumer: pulsar.Consumer, timeout_ms: int = 1500) -> list[bytes]:
    out = []
    while True:
        try:
            msg = consumer.receive(timeout_millis=timeout_ms)
        except pulsar.Timeout:
            return out
        out.append(msg.data())
        consumer.acknowledge(msg)


def test_create_and_delete_subscriptions(broker: BrokerProcess, topic: str) -> None:
    ok(broker, "PUT", tpath(topic))
    ids = produce(broker, topic, 5)
    sub = tpath(topic, "subscription")
    assert broker.admin("PUT", sub + "/from-start", EARLIEST) == (204, None)
    assert broker.admin("PUT", sub + "/from-now") == (204, None)
    assert broker.admin("PUT", sub + "/from-third", mid(ids[2])) == (204, None)
    assert broker.admin("PUT", sub + "/from-now")[0] == 409
    # Pulsar's ResetCursorData also reads from the strings "earliest" and "latest".
    assert broker.admin("PUT", sub + "/by-word", "earliest") == (204, None)
    assert backlog(broker, topic, "by-word") == 5
    assert broker.admin("PUT", sub + "/by-bad-word", "soon")[0] == 412
    ok(broker, "DELETE", sub + "/by-word")
    assert [backlog(broker, topic, s) for s in ("from-start", "from-now", "from-third")] == [
        5,
        0,
        3,
    ]
    assert ok(broker, "GET", tpath(topic, "subscriptions")) == [
        "from-now",
        "from-start",
        "from-third",
    ]
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "from-third")
        assert consumer.receive(timeout_millis=5000).data() == b"m2"
        status, body = broker.admin("DELETE", sub + "/from-third")
        assert status == 412 and body == {"reason": "Subscription has active connected consumers"}
        assert broker.admin("DELETE", sub + "/from-third?force=true") == (204, None)
    finally:
        client.close()
    assert broker.admin("DELETE", sub + "/from-now") == (204, None)
    assert broker.admin("DELETE", sub + "/from-now")[0] == 404
    assert "from-now" not in ok(broker, "GET", tpath(topic, "subscriptions"))
    assert broker.admin("PUT", tpath(topic + "-missing", "subscription", "s"))[0] == 404


def test_skip_and_clear_backlog(broker: BrokerProcess, topic: str) -> None:
    ok(broker, "PUT", tpath(topic))
    ok(broker, "PUT", tpath(topic, "subscription", "s"), EARLIEST)
    produce(broker, topic, 10)
    sub = tpath(topic, "subscription", "s")
    assert broker.admin("POST", sub + "/skip/3") == (204, None)
    assert backlog(broker, topic, "s") == 7
    assert raw(broker, "GET", sub + "/position/1")[2] == b"m3"
    assert broker.admin("POST", sub + "/skip/-1")[0] == 412
    assert broker.admin("POST", sub + "/skip/1000") == (204, None)
    assert backlog(broker, topic, "s") == 0
    ok(broker, "POST", sub + "/resetcursor/0")
    assert backlog(broker, topic, "s") == 10
    assert broker.admin("POST", sub + "/skip_all") == (204, None)
    assert backlog(broker, topic, "s") == 0
    assert broker.admin("POST", tpath(topic, "subscription", "nope", "skip_all"))[0] == 404
    # After clear-backlog a consumer gets only what comes next.
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s")
        client.create_producer(topic).send(b"new")
        assert drain(consumer) == [b"new"]
    finally:
        client.close()


def test_reset_cursor_by_time_and_by_message_id(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(
            topic, "s", initial_position=pulsar.InitialPosition.Earliest, receiver_queue_size=1
        )
        ids = produce(broker, topic, 5)
        assert drain(consumer) == [f"m{i}".encode() for i in range(5)]
        assert wait_for(lambda: backlog(broker, topic, "s") == 0)
        sub = tpath(topic, "subscription", "s")
        # By time: the first message published at or after it; the consumer is disconnected
        # and continues from there.
        published = raw(
            broker,
            "GET",
            tpath(topic, "ledger", str(ids[2].ledger_id()), "entry", str(ids[2].entry_id())),
        )
        assert published[0] == 200
        stamp = _ms(published[1]["x-pulsar-publish-time"])
        assert broker.admin("POST", sub + f"/resetcursor/{stamp}") == (204, None)
        assert drain(consumer) == [b"m2", b"m3", b"m4"]
        # By message id (included), then after it (isExcluded).
        assert broker.admin("POST", sub + "/resetcursor", mid(ids[1])) == (204, None)
        assert drain(consumer) == [b"m1", b"m2", b"m3", b"m4"]
        ok(broker, "POST", sub + "/resetcursor", mid(ids[3], isExcluded=True))
        assert drain(consumer) == [b"m4"]
        ok(broker, "POST", sub + "/resetcursor", mid(ids[2], excluded=True))  # Jackson's name
        assert drain(consumer) == [b"m3", b"m4"]
        ok(broker, "POST", sub + "/resetcursor", EARLIEST)
        assert len(drain(consumer)) == 5
    finally:
        client.close()
    assert broker.admin("POST", tpath(topic, "subscription", "nope", "resetcursor", "0"))[0] == 404


def _ms(iso: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


def test_peek_examine_and_get_by_id(broker: BrokerProcess, topic: str) -> None:
    ok(broker, "PUT", tpath(topic))
    ok(broker, "PUT", tpath(topic, "subscription", "s"), EARLIEST)
    ids = produce(broker, topic, 4, properties={"k": "v"}, partition_key="key-1")
    sub = tpath(topic, "subscription", "s")
    internal_before = ok(broker, "GET", tpath(topic, "internalStats"))["cursors"]["s"]
    status, headers, body = raw(broker, "GET", sub + "/position/1")
    assert status == 200 and body == b"m0"
    assert headers["x-pulsar-message-id"] == f"{ids[0].ledger_id()}:{ids[0].entry_id()}"
    assert headers["x-pulsar-property-k"] == "v"
    assert headers["x-pulsar-partition-key"] == "key-1"
    assert headers["x-pulsar-sequence-id"] == "0"
    assert headers["x-pulsar-publish-time"].endswith("Z")
    assert "x-pulsar-producer-name" in headers
    assert raw(broker, "GET", sub + "/position/4")[2] == b"m3"
    assert raw(broker, "GET", sub + "/position/5")[0] == 404
    assert raw(broker, "GET", sub + "/position/0")[0] == 412
    # Examine counts from either end of the topic.
    examine = tpath(topic, "examinemessage")
    assert raw(broker, "GET", examine + "?initialPosition=earliest&messagePosition=1")[2] == b"m0"
    assert raw(broker, "GET", examine + "?initialPosition=latest&messagePosition=1")[2] == b"m3"
    assert raw(broker, "GET", examine + "?initialPosition=latest&messagePosition=2")[2] == b"m2"
    assert raw(broker, "GET", examine + "?initialPosition=earliest&messagePosition=9")[0] == 404
    by_id = tpath(topic, "ledger", str(ids[2].ledger_id()), "entry", str(ids[2].entry_id()))
    assert raw(broker, "GET", by_id)[2] == b"m2"
    assert (
        raw(broker, "GET", tpath(topic, "ledger", str(ids[2].ledger_id()), "entry", "99"))[0] == 404
    )
    # None of these moved the cursor.
    assert ok(broker, "GET", tpath(topic, "internalStats"))["cursors"]["s"] == internal_before
    assert backlog(broker, topic, "s") == 4
    # Peek skips individually acknowledged entries.
    client = make_client(broker.service_url)
    try:
        consumer = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
        msgs = [consumer.receive(timeout_millis=5000) for _ in range(4)]
        consumer.acknowledge(msgs[0])
        consumer.acknowledge(msgs[2])
        assert wait_for(lambda: backlog(broker, topic, "s") == 2)
        assert raw(broker, "GET", sub + "/position/1")[2] == b"m1"
        assert raw(broker, "GET", sub + "/position/2")[2] == b"m3"
    finally:
        client.close()


def test_peek_batches_and_compressed_entries(broker: BrokerProcess, topic: str) -> None:
    ok(broker, "PUT", tpath(topic))
    ok(broker, "PUT", tpath(topic, "subscription", "s"), EARLIEST)
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=3,
            batching_max_publish_delay_ms=1000,
            compression_type=pulsar.CompressionType.ZLib,
        )
        for i in range(3):
            producer.send_async(f"b{i}".encode() * 20, None, properties={"i": str(i)})
        producer.flush()
    finally:
        client.close()
    status, headers, body = raw(broker, "GET", tpath(topic, "subscription", "s", "position", "1"))
    assert status == 200 and headers["x-pulsar-num-batch-message"] == "3"
    messages = decode_messages(HttpResult(status, headers, body))
    assert [m["payload"] for m in messages] == [f"b{i}".encode().decode() * 20 for i in range(3)]
    assert [m["properties"]["i"] for m in messages] == ["0", "1", "2"]
    assert messages[1]["messageId"] == headers["x-pulsar-message-id"] + ":1"


def test_partitioned_topic_subscription_operations(broker: BrokerProcess, topic: str) -> None:
    ok(broker, "PUT", tpath(topic, "partitions"), 2)
    parts = [f"{topic}-partition-{i}" for i in range(2)]
    assert broker.admin("PUT", tpath(topic, "subscription", "s"), EARLIEST) == (204, None)
    assert all(ok(broker, "GET", tpath(p, "subscriptions")) == ["s"] for p in parts)
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(6):
            producer.send(f"m{i}".encode(), partition_key=f"key-{i}")
    finally:
        client.close()
    total = sum(backlog(broker, p, "s") for p in parts)
    assert total == 6
    sub = tpath(topic, "subscription", "s")
    assert broker.admin("POST", sub + "/skip/1")[0] == 405
    assert broker.admin("GET", sub + "/position/1")[0] == 405
    assert broker.admin("GET", tpath(topic, "examinemessage"))[0] == 405
    assert broker.admin("POST", sub + "/skip_all") == (204, None)
    assert [backlog(broker, p, "s") for p in parts] == [0, 0]
    assert broker.admin("POST", sub + "/resetcursor/0") == (204, None)
    assert sum(backlog(broker, p, "s") for p in parts) == 6
    ok(broker, "POST", sub + "/skip_all")
    # Reset to a message id applies to the partition it names.
    ok(broker, "POST", sub + "/resetcursor", dict(EARLIEST, partitionIndex=1))
    assert backlog(broker, parts[0], "s") == 0
    assert backlog(broker, parts[1], "s") > 0
    assert broker.admin("POST", sub + "/resetcursor", EARLIEST)[0] == 405
    assert broker.admin("DELETE", sub) == (204, None)
    assert all(ok(broker, "GET", tpath(p, "subscriptions")) == [] for p in parts)
