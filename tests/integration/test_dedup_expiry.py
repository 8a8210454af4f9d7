"""Producer names expire: with brokerDeduplicationProducerInactivityTimeoutMinutes a name with no
producer connected for that long is forgotten (last_sequence_id back to -1, its resends stored
again), while a connected producer keeps its state; a restart does not bring the name back."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client

TIMEOUT_MINUTES = 0.05  # 3 s, checked every second (a third of it)


@pytest.fixture
def expiring_broker() -> Iterator[BrokerProcess]:
    broker = BrokerProcess(
        conf={
            "brokerDeduplicationEnabled": "true",
            "brokerDeduplicationProducerInactivityTimeoutMinutes": str(TIMEOUT_MINUTES),
        }
    )
    try:
        yield broker.start()
    finally:
        broker.close()


def stored(client: pulsar.Client, topic: str) -> Counter[bytes]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out: Counter[bytes] = Counter()
    while reader.has_message_available():
        out[reader.read_next(timeout_millis=5000).data()] += 1
    reader.close()
    return out


def test_an_idle_producer_name_is_forgotten(expiring_broker: BrokerProcess, topic: str) -> None:
    client = make_client(expiring_broker.service_url)
    client.subscribe(topic, "keep", initial_position=pulsar.InitialPosition.Earliest).close()
    gone = client.create_producer(topic, producer_name="gone", batching_enabled=False)
    stays = client.create_producer(topic, producer_name="stays", batching_enabled=False)
    for i in range(5):
        gone.send(f"gone-{i}".encode(), sequence_id=i)
        stays.send(f"stays-{i}".encode(), sequence_id=i)
    gone.close()

    # Past the timeout plus a check (a generous margin: expiry needs at least this long).
    time.sleep(TIMEOUT_MINUTES * 60 * 2 + 2)
    # The connected producer kept its state: a resend is still a duplicate.
    first = stays.send(b"stays-2-again", sequence_id=2)
    assert stays.send(b"stays-5", sequence_id=5) != first
    again = client.create_producer(topic, producer_name="gone", batching_enabled=False)
    assert again.last_sequence_id() == -1
    # Forgotten means a resend of an old id is stored again (as with Pulsar).
    again.send(b"gone-3-resent", sequence_id=3)
    again.close()
    stays.close()
    data = stored(client, topic)
    assert data[b"stays-2-again"] == 0 and data[b"stays-5"] == 1
    assert data[b"gone-3-resent"] == 1
    assert all(data[f"{p}-{i}".encode()] == 1 for p in ("gone", "stays") for i in range(5))
    client.close()

    # The purge was snapshotted: a crash and a replay do not bring "gone"'s old state (4)
    # back. It wrote id 3 since, so that is what it gets, or -1 if that was purged too (the
    # timeout may pass again on a slow machine).
    expiring_broker.restart(crash=True)
    client = make_client(expiring_broker.service_url)
    assert client.create_producer(topic, producer_name="gone").last_sequence_id() in (3, -1)
    client.close()
