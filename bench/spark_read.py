"""Rows per second of the keyshared Spark source: batch read, streaming read end to end, and
the layers under them (the raw client loop, the Arrow read loop) to show where time goes.

    .venv/bin/python bench/spark_read.py [--messages 400000] [--size 100] [--partitions 2]

Writes ``bench/results/spark.json``. Messages are produced with key-based batching (as the
sink and most producers do); rows are materialised with Spark's ``noop`` sink so every column of
every row is built.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def produce(client: Any, topic: str, n: int, size: int, keys: int) -> float:
    import pulsar

    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_type=pulsar.BatchingType.KeyBased,
        batching_max_messages=1000,
        batching_max_publish_delay_ms=10,
        block_if_queue_full=True,
        max_pending_messages=20000,
    )
    payload = b"v" * size
    t0 = time.perf_counter()
    for i in range(n):
        producer.send_async(payload, None, partition_key=f"key-{i % keys}")
    producer.flush()
    producer.close()
    return time.perf_counter() - t0


def raw_client_loop(service_url: str, topic: str, n: int) -> float:
    """Only the official client: read_next and the message accessors the source calls."""
    import pulsar

    client = pulsar.Client(service_url, logger=_quiet())
    parts = client.get_topic_partitions(topic)
    t0 = time.perf_counter()
    got = 0
    for p in parts:
        r = client.create_reader(p, pulsar.MessageId.earliest, receiver_queue_size=2000)
        while r.has_message_available():
            m = r.read_next(10_000)
            m.data()
            m.message_id()
            got += 1
        r.close()
    dt = time.perf_counter() - t0
    client.close()
    assert got == n, (got, n)
    return dt


def arrow_read_loop(service_url: str, admin_url: str, topic: str, n: int) -> float:
    """The source's executor code (plan + read_range to Arrow batches), without Spark."""
    from keyshared.spark.options import SourceOptions
    from keyshared.spark.source import KeysharedBatchReader

    opts = SourceOptions.parse(
        {"service.url": service_url, "admin.url": admin_url, "topic": topic}, streaming=False
    )
    reader = KeysharedBatchReader(opts)
    t0 = time.perf_counter()
    got = sum(b.num_rows for p in reader.partitions() for b in reader.read(p))
    dt = time.perf_counter() - t0
    assert got == n, (got, n)
    return dt


def _quiet() -> Any:
    import logging

    logger = logging.getLogger("bench.pulsar-client")
    logger.setLevel(logging.WARNING)
    return logger


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=400_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--keys", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument(
        "--stream-batch-entries",
        type=int,
        default=1000,
        help="maxRecordsPerBatch of the streaming run (counts entries: batches of messages)",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "spark.json"))
    args = p.parse_args()

    import pulsar

    from keyshared.spark.demo import LocalBroker
    from keyshared.spark.session import get_session

    work = Path(tempfile.mkdtemp(prefix="keyshared-spark-bench-"))
    broker = LocalBroker(
        work, {"defaultRetentionTimeInMinutes": -1, "defaultRetentionSizeInMB": -1}
    ).start()
    result: dict[str, Any] = {
        "messages": args.messages,
        "size": args.size,
        "partitions": args.partitions,
        "master": args.master,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_before": os.getloadavg()[0],
    }
    try:
        topic = "persistent://public/default/bench"
        broker.admin("PUT", "/admin/v2/persistent/public/default/bench/partitions", args.partitions)
        client = pulsar.Client(broker.service_url, logger=_quiet())
        dt = produce(client, topic, args.messages, args.size, args.keys)
        result["produce_rows_per_s"] = round(args.messages / dt)
        client.close()

        result["raw_client_rows_per_s"] = round(
            args.messages / raw_client_loop(broker.service_url, topic, args.messages)
        )
        result["arrow_loop_rows_per_s"] = round(
            args.messages
            / arrow_read_loop(broker.service_url, broker.web_url, topic, args.messages)
        )

        spark = get_session(args.master, "keyshared-bench")

        def batch_df() -> Any:
            return (
                spark.read.format("keyshared")
                .option("service.url", broker.service_url)
                .option("admin.url", broker.web_url)
                .option("topic", topic)
                .load()
            )

        batch_df().limit(10).collect()  # warm the JVM and the Python workers
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            batch_df().write.format("noop").mode("overwrite").save()
            times.append(time.perf_counter() - t0)
        result["batch_read_s"] = [round(t, 3) for t in times]
        result["batch_rows_per_s"] = round(args.messages / statistics.median(times))
        result["batch_rows_per_s_best"] = round(args.messages / min(times))

        stimes = []
        for i in range(args.repeat):
            ckpt = work / f"ckpt-{i}"
            t0 = time.perf_counter()
            q = (
                spark.readStream.format("keyshared")
                .option("service.url", broker.service_url)
                .option("admin.url", broker.web_url)
                .option("topic", topic)
                .option("startingOffsets", "earliest")
                .option("maxRecordsPerBatch", str(args.stream_batch_entries))
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(ckpt))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()
            stimes.append(time.perf_counter() - t0)
            rows = sum(p["numInputRows"] for p in q.recentProgress)
            assert rows == args.messages, rows
            result["stream_batches"] = len(q.recentProgress)
        result["stream_read_s"] = [round(t, 3) for t in stimes]
        result["stream_rows_per_s"] = round(args.messages / statistics.median(stimes))
        result["load_after"] = os.getloadavg()[0]
        spark.stop()
    finally:
        broker.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
