"""Message deduplication (brokerDeduplicationEnabled): resends are confirmed, never stored twice."""

from __future__ import annotations

import pulsar

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client


def read_all(client: pulsar.Client, topic: str) -> list[bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    while reader.has_message_available():
        out.append(reader.read_next(timeout_millis=5000).data())
    reader.close()
    return out


def test_duplicates_get_original_id_and_survive_sigkill(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    fresh_broker.conf["brokerDeduplicationEnabled"] = "true"
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    # A durable subscription keeps the data: with Pulsar's default retention, consumed (or
    # unsubscribed) ledgers are deleted once closed, and a restart closes the current one.
    client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest).close()
    producer = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert producer.last_sequence_id() == -1
    ids = [producer.send(f"m{i}".encode(), sequence_id=i) for i in range(10)]
    # A resend of an already stored sequence id gets the original id back and stores nothing.
    again = producer.send(b"m5-again", sequence_id=5)
    assert again == ids[5]
    assert read_all(client, topic) == [f"m{i}".encode() for i in range(10)]
    client.close()

    fresh_broker.restart(crash=True)
    client = make_client(fresh_broker.service_url)
    producer = client.create_producer(topic, producer_name="dedup-p", batching_enabled=False)
    assert producer.last_sequence_id() == 9
    producer.send(b"old", sequence_id=3)
    new_id = producer.send(b"m10", sequence_id=10)
    assert new_id not in ids
    assert read_all(client, topic) == [f"m{i}".encode() for i in range(11)]
    client.close()


def test_without_dedup_resends_are_stored(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    producer = client.create_producer(topic, producer_name="nodedup", batching_enabled=False)
    producer.send(b"a", sequence_id=0)
    producer.send(b"b", sequence_id=0)
    assert read_all(client, topic) == [b"a", b"b"]
    client.close()
