"""Shared subscriptions honour the consumer's ``priorityLevel`` (CommandSubscribe.priority_level),
as Pulsar's dispatcher does: consumers of the best level with permits take turns, a lower level
only gets what they have no room for. The official Python client cannot set the level (its
ConsumerConfiguration has no such setter), so the consumers here are raw protocol clients."""

from __future__ import annotations

import pulsar
import pytest

from keyshared.protocol import commands, pb
from tests.broker_process import BrokerProcess
from tests.raw_client import RawClient

pytestmark = pytest.mark.integration


def _received(raw: RawClient, consumer_id: int, wait: float) -> list[bytes]:
    """The payloads of MESSAGE frames for ``consumer_id`` that arrive within ``wait`` s."""
    out: list[bytes] = []
    for frame in raw.frames(timeout=wait):
        if frame.type == pb.BaseCommand.MESSAGE:
            assert frame.command.message.consumer_id == consumer_id
            assert frame.payload is not None
            out.append(frame.payload)
    return out


def test_a_lower_priority_consumer_gets_only_the_overflow(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    with RawClient.to(broker.service_url) as low, RawClient.to(broker.service_url) as high:
        low.handshake()
        high.handshake()
        # The lower level (1) subscribes first and asks for more: neither earns it a turn.
        low_id = low.subscribe(topic, "prio", priority_level=1)
        high_id = high.subscribe(topic, "prio", priority_level=0)
        low.send(commands.flow(consumer_id=low_id, permits=100))
        high.send(commands.flow(consumer_id=high_id, permits=30))
        # A PONG comes after the broker handled what came before it on that connection.
        assert low.ping_pong() == [] and high.ping_pong() == []
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(40):
            producer.send(f"m{i}".encode())
        producer.close()
        got_high = _received(high, high_id, 2.0)
        got_low = _received(low, low_id, 0.5)
    # The first 30 fill the level-0 consumer's permits; only the 10 beyond go to level 1.
    assert len(got_high) == 30 and len(got_low) == 10
    assert all(p.endswith(f"m{i}".encode()) for i, p in enumerate(got_high))
    assert all(p.endswith(f"m{30 + i}".encode()) for i, p in enumerate(got_low))
