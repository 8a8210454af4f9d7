"""Batch writes: routing, metadata, key-based batch entries, and exactly-once re-runs."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from keyshared.spark.sink import partition_for_key
from tests.broker_process import BrokerProcess
from tests.spark.conftest import admin_path, produce, seq_of
from tests.spark.test_stream import check_exact_copy, read_topic


def test_batch_write(spark: Any, dedup_broker: BrokerProcess, new_topic: Any) -> None:
    """At-least-once write of a DataFrame to a 3-partition topic, on a broker with
    deduplication on (the key-sorted chunks keep the client's sequence ids rising)."""
    broker = dedup_broker
    topic = new_topic("out")
    assert broker.admin("PUT", admin_path(topic) + "/partitions", 3)[0] == 204
    t0 = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)
    data = [
        (f"u{i % 11}", f"u{i % 11}:{i // 11 + 1}", {"n": str(i)}, t0 + dt.timedelta(seconds=i))
        for i in range(1100)
    ]
    df = spark.createDataFrame(
        data,
        "__key string, value string, __messageProperties map<string,string>, __eventTime timestamp",
    ).coalesce(1)  # one task: its rows go out in this order
    df.write.format("keyshared").option("service.url", broker.service_url).option(
        "topic", topic
    ).option("chunkRows", "300").mode("append").save()

    rows = (
        spark.read.format("keyshared")
        .option("service.url", broker.service_url)
        .option("admin.url", broker.web_url)
        .option("topic", topic)
        .load()
        .collect()
    )
    assert sorted(r["value"].decode() for r in rows) == sorted(d[1] for d in data)
    last: dict[str, int] = defaultdict(int)
    keys_of_entry: dict[tuple[str, int, int], set[str]] = defaultdict(set)
    for r in rows:  # read order: partition by partition, publish order
        key, n = seq_of(r["value"])
        assert n == last[key] + 1, (key, n)
        last[key] = n
        assert r["__partition"] == partition_for_key(key, 3)  # JavaStringHash routing
        i = int(r["__messageProperties"]["n"])
        assert r["__eventTime"].replace(tzinfo=dt.UTC) == data[i][3]
        keys_of_entry[(r["__topic"], r["__ledgerId"], r["__entryId"])].add(key)
    assert all(len(k) == 1 for k in keys_of_entry.values()), "an entry holds one key"
    assert len(keys_of_entry) < 200, "messages were batched"


def test_batch_write_exactly_once(
    spark: Any, dedup_broker: BrokerProcess, client_factory: Any, new_topic: Any, tmp_path: Path
) -> None:
    """A topic-to-topic batch copy fails after a partial write; re-running it completes the
    copy with no duplicate, and a third run adds nothing."""
    broker = dedup_broker
    source, sink = new_topic("esrc"), new_topic("edst")
    for t in (source, sink):
        assert broker.admin("PUT", admin_path(t) + "/partitions", 2)[0] == 204
    sent = produce(client_factory(broker), source, 900, batching="default")
    marker = tmp_path / "failed"

    def copy(**extra: str) -> None:
        w = (
            spark.read.format("keyshared")
            .option("service.url", broker.service_url)
            .option("admin.url", broker.web_url)
            .option("topic", source)
            .load()
            .write.format("keyshared")
            .option("service.url", broker.service_url)
            .option("topic", sink)
            .option("exactlyOnce", "true")
            .option("producerName", "bcopy")
            .option("chunkRows", "50")
        )
        for k, v in extra.items():
            w = w.option(k, v)
        w.mode("append").save()

    with pytest.raises(Exception, match="injected failure"):
        copy(testFailAfterRows="100", testFailMarker=str(marker))
    partial = len(read_topic(spark, broker, sink))
    assert 100 <= partial < 900
    copy(chunkRows="70")  # the sequence ids do not depend on the chunking
    check_exact_copy(read_topic(spark, broker, sink), sent)
    copy()
    assert len(read_topic(spark, broker, sink)) == 900
