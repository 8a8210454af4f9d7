"""Producer access modes (PIP-68) and the topic epoch, through the official client and raw
frames, against Pulsar's answers (AbstractTopic.incrementTopicEpochIfNeeded)."""

from __future__ import annotations

import threading
import time
import uuid

import pulsar
import pytest
import requests

from keyshared.protocol import commands, pb
from tests.broker_process import BrokerProcess
from tests.raw_client import RawClient

Mode = pulsar.ProducerAccessMode
T = pb.BaseCommand


def _stats(broker: BrokerProcess, topic: str) -> dict[str, object]:
    path = topic.replace("persistent://", "persistent/")
    r = requests.get(f"{broker.web_url}/admin/v2/{path}/stats", timeout=10)
    assert r.status_code == 200, r.text
    out: dict[str, object] = r.json()
    return out


def test_exclusive_refuses_a_second_producer(client: pulsar.Client, topic: str) -> None:
    p1 = client.create_producer(topic, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    # A Shared producer beside an exclusive one: ProducerBusy.
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    p1.send(b"still mine")
    p1.close()
    p2 = client.create_producer(topic, access_mode=Mode.Exclusive)
    p2.send(b"now mine")


def test_exclusive_refused_beside_shared_producers(client: pulsar.Client, topic: str) -> None:
    shared = client.create_producer(topic)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    shared.close()
    client.create_producer(topic, access_mode=Mode.Exclusive).close()


def test_exclusive_with_fencing_closes_the_old_producer(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    old = client.create_producer(topic, access_mode=Mode.Exclusive, producer_name="old")
    old.send(b"a")
    new = client.create_producer(topic, access_mode=Mode.ExclusiveWithFencing, producer_name="new")
    new.send(b"b")
    # The old one was closed by the broker; it comes back with its old epoch and is fenced.
    with pytest.raises(pulsar.ProducerFenced):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            old.send(b"c")
            time.sleep(0.1)
    publishers = _stats(broker, topic)["publishers"]
    assert isinstance(publishers, list)
    assert [(p["producerName"], p["accessMode"]) for p in publishers] == [
        ("new", "ExclusiveWithFencing")
    ]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = [reader.read_next(timeout_millis=5000).data() for _ in range(2)]
    assert got == [b"a", b"b"]
    assert not reader.has_message_available()


def test_wait_for_exclusive_gets_the_topic_when_the_holder_leaves(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    holder = client.create_producer(topic, access_mode=Mode.Exclusive)
    created: list[pulsar.Producer] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            created.append(client.create_producer(topic, access_mode=Mode.WaitForExclusive))
        except BaseException as exc:  # the test reports it
            errors.append(exc)

    waiter = threading.Thread(target=create, daemon=True)
    waiter.start()
    waiter.join(1.5)
    assert waiter.is_alive() and not created and not errors  # queued, not refused
    stats = _stats(broker, topic)
    assert stats["waitingPublishers"] == 1
    assert stats["topicEpoch"] == 0
    # While one waits, a Shared producer is refused as well.
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic)
    holder.close()
    waiter.join(10)
    assert not errors and len(created) == 1
    created[0].send(b"waited")
    stats = _stats(broker, topic)
    assert stats["waitingPublishers"] == 0
    assert stats["topicEpoch"] == 1


def test_partitioned_topic_exclusive(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    path = topic.replace("persistent://", "")
    r = requests.put(f"{broker.web_url}/admin/v2/persistent/{path}/partitions", json=3, timeout=10)
    assert r.status_code == 204, r.text
    p1 = client.create_producer(topic, access_mode=Mode.Exclusive)
    with pytest.raises(pulsar.ProducerFenced):
        client.create_producer(topic, access_mode=Mode.Exclusive)
    for i in range(6):
        p1.send(str(i).encode(), partition_key=str(i))
    created: list[pulsar.Producer] = []
    waiter = threading.Thread(
        target=lambda: created.append(
            client.create_producer(topic, access_mode=Mode.WaitForExclusive)
        ),
        daemon=True,
    )
    waiter.start()
    waiter.join(1.0)
    assert waiter.is_alive() and not created  # every partition queued it
    p1.close()
    waiter.join(10)
    assert len(created) == 1
    created[0].send(b"after", partition_key="k")


def _producer(
    raw: RawClient, topic: str, mode: int, epoch: int | None = None
) -> tuple[int, pb.BaseCommand]:
    """PRODUCER in ``mode``; returns the producer id and the broker's answer."""
    pid = raw.new_id()
    raw.send(
        commands.producer(
            topic=topic,
            producer_id=pid,
            request_id=raw.request_id(),
            access_mode=mode,
            topic_epoch=epoch,
        )
    )
    return pid, raw.recv(timeout=10).command


def test_topic_epoch_moves_and_an_older_one_is_fenced(broker: BrokerProcess, topic: str) -> None:
    with RawClient.to(broker.service_url) as raw:
        raw.handshake()
        shared_id, shared = _producer(raw, topic, pb.Shared)
        assert shared.type == T.PRODUCER_SUCCESS
        assert not shared.producer_success.HasField("topic_epoch")
        raw.send(commands.close_producer(producer_id=shared_id, request_id=raw.request_id()))
        assert raw.recv(timeout=10).command.type == T.SUCCESS
        first_id, first = _producer(raw, topic, pb.Exclusive)
        assert first.producer_success.topic_epoch == 0
        assert first.producer_success.producer_ready
        _, queued = _producer(raw, topic, pb.WaitForExclusive)
        assert queued.type == T.PRODUCER_SUCCESS
        assert not queued.producer_success.producer_ready
        _, fencing = _producer(raw, topic, pb.ExclusiveWithFencing)
        # Before the answer to the fencing producer: the waiting one fails, the holder closes.
        seen = {fencing.type: fencing}
        for _ in range(2):
            cmd = raw.recv(timeout=10).command
            seen[cmd.type] = cmd
        assert seen[T.CLOSE_PRODUCER].close_producer.producer_id == first_id
        assert seen[T.ERROR].error.error == pb.ProducerFenced
        assert seen[T.ERROR].error.message == "Fenced out"
        assert seen[T.PRODUCER_SUCCESS].producer_success.topic_epoch == 1
    with RawClient.to(broker.service_url) as raw:
        raw.handshake()
        _, stale = _producer(raw, topic, pb.Exclusive, epoch=0)
        assert stale.type == T.ERROR
        assert stale.error.error == pb.ProducerFenced
        assert stale.error.message == (
            "Topic epoch has already moved. Current epoch: 1, Producer epoch: 0"
        )


def test_topic_epoch_survives_a_restart(fresh_broker: BrokerProcess) -> None:
    topic = f"persistent://public/default/epoch-{uuid.uuid4().hex[:8]}"
    fresh_broker.start()
    for expected in (0, 1):
        with RawClient.to(fresh_broker.service_url) as raw:
            raw.handshake()
            assert _producer(raw, topic, pb.Exclusive)[1].producer_success.topic_epoch == expected
    fresh_broker.restart()
    with RawClient.to(fresh_broker.service_url) as raw:
        raw.handshake()
        _, stale = _producer(raw, topic, pb.Exclusive, epoch=0)
        assert stale.type == T.ERROR and stale.error.error == pb.ProducerFenced
        assert _producer(raw, topic, pb.Exclusive)[1].producer_success.topic_epoch == 2


def test_send_before_ready_closes_the_connection(broker: BrokerProcess, topic: str) -> None:
    with RawClient.to(broker.service_url) as holder, RawClient.to(broker.service_url) as raw:
        holder.handshake()
        assert _producer(holder, topic, pb.Exclusive)[1].type == T.PRODUCER_SUCCESS
        raw.handshake()
        pid, queued = _producer(raw, topic, pb.WaitForExclusive)
        assert not queued.producer_success.producer_ready
        name = queued.producer_success.producer_name
        raw.send(raw.send_frame(pid, name, 0, b"too early"))
        raw.wait_closed()
        # The queued producer went with its connection: the holder's leaving admits no one,
        # and a new exclusive producer gets the topic.
        holder.send(commands.close_producer(producer_id=1, request_id=holder.request_id()))
        assert holder.recv(timeout=10).command.type == T.SUCCESS
        assert _producer(holder, topic, pb.Exclusive)[1].producer_success.topic_epoch == 1
