"""Retention of consumed ledgers by time and size, and message TTL expiry."""

from __future__ import annotations

import time

import pulsar

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client


def ledger_count(broker: BrokerProcess, path: str) -> int:
    status, internal = broker.admin("GET", path + "/internalStats")
    assert status == 200
    return len(internal["ledgers"])


def consume_all(client: pulsar.Client, topic: str, n: int) -> None:
    consumer = client.subscribe(topic, "s", initial_position=pulsar.InitialPosition.Earliest)
    for _ in range(n):
        consumer.acknowledge(consumer.receive(timeout_millis=5000))
    consumer.close()


def test_infinite_retention_keeps_consumed_ledgers(fresh_broker: BrokerProcess, topic: str) -> None:
    fresh_broker.conf.update(
        managedLedgerMaxEntriesPerLedger=5,
        defaultRetentionTimeInMinutes=-1,
        defaultRetentionSizeInMB=-1,
    )
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    client.subscribe(topic, "s").close()
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(20):
        producer.send(str(i).encode())
    consume_all(client, topic, 20)
    time.sleep(2.5)
    assert ledger_count(fresh_broker, path) == 4
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [int(reader.read_next(5000).data()) for _ in range(20)] == list(range(20))
    client.close()


def test_size_retention_deletes_oldest_consumed_ledgers(
    fresh_broker: BrokerProcess, topic: str
) -> None:
    fresh_broker.conf.update(
        managedLedgerMaxEntriesPerLedger=5,
        defaultRetentionTimeInMinutes=-1,
        defaultRetentionSizeInMB=1,
    )
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    client.subscribe(topic, "s").close()
    producer = client.create_producer(topic, batching_enabled=False)
    payload = b"x" * (150 * 1024)
    for _ in range(21):  # 4 full ledgers of 750 KB, and one more entry in the fifth
        producer.send(payload)
    consume_all(client, topic, 21)
    deadline = time.monotonic() + 10
    while ledger_count(fresh_broker, path) > 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    # Consumed ledgers 1-4 hold 3 MB; keeping at most 1 MB leaves one of them (750 KB).
    assert ledger_count(fresh_broker, path) == 2
    client.close()


def test_message_ttl_expires_backlog(fresh_broker: BrokerProcess, topic: str) -> None:
    fresh_broker.conf.update(
        ttlDurationDefaultInSeconds=1, messageExpiryCheckIntervalInMinutes=0.01
    )
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    client.subscribe(topic, "s").close()
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(5):
        producer.send(str(i).encode())
    deadline = time.monotonic() + 10
    backlog = None
    while time.monotonic() < deadline:
        _, stats = fresh_broker.admin("GET", path + "/stats")
        backlog = stats["subscriptions"]["s"]["msgBacklog"]
        if backlog == 0:
            break
        time.sleep(0.2)
    assert backlog == 0
    assert stats["subscriptions"]["s"]["lastExpireTimestamp"] > 0
    producer.send(b"fresh")
    consumer = client.subscribe(topic, "s")
    assert consumer.receive(timeout_millis=5000).data() == b"fresh"
    client.close()
