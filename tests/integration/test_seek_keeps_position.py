"""A seek or reset-cursor keeps the subscription's new position across the re-subscribe.

The broker closes the consumers on a seek and the client re-subscribes. A reader's
subscription is non-durable: it goes with its last consumer, yet Pulsar keeps its cursor
(``removeConsumer(consumer, isResetCursor)`` leaves it in the managed ledger and the
re-subscribing reader finds it by name), so the reader resumes at the seek target, not at
the position its ``SUBSCRIBE`` names (after a seek by time it names none: latest).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pulsar
import pytest
import requests

from keyshared.protocol import commands, pb
from keyshared.protocol.encode import encode_command
from tests.broker_process import BrokerProcess
from tests.raw_client import RawClient

RECEIVE_MS = 5000


def _publish(client: pulsar.Client, topic: str, n: int) -> tuple[list[pulsar.MessageId], int]:
    """``n`` messages; returns their ids and a publish time between messages 4 and 5."""
    producer = client.create_producer(topic, batching_enabled=False)
    ids = []
    mid_time = 0
    for i in range(n):
        ids.append(producer.send(str(i).encode()))
        if i == 4:
            time.sleep(0.05)
            mid_time = int(time.time() * 1000)
            time.sleep(0.05)
    producer.close()
    return ids, mid_time


def _read(reader: pulsar.Reader, n: int) -> list[int]:
    return [int(reader.read_next(timeout_millis=RECEIVE_MS).data()) for _ in range(n)]


def _nothing_more(reader: pulsar.Reader) -> bool:
    try:
        reader.read_next(timeout_millis=300)
    except pulsar.Timeout:
        return True
    return False


def test_reader_seek_by_time_resumes_at_that_time(client: pulsar.Client, topic: str) -> None:
    _, mid_time = _publish(client, topic, 10)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert _read(reader, 10) == list(range(10))
    reader.seek(mid_time)
    assert _read(reader, 5) == [5, 6, 7, 8, 9]
    assert _nothing_more(reader)
    # Back to before the first message: everything again.
    reader.seek(mid_time - 60_000)
    assert _read(reader, 10) == list(range(10))


def test_reader_seek_by_id_resumes_after_it(client: pulsar.Client, topic: str) -> None:
    ids, _ = _publish(client, topic, 10)
    reader = client.create_reader(topic, pulsar.MessageId.latest)
    assert _nothing_more(reader)
    reader.seek(ids[2])
    # start_message_id_inclusive is False: the client skips the target itself.
    assert _read(reader, 7) == list(range(3, 10))
    reader.seek(pulsar.MessageId.earliest)
    assert _read(reader, 10) == list(range(10))


def test_partitioned_reader_seek_by_time(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    path = topic.replace("persistent://", "")
    r = requests.put(f"{broker.web_url}/admin/v2/persistent/{path}/partitions", json=3, timeout=10)
    assert r.status_code == 204, r.text
    producer = client.create_producer(
        topic,
        batching_enabled=False,
        message_routing_mode=pulsar.PartitionsRoutingMode.RoundRobinDistribution,
    )
    for i in range(6):
        producer.send(str(i).encode())
    time.sleep(0.05)
    mid_time = int(time.time() * 1000)
    time.sleep(0.05)
    for i in range(6, 12):
        producer.send(str(i).encode())
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert sorted(_read(reader, 12)) == list(range(12))
    reader.seek(mid_time)
    assert sorted(_read(reader, 6)) == list(range(6, 12))
    assert _nothing_more(reader)


@pytest.mark.parametrize(
    "sub_type",
    [pulsar.ConsumerType.Exclusive, pulsar.ConsumerType.Failover, pulsar.ConsumerType.KeyShared],
)
def test_consumer_seek_by_time_keeps_position(
    client: pulsar.Client, topic: str, sub_type: pulsar.ConsumerType
) -> None:
    _, mid_time = _publish(client, topic, 10)
    consumer = client.subscribe(
        topic, "s", consumer_type=sub_type, initial_position=pulsar.InitialPosition.Earliest
    )
    got = [int(consumer.receive(timeout_millis=RECEIVE_MS).data()) for _ in range(10)]
    assert sorted(got) == list(range(10))
    consumer.seek(mid_time)
    got = [int(consumer.receive(timeout_millis=RECEIVE_MS).data()) for _ in range(5)]
    assert sorted(got) == [5, 6, 7, 8, 9]


def test_rest_reset_cursor_with_a_reader_attached(
    broker: BrokerProcess, client: pulsar.Client, topic: str, unique: Callable[[str], str]
) -> None:
    _, mid_time = _publish(client, topic, 10)
    reader = client.create_reader(
        topic, pulsar.MessageId.earliest, subscription_role_prefix=unique("reader")
    )
    assert _read(reader, 3) == [0, 1, 2]
    path = topic.replace("persistent://", "")
    subs = requests.get(f"{broker.web_url}/admin/v2/persistent/{path}/subscriptions", timeout=10)
    (sub,) = subs.json()

    def connected_since() -> object:
        st = requests.get(f"{broker.web_url}/admin/v2/persistent/{path}/stats", timeout=10).json()
        consumers = st["subscriptions"].get(sub, {}).get("consumers", [])
        return consumers[0]["connectedSince"] if consumers else None

    before = connected_since()
    assert before is not None
    # Forward past what the reader has seen: the reconnecting reader names message 2 as its
    # start (the last one it handed out), but the kept cursor is at the reset target.
    r = requests.post(
        f"{broker.web_url}/admin/v2/persistent/{path}/subscription/{sub}/resetcursor/{mid_time}",
        timeout=10,
    )
    assert r.status_code == 204, r.text
    # Read once the reader is back: what it prefetched before is dropped then.
    deadline = time.monotonic() + 10
    while connected_since() in (None, before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _read(reader, 5) == [5, 6, 7, 8, 9]
    assert _nothing_more(reader)


def test_reader_rollback_duration_starts_that_far_back(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(2):
        producer.send(f"old-{i}".encode())
    # Old enough to fall outside the rollback; the new ones have 3 s to be subscribed to.
    time.sleep(4.0)
    new_ids = [producer.send(f"new-{i}".encode()) for i in range(2)]
    with RawClient.to(broker.service_url) as raw:
        raw.handshake()
        cmd = pb.BaseCommand(type=pb.BaseCommand.SUBSCRIBE)
        sub = cmd.subscribe
        sub.topic, sub.subscription, sub.consumer_id = topic, "rolled-back", 1
        sub.subType = pb.CommandSubscribe.Exclusive
        sub.request_id = raw.request_id()
        sub.durable = False
        sub.start_message_rollback_duration_sec = 3
        raw.send(encode_command(cmd))
        raw.expect(pb.BaseCommand.SUCCESS)
        raw.send(commands.flow(consumer_id=1, permits=10))
        got = [raw.expect(pb.BaseCommand.MESSAGE).message.message_id for _ in range(2)]
        assert [(m.ledgerId, m.entryId) for m in got] == [
            (m.ledger_id(), m.entry_id()) for m in new_ids
        ]
