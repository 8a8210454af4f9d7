"""The backlog job: per subscription, what is still unacknowledged, by key and by age.

Each subscription's backlog is a batch read with ``subscription=NAME`` (from the mark-delete
position, acknowledged holes skipped), so the numbers are exact per message, not estimates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from keyshared.spark.topics import Admin, Topic, expand_partitions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

AGE_BUCKETS = ((60, "<1m"), (600, "1m-10m"), (3600, "10m-1h"), (86400, "1h-1d"))
"""Upper bounds in seconds of the age buckets; older messages are ``>1d``."""


@dataclass
class SubscriptionBacklog:
    """One subscription's unacknowledged messages."""

    subscription: str
    messages: int
    keys: int
    oldest_age_s: float | None
    by_key: list[dict[str, Any]] = field(default_factory=list)
    by_age: dict[str, int] = field(default_factory=dict)


def subscriptions_of(admin: Admin, topic: str) -> list[str]:
    """Every subscription on any partition of ``topic``."""
    t = Topic.parse(topic)
    names: set[str] = set()
    for part in expand_partitions(t, admin.partitions(t)):
        names.update(admin.subscriptions(part))
    return sorted(names)


def backlog_frame(
    spark: SparkSession, service_url: str, admin_url: str, topic: str, subscription: str
) -> DataFrame:
    """The unacknowledged messages of ``subscription`` as a DataFrame (source rows)."""
    return (
        spark.read.format("keyshared")
        .option("service.url", service_url)
        .option("admin.url", admin_url)
        .option("topic", topic)
        .option("subscription", subscription)
        .load()
    )


def backlog(
    spark: SparkSession,
    service_url: str,
    admin_url: str,
    topic: str,
    subscriptions: list[str] | None = None,
    *,
    top_keys: int = 20,
    now: float | None = None,
) -> list[SubscriptionBacklog]:
    """The backlog of each subscription (all of the topic's when ``subscriptions`` is None)."""
    from pyspark.sql import functions as F

    subs = subscriptions or subscriptions_of(Admin(admin_url), topic)
    now = time.time() if now is None else now
    out: list[SubscriptionBacklog] = []
    for sub in subs:
        df = backlog_frame(spark, service_url, admin_url, topic, sub)
        df = df.select(
            F.coalesce("__key", F.lit("")).alias("key"),
            (F.lit(now) - F.unix_micros("__publishTime") / 1e6).alias("age"),
        ).cache()
        per_key = (
            df.groupBy("key")
            .agg(F.count("*").alias("messages"), F.max("age").alias("oldest_age_s"))
            .orderBy(F.desc("messages"), F.desc("oldest_age_s"), "key")
        )
        total = df.agg(F.count("*").alias("n"), F.max("age").alias("oldest")).first()
        bucket = F.lit(">1d")
        for bound, name in reversed(AGE_BUCKETS):
            bucket = F.when(F.col("age") < bound, F.lit(name)).otherwise(bucket)
        ages = {r["b"]: int(r["count"]) for r in df.groupBy(bucket.alias("b")).count().collect()}
        n = int(total["n"]) if total else 0
        out.append(
            SubscriptionBacklog(
                subscription=sub,
                messages=n,
                keys=per_key.count(),
                oldest_age_s=float(total["oldest"])
                if total and total["oldest"] is not None
                else None,
                by_key=[r.asDict() for r in per_key.limit(top_keys).collect()],
                by_age={name: ages.get(name, 0) for name in [b[1] for b in AGE_BUCKETS] + [">1d"]},
            )
        )
        df.unpersist()
    return out
