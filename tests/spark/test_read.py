"""Batch reads with a real local SparkSession and a real broker."""

from __future__ import annotations

import json
from typing import Any

import pulsar

from keyshared.spark import register
from keyshared.spark.positions import count_between, ledgers_from_internal_stats, parse_acked_ranges
from tests.broker_process import BrokerProcess, quiet_logger
from tests.spark.conftest import admin_path, produce, seq_of


def _reader(spark: Any, broker: BrokerProcess, topic: str, admin: bool = True) -> Any:
    r = spark.read.format("keyshared").option("service.url", broker.service_url)
    if admin:
        r = r.option("admin.url", broker.web_url)
    return r.option("topic", topic)


def _check_order(rows: list[Any]) -> None:
    """Within each topic partition ids rise; within each key the producer's sequence rises."""
    last_id: dict[str, tuple[int, int, int]] = {}
    last_seq: dict[str, int] = {}
    for r in rows:
        mid = (r["__ledgerId"], r["__entryId"], r["__batchIndex"])
        assert mid > last_id.get(r["__topic"], (-1, -1, -1)), (r["__topic"], mid)
        last_id[r["__topic"]] = mid
        key, n = seq_of(r["value"])
        assert key == r["__key"]
        assert n == last_seq.get(key, 0) + 1, (key, n)
        last_seq[key] = n


def test_batch_read_partitioned_topic(
    spark: Any, broker: BrokerProcess, client: Any, new_topic: Any
) -> None:
    topic = new_topic("read")
    assert broker.admin("PUT", admin_path(topic) + "/partitions", 2)[0] == 204
    sent = produce(client, topic, 900, props=True)
    for part, prefix in enumerate("pq"):
        # One message per entry, straight to each partition: 45 entries > 40 a ledger, so
        # every partition rolls over whatever the batching above came to.
        produce(client, f"{topic}-partition-{part}", 45, batching=False, prefix=prefix)
    zlib = client.create_producer(
        topic,
        compression_type=pulsar.CompressionType.ZLib,
        batching_enabled=True,
        batching_type=pulsar.BatchingType.KeyBased,
    )
    for i in range(40):
        zlib.send_async(f"z{i % 2}:{i // 2 + 1}".encode(), None, partition_key=f"z{i % 2}")
    zlib.flush()
    zlib.close()
    total = 1030

    # The format is found with no register() call (pyspark_keyshared.DefaultSource).
    df = _reader(spark, broker, topic).load()
    assert df.rdd.getNumPartitions() == 2
    assert df.columns[:5] == ["value", "__key", "__orderingKey", "__topic", "__messageId"]
    parts = df.rdd.glom().collect()  # rows of each Spark partition, in the order read
    assert sorted(len(p) for p in parts) != [0, total] and sum(len(p) for p in parts) == total
    for part in parts:
        assert len({r["__topic"] for r in part}) == 1, "one topic partition per Spark partition"
        _check_order(part)
    rows = [r for p in parts for r in p]
    batched = sorted(r["value"] for r in rows if r["__batchIndex"] >= 0 and r["__key"][0] == "k")
    assert batched == sorted(v for _, v in sent)
    assert len({(r["__topic"], r["__ledgerId"]) for r in rows}) >= 4, "reads cross ledgers"
    by_value = {r["value"]: r for r in rows}
    first = by_value[sent[0][1]]
    assert first["__messageProperties"] == {"i": "0"}
    assert first["__orderingKey"] == b"ok0"
    assert first["__eventTime"].timestamp() == 1_700_000_000.0
    assert first["__publishTime"] is not None and first["__partition"] in (0, 1)
    mid = pulsar.MessageId.deserialize(first["__messageId"])
    assert (mid.ledger_id(), mid.entry_id(), mid.batch_index()) == (
        first["__ledgerId"],
        first["__entryId"],
        first["__batchIndex"],
    )
    # The official client's rows are the same, message ids byte for byte.
    client_parts = (
        _reader(spark, broker, topic).option("reader", "client").load().rdd.glom().collect()
    )
    assert sorted(map(tuple, rows)) == sorted(map(tuple, (r for p in client_parts for r in p)))
    plain = [r for r in rows if r["__batchIndex"] < 0]
    assert len(plain) == 90 and all(r["__eventTime"] is None for r in plain)

    # An offsets range: after a position, up to another (both per partition, inclusive end).
    p0 = sorted(
        (r for r in rows if r["__partition"] == 0),
        key=lambda r: r["__messageId"] and (r["__ledgerId"], r["__entryId"], r["__batchIndex"]),
    )
    entries = sorted({(r["__ledgerId"], r["__entryId"]) for r in p0})
    lo, hi = entries[3], entries[-5]
    name0 = p0[0]["__topic"]
    ranged = (
        _reader(spark, broker, topic)
        .option("startingOffsets", json.dumps({name0: f"{lo[0]}:{lo[1]}"}))
        .option(
            "endingOffsets",
            json.dumps({name0: f"{hi[0]}:{hi[1]}", p0[0]["__topic"][:-1] + "1": "-1:-1"}),
        )
        .load()
        .collect()
    )
    expect = [r["value"] for r in p0 if lo < (r["__ledgerId"], r["__entryId"]) <= hi]
    assert [r["value"] for r in ranged] == expect

    # More Spark partitions on request (order then holds only inside each split).
    split = _reader(spark, broker, topic).option("minPartitions", "5").load()
    assert split.rdd.getNumPartitions() >= 5
    assert sorted(r["value"] for r in split.select("value").collect()) == sorted(by_value)

    # Without admin.url: the end comes from GET_LAST_MESSAGE_ID, and the helper subscription
    # is removed afterwards.
    assert _reader(spark, broker, topic, admin=False).load().count() == total
    for i in (0, 1):
        subs = broker.admin("GET", admin_path(topic) + f"-partition-{i}/subscriptions")[1]
        assert subs == [], subs

    # A pattern over the namespace finds the partitioned topic (and nothing else).
    local = topic.rsplit("/", 1)[1]
    by_pattern = (
        spark.read.format("keyshared")
        .option("service.url", broker.service_url)
        .option("admin.url", broker.web_url)
        .option("topicsPattern", f"persistent://public/default/{local[:-2]}.*")
        .load()
    )
    assert by_pattern.rdd.getNumPartitions() == 2 and by_pattern.count() == total

    # Explicit registration works too.
    register(spark)
    k3 = _reader(spark, broker, topic).load().filter("__key = 'k3'").count()
    assert k3 == sum(1 for k, _ in sent if k == "k3")


def test_subscription_backlog_read(
    spark: Any, broker: BrokerProcess, client: Any, new_topic: Any
) -> None:
    """``subscription=NAME``: from the mark-delete position, acknowledged holes skipped."""
    topic = new_topic("backlog")
    consumer = client.subscribe(topic, "sub", initial_position=pulsar.InitialPosition.Earliest)
    produce(client, topic, 300, batching=False)
    acked: set[bytes] = set()
    received = []
    for i in range(300):
        msg = consumer.receive(5000)
        received.append(msg)
        if i < 40 or i in (50, 51, 52, 77, 130, 299) or 200 <= i < 250:
            consumer.acknowledge(msg)
            acked.add(msg.data())
    # Acks travel asynchronously: wait until the cursor shows them all.
    import time

    first40 = received[39].message_id()
    mdp = f"{first40.ledger_id()}:{first40.entry_id()}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = broker.admin("GET", admin_path(topic) + "/internalStats")[1]
        cur = stats["cursors"]["sub"]
        holes = cur["individuallyDeletedMessages"]
        ledgers = ledgers_from_internal_stats(stats)
        held = sum(count_between(ledgers, a, b) for a, b in parse_acked_ranges(holes))
        if cur["markDeletePosition"] == mdp and held == 56:  # 3 + 1 + 1 + 50 + 1
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"acks not seen: {cur}")
    df = _reader(spark, broker, topic).option("subscription", "sub").load()
    got = [r["value"] for r in df.collect()]
    expect = [m.data() for m in received if m.data() not in acked]
    assert got == expect
    consumer.close()


def test_data_loss(spark: Any, client: Any, new_topic: Any) -> None:
    """Entries deleted by retention before they are read: an error, or skipped on request."""
    import time

    import pytest

    from tests.broker_process import running_broker
    from tests.spark.conftest import BROKER_CONF

    conf = {**BROKER_CONF, "defaultRetentionTimeInMinutes": 0, "defaultRetentionSizeInMB": 0}
    with running_broker(conf=conf) as b:
        c = pulsar.Client(b.service_url, operation_timeout_seconds=10, logger=quiet_logger())
        topic = new_topic("loss")
        produce(c, topic, 130, batching=False)  # 4 ledgers of 40 entries; 3 get deleted
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            ledgers = b.admin("GET", admin_path(topic) + "/internalStats")[1]["ledgers"]
            if len(ledgers) == 1:
                break
            time.sleep(0.2)
        (live,) = ledgers
        assert live["entries"] == 10
        gone = f"{live['ledgerId'] - 2}:5"  # inside a deleted ledger
        reader = (
            spark.read.format("keyshared")
            .option("service.url", b.service_url)
            .option("admin.url", b.web_url)
            .option("topic", topic)
            .option("startingOffsets", json.dumps({topic: gone}))
        )
        with pytest.raises(Exception, match="DataLossError"):
            reader.option("pollTimeoutMs", "3000").load().collect()
        rows = reader.option("failOnDataLoss", "false").load().collect()
        assert [seq_of(r["value"]) for r in rows][-1] == ("k3", 19)
        assert len(rows) == 10
        c.close()
