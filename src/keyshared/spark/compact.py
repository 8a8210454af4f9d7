"""The compaction job: the latest value of each key, written to Parquet or to a topic.

Like Pulsar's topic compaction, keys are compacted per topic partition (a key's messages are
ordered only inside its partition), the latest message is the one with the highest
``(ledger, entry, batch index)``, and a key whose latest value is empty is deleted. Messages
without a key are dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def latest_per_key(topic_df: DataFrame) -> DataFrame:
    """The compacted view of a topic read: one row per (partition, key), tombstones removed."""
    from pyspark.sql import functions as F

    order = F.struct("__ledgerId", "__entryId", "__batchIndex")
    latest = (
        topic_df.filter(F.col("__key").isNotNull())
        .groupBy("__topic", "__key")
        .agg(F.max_by(F.struct("*"), order).alias("m"))
        .select("m.*")
    )
    return latest.filter(F.col("value").isNotNull() & (F.length("value") > 0))


def compact(
    spark: SparkSession,
    service_url: str,
    topic: str,
    *,
    admin_url: str | None = None,
    parquet: str | None = None,
    output_topic: str | None = None,
) -> int:
    """Compact ``topic`` into ``parquet`` (overwritten) and/or ``output_topic``; returns the
    number of live keys."""
    if parquet is None and output_topic is None:
        raise ValueError("give parquet and/or output_topic")
    reader = (
        spark.read.format("keyshared").option("service.url", service_url).option("topic", topic)
    )
    if admin_url:
        reader = reader.option("admin.url", admin_url)
    latest = latest_per_key(reader.load()).cache()
    n = latest.count()
    if parquet is not None:
        latest.write.mode("overwrite").parquet(parquet)
    if output_topic is not None:
        (
            latest.select("__key", "value", "__eventTime", "__messageProperties")
            .write.format("keyshared")
            .option("service.url", service_url)
            .option("topic", output_topic)
            .mode("append")
            .save()
        )
    latest.unpersist()
    return n
