"""Consumed ledgers are deleted (Pulsar's default retention); unconsumed ones are kept."""

from __future__ import annotations

import time

import pulsar

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client


def ledger_ids(broker: BrokerProcess, path: str) -> list[int]:
    status, internal = broker.admin("GET", path + "/internalStats")
    assert status == 200
    return [led["ledgerId"] for led in internal["ledgers"]]


def test_consumed_ledgers_are_trimmed(fresh_broker: BrokerProcess, topic: str) -> None:
    fresh_broker.conf["managedLedgerMaxEntriesPerLedger"] = 5
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    fast = client.subscribe(topic, "fast", initial_position=pulsar.InitialPosition.Earliest)
    slow = client.subscribe(topic, "slow", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(23):
        producer.send(str(i).encode())
    assert len(ledger_ids(fresh_broker, path)) == 5
    for _ in range(23):
        fast.acknowledge(fast.receive(timeout_millis=5000))
    # "slow" acks only the first 11: ledgers holding entries 0..9 can go, the rest must stay.
    for _ in range(11):
        slow.acknowledge(slow.receive(timeout_millis=5000))
    deadline = time.monotonic() + 10
    while len(ledger_ids(fresh_broker, path)) > 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(ledger_ids(fresh_broker, path)) == 3
    # Everything "slow" has not acked is still readable, after a restart too.
    client.close()
    fresh_broker.restart()
    client = make_client(fresh_broker.service_url)
    slow = client.subscribe(topic, "slow")
    got = [int(slow.receive(timeout_millis=5000).data()) for _ in range(12)]
    assert got == list(range(11, 23))
    client.close()
