"""Streaming reads and writes: admission control, exactly-once through a sink failure after a
partial write and an abrupt stop, each followed by a restart from the checkpoint."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.broker_process import BrokerProcess
from tests.spark.conftest import admin_path, produce, seq_of
from tests.spark.stream_job import start_copy


def read_topic(spark: Any, broker: BrokerProcess, topic: str) -> list[Any]:
    """Every row of ``topic`` (value and position columns)."""
    return (
        spark.read.format("keyshared")
        .option("service.url", broker.service_url)
        .option("admin.url", broker.web_url)
        .option("topic", topic)
        .load()
        .select("__key", "value", "__partition", "__ledgerId", "__entryId", "__batchIndex")
        .collect()
    )


def check_exact_copy(rows: list[Any], sent: list[tuple[str, bytes]]) -> None:
    """Output = input: no duplicate, no gap, each key's messages in order in its partition."""
    got = [r["value"] for r in rows]
    if len(got) != len(set(got)):
        seen: dict[bytes, list[Any]] = defaultdict(list)
        for r in rows:
            seen[r["value"]].append(
                (r["__partition"], r["__ledgerId"], r["__entryId"], r["__batchIndex"])
            )
        dups = {v: p for v, p in seen.items() if len(p) > 1}
        raise AssertionError(f"{len(got) - len(set(got))} duplicates: {dups}")
    assert sorted(got) == sorted(v for _, v in sent), "lost or foreign rows"
    last: dict[str, int] = defaultdict(int)
    order = ("__partition", "__ledgerId", "__entryId", "__batchIndex")
    for r in sorted(rows, key=lambda r: tuple(r[c] for c in order)):
        key, n = seq_of(r["value"])
        assert n == last[key] + 1, (key, n, last[key])
        last[key] = n


def _commits(checkpoint: str) -> int:
    d = Path(checkpoint) / "commits"
    return len(list(d.glob("[0-9]*"))) if d.exists() else 0


def test_streaming_exactly_once(
    spark: Any, dedup_broker: BrokerProcess, client_factory: Any, new_topic: Any, tmp_path: Path
) -> None:
    broker = dedup_broker
    source, sink = new_topic("src"), new_topic("dst")
    for t in (source, sink):
        assert broker.admin("PUT", admin_path(t) + "/partitions", 2)[0] == 204
    client = client_factory(broker)
    sent = produce(client, source, 1200, batching=False)
    checkpoint = str(tmp_path / "ckpt")
    args = [broker.service_url, broker.web_url, source, sink, checkpoint, "200"]

    # 1. A sink task fails in micro-batch 2 after 20 of its rows went out: the query dies.
    marker = tmp_path / "failed"
    fail = {
        "testFailAfterRows": "20",
        "testFailMarker": str(marker),
        "testFailFromBatch": "2",
        "chunkRows": "10",
    }
    query = start_copy(spark, args, sink=fail)
    with pytest.raises(Exception, match="injected failure"):
        query.awaitTermination(120)
    assert marker.exists() and _commits(checkpoint) == 2
    partial = len(read_topic(spark, broker, sink))
    assert 400 < partial < 590, (partial, marker.read_text())  # batches 0-1, part of 2

    # 2. Restart: batch 2 is replayed (the sink skips what the broker has); new input arrives;
    #    the query is stopped abruptly while it runs.
    sent += produce(client, source, 300, batching=False, prefix="late")
    query = start_copy(spark, args)
    deadline = time.monotonic() + 120
    while _commits(checkpoint) < 5 and time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        time.sleep(0.05)
    query.stop()
    assert 5 <= _commits(checkpoint) < 8

    # 3. Restart once more and drain with availableNow; a tracking subscription follows.
    query = start_copy(spark, args, available_now=True, source={"predefinedSubscription": "prog"})
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    progress = query.recentProgress
    assert progress and max(p["numInputRows"] for p in progress) <= 200  # maxRecordsPerBatch
    check_exact_copy(read_topic(spark, broker, sink), sent)
    subs = broker.admin("GET", admin_path(source) + "-partition-0/subscriptions")[1]
    assert subs == ["prog"]
