"""PIP-299: with dispatcherPauseOnAckStatePersistentEnabled, dispatch pauses while the ack holes
exceed managedLedgerMaxUnackedRangesToPersist (research §8 rows 37-39)."""

from __future__ import annotations

import time

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client

LIMIT = 20


def stats(broker: BrokerProcess, path: str, sub: str) -> dict:
    status, body = broker.admin("GET", path + "/stats")
    assert status == 200
    return body["subscriptions"][sub]


def make_holes(client: pulsar.Client, topic: str, sub: str, n: int) -> tuple[pulsar.Consumer, list]:
    consumer = client.subscribe(
        topic, sub, consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=1000
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(n):
        producer.send(str(i).encode())
    msgs = [consumer.receive(timeout_millis=5000) for _ in range(n)]
    unacked = []
    for m in msgs:
        if int(m.data()) % 2:
            consumer.acknowledge(m)
        else:
            unacked.append(m)
    return consumer, unacked


@pytest.fixture
def paused_broker(fresh_broker: BrokerProcess) -> BrokerProcess:
    fresh_broker.conf["managedLedgerMaxUnackedRangesToPersist"] = LIMIT
    return fresh_broker.start()


@pytest.mark.parametrize("how", ["broker", "namespace", "topic"])
def test_pause_until_acked(fresh_broker: BrokerProcess, topic: str, how: str) -> None:
    fresh_broker.conf["managedLedgerMaxUnackedRangesToPersist"] = LIMIT
    if how == "broker":
        fresh_broker.conf["dispatcherPauseOnAckStatePersistentEnabled"] = "true"
    fresh_broker.start()
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    client = make_client(fresh_broker.service_url)
    consumer, unacked = make_holes(client, topic, "s", 100)  # 50 holes > 20
    if how == "namespace":
        status, _ = fresh_broker.admin(
            "POST", "/admin/v2/namespaces/public/default/dispatcherPauseOnAckStatePersistent"
        )
        assert status == 204
    elif how == "topic":
        status, _ = fresh_broker.admin("POST", path + "/dispatcherPauseOnAckStatePersistent")
        assert status == 204
    time.sleep(0.5)  # grouped acks reach the broker
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"new")
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1500)
    assert stats(fresh_broker, path, "s")["blockedOnAckStatePersistent"] is True
    for m in unacked:
        consumer.acknowledge(m)
    assert consumer.receive(timeout_millis=5000).data() == b"new"
    assert stats(fresh_broker, path, "s")["blockedOnAckStatePersistent"] is False
    client.close()


def test_exclusive_never_pauses(paused_broker: BrokerProcess, topic: str) -> None:
    status, _ = paused_broker.admin(
        "POST", "/admin/v2/namespaces/public/default/dispatcherPauseOnAckStatePersistent"
    )
    assert status == 204
    client = make_client(paused_broker.service_url)
    consumer = client.subscribe(topic, "ex", receiver_queue_size=1000)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(100):
        producer.send(str(i).encode())
    for _ in range(100):
        m = consumer.receive(timeout_millis=5000)
        if int(m.data()) % 2:
            consumer.acknowledge(m)
    time.sleep(0.5)
    producer.send(b"new")
    assert consumer.receive(timeout_millis=5000).data() == b"new"
    client.close()


def test_replay_goes_on_while_paused(paused_broker: BrokerProcess, topic: str) -> None:
    """Row 38: a closed consumer's unacked messages still reach the other consumers."""
    paused_broker.admin(
        "POST", "/admin/v2/namespaces/public/default/dispatcherPauseOnAckStatePersistent"
    )
    client = make_client(paused_broker.service_url)
    first, unacked = make_holes(client, topic, "s", 100)
    time.sleep(0.5)
    other = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    first.close()
    got = sorted(int(other.receive(timeout_millis=5000).data()) for _ in unacked)
    assert got == sorted(int(m.data()) for m in unacked)
    client.close()


def test_turning_it_off_resumes(paused_broker: BrokerProcess, topic: str) -> None:
    """Row 39 and the dynamic switch: removing the policy lets dispatch go on."""
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    # As in Pulsar, a topic policy is set on an existing topic (404 otherwise).
    assert paused_broker.admin("PUT", path)[0] == 204
    assert paused_broker.admin("POST", path + "/dispatcherPauseOnAckStatePersistent")[0] == 204
    client = make_client(paused_broker.service_url)
    consumer, _ = make_holes(client, topic, "s", 100)
    time.sleep(0.5)
    client.create_producer(topic, batching_enabled=False).send(b"new")
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=1000)
    status, _ = paused_broker.admin("DELETE", path + "/dispatcherPauseOnAckStatePersistent")
    assert status == 204
    assert consumer.receive(timeout_millis=5000).data() == b"new"
    client.close()


def test_rejoining_after_everyone_left_fills_the_holes(
    paused_broker: BrokerProcess, topic: str
) -> None:
    """Beyond Pulsar: with the pause on, a subscription whose consumers all left with too many
    holes is not stuck: a new consumer re-reads the holes (which only shrinks the ack state)."""
    paused_broker.admin(
        "POST", "/admin/v2/namespaces/public/default/dispatcherPauseOnAckStatePersistent"
    )
    client = make_client(paused_broker.service_url)
    first, unacked = make_holes(client, topic, "s", 100)
    time.sleep(0.5)
    first.close()
    again = client.subscribe(topic, "s", consumer_type=pulsar.ConsumerType.Shared)
    msgs = [again.receive(timeout_millis=5000) for _ in unacked]
    assert sorted(int(m.data()) for m in msgs) == sorted(int(m.data()) for m in unacked)
    for m in msgs:
        again.acknowledge(m)
    client.create_producer(topic, batching_enabled=False).send(b"new")
    assert again.receive(timeout_millis=5000).data() == b"new"
    client.close()
