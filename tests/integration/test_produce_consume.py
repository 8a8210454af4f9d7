"""Produce and consume with the official client: every subscription type, batching, compression."""

from __future__ import annotations

import time
from collections import defaultdict

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client

RECEIVE_MS = 5000


def drain(consumer: pulsar.Consumer, n: int, *, ack: bool = True) -> list[pulsar.Message]:
    """Receive exactly ``n`` messages (acking them), failing on timeout."""
    out = []
    for _ in range(n):
        msg = consumer.receive(timeout_millis=RECEIVE_MS)
        out.append(msg)
        if ack:
            consumer.acknowledge(msg)
    return out


def assert_nothing_more(consumer: pulsar.Consumer, wait_ms: int = 300) -> None:
    with pytest.raises(pulsar.Timeout):
        consumer.receive(timeout_millis=wait_ms)


def test_exclusive_round_trip_keeps_fields(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = []
    for i in range(20):
        ids.append(
            producer.send(
                f"m{i}".encode(),
                partition_key=f"k{i % 3}",
                ordering_key=f"o{i}" if i % 2 else None,
                properties={"i": str(i)},
                event_timestamp=1_000 + i,
            )
        )
    msgs = drain(consumer, 20)
    assert [m.data() for m in msgs] == [f"m{i}".encode() for i in range(20)]
    assert [m.message_id() for m in msgs] == ids
    for i, m in enumerate(msgs):
        assert m.partition_key() == f"k{i % 3}"
        assert m.properties() == {"i": str(i)}
        assert m.event_timestamp() == 1_000 + i
        if i % 2:
            assert m.ordering_key() == f"o{i}"
        assert m.redelivery_count() == 0
    assert_nothing_more(consumer)


@pytest.mark.parametrize(
    "compression",
    [
        pulsar.CompressionType.NONE,
        pulsar.CompressionType.LZ4,
        pulsar.CompressionType.ZLib,
        pulsar.CompressionType.ZSTD,
        pulsar.CompressionType.SNAPPY,
    ],
)
@pytest.mark.parametrize("batching", ["off", "default", "key_based"])
def test_batching_and_compression(
    client: pulsar.Client, topic: str, compression: pulsar.CompressionType, batching: str
) -> None:
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    kwargs: dict[str, object] = {"compression_type": compression}
    if batching == "off":
        kwargs["batching_enabled"] = False
    else:
        kwargs.update(
            batching_enabled=True,
            batching_max_publish_delay_ms=5,
            batching_type=pulsar.BatchingType.KeyBased
            if batching == "key_based"
            else pulsar.BatchingType.Default,
        )
    producer = client.create_producer(topic, **kwargs)
    sent_ids = []
    for i in range(200):
        producer.send_async(
            (f"payload-{i}-" + "x" * (i % 50)).encode(),
            lambda res, mid: sent_ids.append((res, mid)),
            partition_key=f"key-{i % 7}",
        )
    producer.flush()
    assert len(sent_ids) == 200
    assert all(res == pulsar.Result.Ok for res, _ in sent_ids)
    msgs = drain(consumer, 200)
    by_key: dict[str, list[int]] = defaultdict(list)
    for m in msgs:
        i = int(m.data().decode().split("-")[1])
        by_key[m.partition_key()].append(i)
    assert sorted(i for v in by_key.values() for i in v) == list(range(200))
    for key, seq in by_key.items():
        assert seq == sorted(seq), key
        assert all(f"key-{i % 7}" == key for i in seq)
    assert_nothing_more(consumer)


def test_shared_spreads_over_consumers(client: pulsar.Client, topic: str) -> None:
    c1 = client.subscribe(
        topic, "sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10
    )
    c2 = client.subscribe(
        topic, "sub", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(100):
        producer.send(str(i).encode())
    got: dict[int, int] = {}
    seen: set[bytes] = set()
    deadline = time.monotonic() + 10
    while len(seen) < 100 and time.monotonic() < deadline:
        for idx, c in enumerate((c1, c2)):
            try:
                m = c.receive(timeout_millis=50)
            except pulsar.Timeout:
                continue
            seen.add(m.data())
            got[idx] = got.get(idx, 0) + 1
            c.acknowledge(m)
    assert len(seen) == 100
    assert got.get(0, 0) > 0 and got.get(1, 0) > 0


def test_key_shared_routes_each_key_to_one_consumer(client: pulsar.Client, topic: str) -> None:
    consumers = [
        client.subscribe(
            topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=f"c{i}"
        )
        for i in range(3)
    ]
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(300):
        producer.send(str(i).encode(), partition_key=f"key-{i % 20}")
    owner: dict[str, int] = {}
    order: dict[str, list[int]] = defaultdict(list)
    total = 0
    deadline = time.monotonic() + 15
    while total < 300 and time.monotonic() < deadline:
        for idx, c in enumerate(consumers):
            try:
                m = c.receive(timeout_millis=20)
            except pulsar.Timeout:
                continue
            key = m.partition_key()
            assert owner.setdefault(key, idx) == idx, f"{key} went to two consumers"
            order[key].append(int(m.data()))
            c.acknowledge(m)
            total += 1
    assert total == 300
    for seq in order.values():
        assert seq == sorted(seq)
    assert len(set(owner.values())) > 1


def test_failover_has_one_active_consumer(client: pulsar.Client, topic: str) -> None:
    c1 = client.subscribe(
        topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="a"
    )
    c2 = client.subscribe(
        topic, "fo", consumer_type=pulsar.ConsumerType.Failover, consumer_name="b"
    )
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(10):
        producer.send(str(i).encode())
    msgs = drain(c1, 10)
    assert [int(m.data()) for m in msgs] == list(range(10))
    assert_nothing_more(c2)
    c1.close()
    for i in range(10, 15):
        producer.send(str(i).encode())
    msgs = drain(c2, 5)
    assert [int(m.data()) for m in msgs] == list(range(10, 15))


def test_exclusive_refuses_second_consumer(client: pulsar.Client, topic: str) -> None:
    client.subscribe(topic, "ex")
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(topic, "ex")


def test_producer_name_is_unique_per_topic(client: pulsar.Client, topic: str) -> None:
    client.create_producer(topic, producer_name="p1")
    with pytest.raises(pulsar.ProducerBusy):
        client.create_producer(topic, producer_name="p1")


def test_nack_redelivers_with_growing_count(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(
        topic,
        "nack",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
    )
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"x")
    counts = []
    for _ in range(3):
        m = consumer.receive(timeout_millis=RECEIVE_MS)
        counts.append(m.redelivery_count())
        consumer.negative_acknowledge(m)
    m = consumer.receive(timeout_millis=RECEIVE_MS)
    counts.append(m.redelivery_count())
    consumer.acknowledge(m)
    assert counts == [0, 1, 2, 3]


def test_dead_letter_policy(client: pulsar.Client, topic: str) -> None:
    dlq = topic + "-dlq"
    consumer = client.subscribe(
        topic,
        "dl",
        consumer_type=pulsar.ConsumerType.Shared,
        negative_ack_redelivery_delay_ms=100,
        dead_letter_policy=pulsar.ConsumerDeadLetterPolicy(
            max_redeliver_count=2, dead_letter_topic=dlq
        ),
    )
    dlq_consumer = client.subscribe(dlq, "check", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"poison")
    for _ in range(3):
        m = consumer.receive(timeout_millis=RECEIVE_MS)
        consumer.negative_acknowledge(m)
    dead = dlq_consumer.receive(timeout_millis=10_000)
    assert dead.data() == b"poison"


def test_ack_timeout_redelivers(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(
        topic, "ackt", consumer_type=pulsar.ConsumerType.Shared, unacked_messages_timeout_ms=10_001
    )
    producer = client.create_producer(topic, batching_enabled=False)
    producer.send(b"a")
    first = consumer.receive(timeout_millis=RECEIVE_MS)
    again = consumer.receive(timeout_millis=20_000)
    assert again.message_id() == first.message_id()
    assert again.redelivery_count() >= 1
    consumer.acknowledge(again)


def test_reader_from_earliest_and_latest(client: pulsar.Client, topic: str) -> None:
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(str(i).encode()) for i in range(5)]
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    got = []
    while reader.has_message_available():
        got.append(reader.read_next(timeout_millis=RECEIVE_MS).message_id())
    assert got == ids
    latest = client.create_reader(topic, pulsar.MessageId.latest)
    assert not latest.has_message_available()
    new_id = producer.send(b"new")
    assert latest.read_next(timeout_millis=RECEIVE_MS).message_id() == new_id
    from_third = client.create_reader(topic, ids[2])
    assert from_third.read_next(timeout_millis=RECEIVE_MS).message_id() == ids[3]


def test_seek_by_id_and_time(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "seek", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = []
    for i in range(10):
        ids.append(producer.send(str(i).encode()))
        if i == 4:
            time.sleep(0.05)
            mid_time = int(time.time() * 1000)
            time.sleep(0.05)
    drain(consumer, 10)
    # The broker restarts delivery at the target; this client then skips the target itself
    # (start_message_id_inclusive defaults to False), as against Pulsar.
    consumer.seek(ids[2])
    again = drain(consumer, 7)
    assert [m.message_id() for m in again] == ids[3:]
    consumer.seek(mid_time)
    again = drain(consumer, 5)
    assert [int(m.data()) for m in again] == [5, 6, 7, 8, 9]


def test_get_last_message_id(client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "last")
    producer = client.create_producer(topic, batching_enabled=False)
    last = None
    for i in range(3):
        last = producer.send(str(i).encode())
    assert consumer.get_last_message_id() == last


def test_unsubscribe_deletes_subscription(
    broker: BrokerProcess, client: pulsar.Client, topic: str
) -> None:
    consumer = client.subscribe(topic, "gone")
    consumer.unsubscribe()
    status, subs = broker.admin(
        "GET", "/admin/v2/persistent/" + topic[len("persistent://") :] + "/subscriptions"
    )
    assert status == 200 and "gone" not in subs


def test_partitioned_topic(broker: BrokerProcess, client: pulsar.Client, topic: str) -> None:
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    status, _ = broker.admin("PUT", path + "/partitions", 3)
    assert status == 204
    assert client.get_topic_partitions(topic) == [f"{topic}-partition-{i}" for i in range(3)]
    consumer = client.subscribe(topic, "p", initial_position=pulsar.InitialPosition.Earliest)
    producer = client.create_producer(topic, batching_enabled=False)
    for i in range(30):
        producer.send(str(i).encode(), partition_key=f"k{i}")
    msgs = drain(consumer, 30)
    assert sorted(int(m.data()) for m in msgs) == list(range(30))
    assert {m.message_id().partition() for m in msgs} == {0, 1, 2}
    status, stats = broker.admin("GET", path + "/partitioned-stats")
    assert status == 200
    assert stats["msgInCounter"] == 30
    assert stats["metadata"]["partitions"] == 3


def test_stats_field_names(broker: BrokerProcess, client: pulsar.Client, topic: str) -> None:
    consumer = client.subscribe(topic, "st", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False, producer_name="prod-st")
    for i in range(5):
        producer.send(str(i).encode())
    drain(consumer, 3)
    path = "/admin/v2/persistent/" + topic[len("persistent://") :]
    deadline = time.monotonic() + 5
    while True:
        status, stats = broker.admin("GET", path + "/stats")
        assert status == 200
        sub = stats["subscriptions"]["st"]
        if sub["msgBacklog"] == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert stats["msgInCounter"] == 5
    assert stats["publishers"][0]["producerName"] == "prod-st"
    assert sub["type"] == "Shared"
    assert sub["msgBacklog"] == 2
    assert sub["unackedMessages"] == 2
    assert len(sub["consumers"]) == 1
    assert stats["storageSize"] > 0
    status, internal = broker.admin("GET", path + "/internalStats")
    assert status == 200
    assert "st" in internal["cursors"]
    assert "markDeletePosition" in internal["cursors"]["st"]


def test_unknown_topic_stats_is_404(broker: BrokerProcess) -> None:
    status, body = broker.admin("GET", "/admin/v2/persistent/public/default/nope-nope/stats")
    assert status == 404
    assert "reason" in body


def test_restart_keeps_messages_and_positions(fresh_broker: BrokerProcess, topic: str) -> None:
    # Keep consumed ledgers: under the default retention the reader below would race with
    # the deletion of the ledger every message of which "dur" has acked.
    fresh_broker.conf.update(defaultRetentionTimeInMinutes=-1, defaultRetentionSizeInMB=-1)
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    consumer = client.subscribe(topic, "dur", consumer_type=pulsar.ConsumerType.Shared)
    producer = client.create_producer(topic, batching_enabled=False)
    ids = [producer.send(str(i).encode()) for i in range(10)]
    msgs = drain(consumer, 10, ack=False)
    for m in msgs:
        if int(m.data()) in (0, 1, 2, 5, 7):
            consumer.acknowledge(m)
    time.sleep(0.5)  # the client groups acks for 100 ms
    client.close()
    assert fresh_broker.stop() == 0
    fresh_broker.start(same_ports=True)
    client = make_client(fresh_broker.service_url)
    consumer = client.subscribe(topic, "dur", consumer_type=pulsar.ConsumerType.Shared)
    got = sorted(int(m.data()) for m in drain(consumer, 5))
    assert got == [3, 4, 6, 8, 9]
    assert_nothing_more(consumer)
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    assert [reader.read_next(RECEIVE_MS).message_id() for _ in range(10)] == ids
    client.close()


def test_chunked_messages_are_reassembled(fresh_broker: BrokerProcess, topic: str) -> None:
    """A message over maxMessageSize is sent in chunks (the client splits, the broker stores
    and dispatches each chunk as it is); consumers reassemble it. On Key_Shared every chunk of
    a message routes by the same key (its own, else producerName-sequenceId), so one consumer
    gets them all."""
    fresh_broker.conf["maxMessageSize"] = 64 * 1024
    fresh_broker.start()
    client = make_client(fresh_broker.service_url)
    exclusive = client.subscribe(topic, "whole", consumer_type=pulsar.ConsumerType.Exclusive)
    key_shared = [
        client.subscribe(
            topic, "ks", consumer_type=pulsar.ConsumerType.KeyShared, consumer_name=f"c{i}"
        )
        for i in range(2)
    ]
    producer = client.create_producer(topic, chunking_enabled=True, batching_enabled=False)
    payloads = [bytes([i]) * (150 * 1024 + i) for i in range(6)]
    for i, data in enumerate(payloads):
        # Half keyed, half not (those route by producerName-sequenceId).
        keyed = {"partition_key": f"k{i}"} if i % 2 else {}
        producer.send(data, **keyed)
    assert [m.data() for m in drain(exclusive, len(payloads))] == payloads
    got: list[bytes] = []
    for c in key_shared:
        while True:
            try:
                msg = c.receive(timeout_millis=1500)
            except pulsar.Timeout:
                break
            got.append(msg.data())
            c.acknowledge(msg)
    assert sorted(got) == sorted(payloads)
    status, stats = fresh_broker.admin(
        "GET", "/admin/v2/" + topic.replace("://", "/") + "/internalStats"
    )
    assert status == 200
    assert stats["numberOfEntries"] >= 3 * len(payloads), "each message went as several chunks"
    client.close()
