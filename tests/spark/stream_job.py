"""A streaming copy job, run in its own process by the kill-and-restart test.

``python -m tests.spark.stream_job SERVICE_URL ADMIN_URL IN OUT CHECKPOINT MAX_ROWS``: reads IN
with the keyshared source and writes it to OUT with the exactly-once sink, until killed.
"""

from __future__ import annotations

import sys
from typing import Any


def start_copy(spark: Any, argv: list[str], *, available_now: bool = False, **extra: str) -> Any:
    """Start the copy query on ``spark``; returns the StreamingQuery."""
    service_url, admin_url, source, sink, checkpoint, max_rows = argv
    reader = (
        spark.readStream.format("keyshared")
        .option("service.url", service_url)
        .option("admin.url", admin_url)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerBatch", max_rows)
    )
    for k, v in extra.items():
        reader = reader.option(k, v)
    writer = (
        reader.load()
        .writeStream.format("keyshared")
        .option("service.url", service_url)
        .option("topic", sink)
        .option("exactlyOnce", "true")
        .option("producerName", "copy")
        .option("chunkRows", "60")
        .option("checkpointLocation", checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="200 milliseconds")
    )
    return writer.start()


def main() -> None:
    from keyshared.spark.session import get_session

    spark = get_session("local[2]", "stream-job", {"spark.sql.shuffle.partitions": "2"})
    query = start_copy(spark, sys.argv[1:])
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main()
