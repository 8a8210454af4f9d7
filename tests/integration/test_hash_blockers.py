"""What blocks this hash: the admin endpoint that names the holder of a draining hash."""

from __future__ import annotations

import time
from urllib.parse import quote

import pulsar

from tests.broker_process import BrokerProcess


def test_hash_blockers_names_the_draining_consumer_and_its_unacked_ids(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    c1 = client.subscribe(
        topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="c1"
    )
    producer = client.create_producer(topic, batching_enabled=False)
    keys = [f"key-{i}" for i in range(40)]
    held: dict[str, list[str]] = {}
    for k in keys:
        mid = producer.send(k.encode(), partition_key=k)
        held.setdefault(k, []).append(f"{mid.ledger_id()}:{mid.entry_id()}")
    for _ in keys:
        c1.receive(timeout_millis=5000)  # received, never acked: c1 holds every key
    c2 = client.subscribe(
        topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name="c2"
    )
    moved = []
    deadline = time.monotonic() + 5
    while not moved and time.monotonic() < deadline:
        for k in keys:
            status, body = broker.admin(
                "GET", f"{path}/subscription/ks/hashBlockers?key={quote(k)}"
            )
            assert status == 200, body
            assert body["key"] == k
            if body["consumerName"] == "c2":
                moved.append((k, body))
            else:
                assert body["consumerName"] == "c1"
                assert body["draining"] is False
        time.sleep(0.05)
    assert moved, "no key moved to the new consumer"
    for k, body in moved:
        assert body["draining"] is True
        assert body["drainingConsumerName"] == "c1"
        assert body["unackedMessageIds"] == held[k]
    # The same answer by hash, and the consumer stats agree.
    k, body = moved[0]
    status, by_hash = broker.admin(
        "GET", f"{path}/subscription/ks/hashBlockers?hash={body['hash']}"
    )
    assert status == 200 and by_hash["drainingConsumerName"] == "c1"
    status, stats = broker.admin("GET", path + "/stats")
    c1_stats = next(
        c for c in stats["subscriptions"]["ks"]["consumers"] if c["consumerName"] == "c1"
    )
    assert c1_stats["drainingHashesCount"] == len({b["hash"] for _, b in moved})
    assert {d["hash"] for d in c1_stats["drainingHashes"]} == {b["hash"] for _, b in moved}
    c2.close()
    c1.close()


def test_hash_blockers_errors(broker: BrokerProcess, client: pulsar.Client, topic: str) -> None:
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    status, _ = broker.admin("GET", f"{path}/subscription/shared/hashBlockers?hash=5")
    assert status == 409
    status, _ = broker.admin("GET", f"{path}/subscription/nope/hashBlockers?hash=5")
    assert status == 404
    client.subscribe(topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared)
    status, _ = broker.admin("GET", f"{path}/subscription/ks/hashBlockers")
    assert status == 409
    status, _ = broker.admin("GET", f"{path}/subscription/ks/hashBlockers?hash=70000")
    assert status == 422
