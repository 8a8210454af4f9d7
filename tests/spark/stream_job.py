"""A streaming copy job (topic to topic, exactly-once sink), in-process or in its own driver.

``python -m tests.spark.stream_job MASTER SERVICE_URL ADMIN_URL IN OUT CHECKPOINT MAX_ROWS`` runs
it until killed (the cluster test SIGKILLs it mid-run).
"""

from __future__ import annotations

import sys
from typing import Any


def start_copy(
    spark: Any,
    args: list[str],
    *,
    available_now: bool = False,
    source: dict[str, str] | None = None,
    sink: dict[str, str] | None = None,
) -> Any:
    """Start the copy query; ``args`` = service URL, admin URL, in, out, checkpoint, max rows."""
    service_url, admin_url, source_topic, sink_topic, checkpoint, max_rows = args
    reader = (
        spark.readStream.format("keyshared")
        .option("service.url", service_url)
        .option("admin.url", admin_url)
        .option("topic", source_topic)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerBatch", max_rows)
    )
    for k, v in (source or {}).items():
        reader = reader.option(k, v)
    writer = (
        reader.load()
        .writeStream.format("keyshared")
        .option("service.url", service_url)
        .option("topic", sink_topic)
        .option("exactlyOnce", "true")
        .option("producerName", "copy")
        .option("chunkRows", "40")
        .option("checkpointLocation", checkpoint)
    )
    for k, v in (sink or {}).items():
        writer = writer.option(k, v)
    if available_now:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime="100 milliseconds").start()


def main(argv: list[str]) -> None:
    """Run the copy on ``argv[0]`` (a Spark master) until killed."""
    from keyshared.spark.session import get_session

    spark = get_session(argv[0], "stream-job", {"spark.sql.shuffle.partitions": "2"})
    query = start_copy(spark, argv[1:])
    print("started", flush=True)
    query.awaitTermination()


if __name__ == "__main__":
    main(sys.argv[1:])
