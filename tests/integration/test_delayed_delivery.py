"""Delayed delivery: held back on Shared and Key_Shared until due, immediate on Exclusive."""

from __future__ import annotations

import time
from datetime import timedelta

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client


@pytest.mark.parametrize("sub_type", [pulsar.ConsumerType.Shared, pulsar.ConsumerType.KeyShared])
def test_continue_dispatch_when_messages_delayed(
    broker: BrokerProcess, topic: str, sub_type: pulsar.ConsumerType
) -> None:
    """Research §8 row 20: 40 delayed + 40 normal; small queues; all 80 received, none early."""
    client = make_client(broker.service_url)
    c1 = client.subscribe(topic, "d", consumer_type=sub_type, receiver_queue_size=10)
    c2 = client.subscribe(topic, "d", consumer_type=sub_type, receiver_queue_size=30)
    producer = client.create_producer(topic, batching_enabled=False)
    delay_ms = 2000
    sent_at = time.time()
    for i in range(40):
        producer.send(
            f"late-{i}".encode(),
            deliver_after=timedelta(milliseconds=delay_ms),
            partition_key=f"k{i % 8}",
        )
    for i in range(40):
        producer.send(f"now-{i}".encode(), partition_key=f"k{i % 8}")
    got: dict[str, float] = {}
    deadline = time.time() + 15
    while len(got) < 80 and time.time() < deadline:
        for c in (c1, c2):
            try:
                m = c.receive(timeout_millis=50)
            except pulsar.Timeout:
                continue
            got[m.data().decode()] = time.time()
            c.acknowledge(m)
    assert len(got) == 80
    for i in range(40):
        assert got[f"late-{i}"] - sent_at >= delay_ms / 1000 - 0.05, "delivered early"
    assert max(got[f"now-{i}"] for i in range(40)) - sent_at < delay_ms / 1000
    client.close()


def test_exclusive_delivers_immediately(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    consumer = client.subscribe(topic, "ex")
    producer = client.create_producer(topic, batching_enabled=False)
    t = time.time()
    producer.send(b"x", deliver_after=timedelta(seconds=30))
    assert consumer.receive(timeout_millis=5000).data() == b"x"
    assert time.time() - t < 5
    client.close()


def test_delayed_messages_survive_restart(fresh_broker: BrokerProcess, topic: str) -> None:
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    consumer = client.subscribe(topic, "d", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    due = time.time() + 3
    producer.send(b"later", deliver_at=int(due * 1000))
    producer.send(b"now")
    assert consumer.receive(timeout_millis=5000).data() == b"now"
    time.sleep(0.3)
    client.close()
    fresh_broker.restart(crash=True)
    client = make_client(fresh_broker.service_url)
    consumer = client.subscribe(topic, "d", consumer_type=pulsar.ConsumerType.Shared)
    msgs = []
    deadline = time.time() + 10
    while time.time() < deadline and not any(m.data() == b"later" for m in msgs):
        try:
            m = consumer.receive(timeout_millis=200)
        except pulsar.Timeout:
            continue
        msgs.append(m)
        assert m.data() != b"later" or time.time() >= due - 0.05, "delivered early"
        consumer.acknowledge(m)
    assert any(m.data() == b"later" for m in msgs)
    client.close()
