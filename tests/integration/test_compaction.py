"""Topic compaction with the official client: the compacted view keeps the latest message of
every key under its original message id, deletes keys on empty payloads, follows with the rest
of the topic, and survives restarts; admin-triggered and threshold-triggered."""

from __future__ import annotations

import threading
import time
from typing import Any

import pulsar
import pytest

from tests.broker_process import BrokerProcess
from tests.integration.conftest import make_client

pytestmark = pytest.mark.integration

Mid = tuple[int, int, int]


def mid(m: Any) -> Mid:
    return (m.ledger_id(), m.entry_id(), m.batch_index())


def admin_path(topic: str) -> str:
    return "/admin/v2/persistent/" + topic.removeprefix("persistent://")


def compact(broker: BrokerProcess, topic: str, timeout: float = 20.0) -> dict[str, Any]:
    status, _ = broker.admin("PUT", admin_path(topic) + "/compaction")
    assert status == 204
    return wait_compaction(broker, topic, timeout)


def wait_compaction(broker: BrokerProcess, topic: str, timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        status, body = broker.admin("GET", admin_path(topic) + "/compaction")
        assert status == 200, body
        if body["status"] in ("SUCCESS", "ERROR") or time.monotonic() > deadline:
            assert body["status"] == "SUCCESS", body
            return dict(body)
        time.sleep(0.05)


def drain(reader: Any, idle_ms: int = 700) -> list[tuple[str, bytes, Mid]]:
    """Everything the reader or consumer delivers until it is idle."""
    out = []
    read = reader.read_next if hasattr(reader, "read_next") else reader.receive
    while True:
        try:
            m = read(idle_ms)
        except pulsar.Timeout:
            return out
        out.append((m.partition_key(), m.data(), mid(m.message_id())))


def send_keyed(producer: Any, items: list[tuple[str, bytes]]) -> list[Mid]:
    """Send asynchronously (so batches form); the ids in send order."""
    ids: list[Mid | None] = [None] * len(items)
    done = threading.Event()
    left = [len(items)]
    lock = threading.Lock()

    def callback(i: int) -> Any:
        def cb(res: Any, msg_id: Any) -> None:
            assert res == pulsar.Result.Ok, res
            ids[i] = mid(msg_id)
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

        return cb

    for i, (key, value) in enumerate(items):
        producer.send_async(value, callback(i), partition_key=key)
    producer.flush()
    assert done.wait(20)
    return [i for i in ids if i is not None]


def expected_view(items: list[tuple[str, bytes]], ids: list[Mid]) -> list[tuple[str, bytes, Mid]]:
    """The latest message of each key, deleted keys left out, in id order."""
    latest: dict[str, tuple[str, bytes, Mid]] = {}
    for (key, value), i in zip(items, ids, strict=True):
        if value:
            latest[key] = (key, value, i)
        else:
            latest.pop(key, None)
    return sorted(latest.values(), key=lambda t: t[2])


def test_reader_sees_latest_per_key_then_the_tail(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        items = [(f"k{k}", f"{k}-{v}".encode()) for v in range(5) for k in range(6)]
        items.append(("k3", b""))  # deletes k3
        items.append(("k5", b"5-last"))
        ids = [mid(producer.send(value, partition_key=key)) for key, value in items]
        status, body = broker.admin("GET", admin_path(topic) + "/compaction")
        assert (status, body) == (200, {"status": "NOT_RUN", "lastError": ""})
        compact(broker, topic)
        tail = [("k0", b"tail-0"), ("k1", b"tail-1"), ("k0", b"tail-2")]
        tail_ids = [mid(producer.send(v, partition_key=k)) for k, v in tail]

        view = expected_view(items, ids)
        assert [k for k, _, _ in view] == ["k0", "k1", "k2", "k4", "k5"]
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        got = drain(reader)
        assert got == view + [(k, v, i) for (k, v), i in zip(tail, tail_ids, strict=True)]

        plain = client.create_reader(topic, pulsar.MessageId.earliest)
        assert len(drain(plain)) == len(items) + len(tail)
    finally:
        client.close()


def test_key_based_batches_keep_batch_indexes(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_type=pulsar.BatchingType.KeyBased,
            batching_max_messages=50,
            batching_max_publish_delay_ms=50,
        )
        items = [(f"k{i % 7}", f"v{i}".encode()) for i in range(140)]
        items += [("k2", b""), ("k6", b"")]
        ids = send_keyed(producer, items)
        assert any(i[2] > 0 for i in ids), "the producer did not batch"
        compact(broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert drain(reader) == expected_view(items, ids)
    finally:
        client.close()


@pytest.mark.parametrize(
    "compression",
    [
        pulsar.CompressionType.LZ4,
        pulsar.CompressionType.ZSTD,
        pulsar.CompressionType.ZLib,
        pulsar.CompressionType.SNAPPY,
    ],
    ids=["lz4", "zstd", "zlib", "snappy"],
)
def test_compressed_mixed_key_batches(broker: BrokerProcess, topic: str, compression: Any) -> None:
    """Default batching mixes keys in one batch: survivors keep their index, the rest are
    compacted out of the (decompressed, rewritten) batch."""
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=True,
            batching_max_messages=20,
            batching_max_publish_delay_ms=50,
            compression_type=compression,
        )
        items = [(f"k{i % 5}", f"value-{i}".encode() * 4) for i in range(100)]
        items.append(("k1", b""))
        ids = send_keyed(producer, items)
        compact(broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert drain(reader) == expected_view(items, ids)
    finally:
        client.close()


def test_second_compaction_merges_with_the_first(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        first = [(f"k{i % 4}", f"a{i}".encode()) for i in range(12)]
        ids = [mid(producer.send(v, partition_key=k)) for k, v in first]
        compact(broker, topic)
        second = [("k1", b"b1"), ("k9", b"b9"), ("k2", b"")]
        ids += [mid(producer.send(v, partition_key=k)) for k, v in second]
        compact(broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert drain(reader) == expected_view(first + second, ids)
        _, stats = broker.admin("GET", admin_path(topic) + "/internalStats")
        horizon = "{}:{}".format(*ids[-1][:2])
        assert stats["cursors"]["__compaction"]["markDeletePosition"] == horizon
    finally:
        client.close()


def test_exclusive_subscription_reads_compacted_and_acks(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        items = [(f"k{i % 3}", f"v{i}".encode()) for i in range(9)]
        ids = [mid(producer.send(v, partition_key=k)) for k, v in items]
        compact(broker, topic)
        consumer = client.subscribe(
            topic,
            "compacted-sub",
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Earliest,
            is_read_compacted=True,
        )
        got = []
        for _ in range(3):
            m = consumer.receive(5000)
            got.append((m.partition_key(), m.data(), mid(m.message_id())))
            consumer.acknowledge(m)
        assert got == expected_view(items, ids)
        consumer.close()
        # Everything it acked stays acked: a new consumer of the subscription gets the tail only.
        producer.send(b"after", partition_key="k0")
        consumer = client.subscribe(
            topic,
            "compacted-sub",
            consumer_type=pulsar.ConsumerType.Exclusive,
            is_read_compacted=True,
        )
        assert [d for _, d, _ in drain(consumer)] == [b"after"]
    finally:
        client.close()


def test_compaction_while_producing(broker: BrokerProcess, topic: str) -> None:
    """Values per key only grow in the compacted view plus tail, and the last one is there."""
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(
            topic, batching_enabled=True, batching_max_publish_delay_ms=5
        )
        stop = threading.Event()
        sent: dict[str, int] = {}

        def produce() -> None:
            n = 0
            while not stop.is_set():
                key = f"k{n % 20}"
                producer.send(str(n).encode(), partition_key=key)
                sent[key] = n
                n += 1

        worker = threading.Thread(target=produce)
        worker.start()
        try:
            time.sleep(0.3)
            compact(broker, topic)
            time.sleep(0.2)
            compact(broker, topic)
            time.sleep(0.2)
        finally:
            stop.set()
            worker.join(10)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        got = drain(reader)
        seen: dict[str, int] = {}
        for key, value, _ in got:
            assert int(value) > seen.get(key, -1), (key, value)
            seen[key] = int(value)
        assert seen == sent
        assert len({i for _, _, i in got}) == len(got)
    finally:
        client.close()


def test_status_and_errors(broker: BrokerProcess, topic: str) -> None:
    missing = admin_path(topic) + "-missing/compaction"
    assert broker.admin("GET", missing)[0] == 404
    assert broker.admin("PUT", missing)[0] == 404
    client = make_client(broker.service_url)
    try:
        client.create_producer(topic).send(b"x", partition_key="k")
    finally:
        client.close()
    body = compact(broker, topic)
    assert body == {"status": "SUCCESS", "lastError": ""}
    # Nothing new: compacting again is a no-op that succeeds.
    assert compact(broker, topic)["status"] == "SUCCESS"


def test_threshold_triggers_compaction(fresh_broker: BrokerProcess) -> None:
    fresh_broker.conf.update(
        brokerServiceCompactionThresholdInBytes=2000,
        brokerServiceCompactionMonitorIntervalInSeconds=1,
    )
    fresh_broker.start()
    topic = "persistent://public/default/threshold"
    client = make_client(fresh_broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        items = [(f"k{i % 3}", b"x" * 100 + str(i).encode()) for i in range(40)]
        ids = [mid(producer.send(v, partition_key=k)) for k, v in items]
        deadline = time.monotonic() + 15
        while True:
            _, body = fresh_broker.admin("GET", admin_path(topic) + "/compaction")
            if body["status"] == "SUCCESS" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert body["status"] == "SUCCESS"
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert drain(reader) == expected_view(items, ids)
    finally:
        client.close()


def test_namespace_and_topic_threshold_policies(broker: BrokerProcess, topic: str) -> None:
    ns = "/admin/v2/namespaces/public/default/compactionThreshold"
    client = make_client(broker.service_url)
    try:
        client.create_producer(topic).send(b"x", partition_key="k")
    finally:
        client.close()
    path = admin_path(topic) + "/compactionThreshold"
    assert broker.admin("GET", path) == (200, None)
    assert broker.admin("POST", path, 1234)[0] == 204
    assert broker.admin("GET", path) == (200, 1234)
    assert broker.admin("POST", path, -1)[0] == 412
    assert broker.admin("DELETE", path)[0] == 204
    assert broker.admin("GET", path) == (200, None)
    before = broker.admin("GET", ns)[1]
    try:
        assert broker.admin("PUT", ns, 5678)[0] == 204
        assert broker.admin("GET", ns) == (200, 5678)
    finally:
        broker.admin("DELETE", ns)
    assert broker.admin("GET", ns) == (200, before)


def test_compacted_view_survives_a_crash(fresh_broker: BrokerProcess) -> None:
    fresh_broker.start()
    topic = "persistent://public/default/restart"
    client = make_client(fresh_broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        items = [(f"k{i % 4}", f"v{i}".encode()) for i in range(20)] + [("k0", b"")]
        ids = [mid(producer.send(v, partition_key=k)) for k, v in items]
        compact(fresh_broker, topic)
    finally:
        client.close()
    fresh_broker.restart(crash=True)
    client = make_client(fresh_broker.service_url)
    try:
        assert fresh_broker.admin("GET", admin_path(topic) + "/compaction")[1]["status"] in (
            "NOT_RUN",
            "SUCCESS",
        )
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert drain(reader) == expected_view(items, ids)
        # And it compacts on top of what survived.
        producer = client.create_producer(topic, batching_enabled=False)
        extra = [("k1", b"new")]
        ids += [mid(producer.send(b"new", partition_key="k1"))]
        compact(fresh_broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert drain(reader) == expected_view(items + extra, ids)
    finally:
        client.close()


def test_has_message_available_ends_when_the_last_message_was_compacted_out(
    broker: BrokerProcess, topic: str
) -> None:
    """The topic's last message is a tombstone: a compacted reader's ``has_message_available``
    loop (the table-view pattern) must still end after the last kept message."""
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        items = [("a", b"1"), ("b", b"2"), ("a", b"3"), ("b", b"")]
        ids = [mid(producer.send(v, partition_key=k)) for k, v in items]
        compact(broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        got = []
        deadline = time.monotonic() + 10
        while reader.has_message_available() and time.monotonic() < deadline:
            m = reader.read_next(2000)
            got.append((m.partition_key(), m.data(), mid(m.message_id())))
        assert got == expected_view(items, ids)
        # A plain reader still sees the tombstone as the topic's last message.
        plain = client.create_reader(topic, pulsar.MessageId.earliest)
        n = 0
        while plain.has_message_available() and n < 10:
            plain.read_next(2000)
            n += 1
        assert n == len(items)
    finally:
        client.close()


def test_deleting_the_compaction_subscription_drops_the_view(
    broker: BrokerProcess, topic: str
) -> None:
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        for i in range(6):
            producer.send(f"v{i}".encode(), partition_key=f"k{i % 2}")
        compact(broker, topic)
        sub = admin_path(topic) + "/subscription/__compaction"
        assert broker.admin("DELETE", sub)[0] == 204
        status, body = broker.admin("GET", admin_path(topic) + "/compaction")
        assert (status, body["status"]) == (200, "NOT_RUN")
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert [d for _, d, _ in drain(reader)] == [f"v{i}".encode() for i in range(6)]
        # Compacting again builds a new view from the whole topic.
        compact(broker, topic)
        reader = client.create_reader(topic, pulsar.MessageId.earliest, is_read_compacted=True)
        assert [d for _, d, _ in drain(reader)] == [b"v4", b"v5"]
    finally:
        client.close()


def test_failover_consumers_read_the_compacted_view(broker: BrokerProcess, topic: str) -> None:
    client = make_client(broker.service_url)
    try:
        producer = client.create_producer(topic, batching_enabled=False)
        items = [(f"k{i % 3}", f"v{i}".encode()) for i in range(12)]
        ids = [mid(producer.send(v, partition_key=k)) for k, v in items]
        compact(broker, topic)
        consumer = client.subscribe(
            topic,
            "failover-sub",
            consumer_type=pulsar.ConsumerType.Failover,
            initial_position=pulsar.InitialPosition.Earliest,
            is_read_compacted=True,
        )
        assert drain(consumer) == expected_view(items, ids)
    finally:
        client.close()
