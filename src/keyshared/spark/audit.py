"""The ordering audit of Key_Shared consumption: order, exclusivity, loss, duplicates, STICKY.

Reads consumption logs (:mod:`keyshared.spark.consumption_log`) and, when given, the topic, and
reports per subscription:

* **order violations**, two kinds: ``first`` — a message of a key delivered for the first time
  after a later message of the same key had been delivered (to anyone); ``consumer`` — a consumer
  received a message of a key after a later one of the same key, and the message was no
  redelivery (redelivery count 0). A consumer leaving hands its unacknowledged messages to
  others with the count unchanged: the new owner must get them before anything newer.
* **overlaps**: a key *held* by two consumers at once. A consumer holds a key from receiving one
  of its messages until it acknowledges that message (or leaves; or the log ends).
* **lost**: messages of the topic nobody acknowledged (needs the topic).
* **duplicates**: messages acknowledged more than once; ``redelivered`` counts messages received
  more than once (allowed).
* **sticky violations**: a message received by a STICKY consumer whose key's slot
  (Murmur3, ``hash % 65536``, 0→1) lies outside the ranges the consumer logged at ``join``.

The sticky key is the ordering key when present, else the partition key, else ``NONE_KEY``
(as Pulsar hashes keyless messages).

:func:`audit_events` does it in plain Python for small logs (the project's own Key_Shared and
crash tests); :func:`audit` does the same with Spark for large ones. Both give the same report.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from keyshared.protocol.hashing import range_slot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

NONE_KEY = "NONE_KEY"
MsgId = tuple[str, int, int, int]
"""``(topic, ledger, entry, batch)``."""


@dataclass
class AuditReport:
    """What the audit found; ``ok`` when nothing is wrong."""

    subscription: str | None
    consumers: list[str]
    received: int
    acked: int
    topic_messages: int | None
    order_violations: int = 0
    overlaps: int = 0
    lost: int | None = None
    duplicates: int = 0
    redelivered: int = 0
    sticky_violations: int = 0
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No order violation, overlap, loss, duplicate or STICKY violation."""
        return not (
            self.order_violations
            or self.overlaps
            or self.lost
            or self.duplicates
            or self.sticky_violations
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (``ok`` included)."""
        out = asdict(self)
        out["ok"] = self.ok
        return out

    def summary(self) -> str:
        """A few human lines."""
        lost = "n/a (no topic)" if self.lost is None else str(self.lost)
        lines = [
            f"audit of subscription {self.subscription or '(all)'}: "
            f"{'OK' if self.ok else 'PROBLEMS FOUND'}",
            f"  consumers {len(self.consumers)}, received {self.received}, acked {self.acked}, "
            f"topic messages {self.topic_messages if self.topic_messages is not None else 'n/a'}",
            f"  order violations {self.order_violations}, keys held twice {self.overlaps}, "
            f"lost {lost}, duplicates {self.duplicates}, redelivered {self.redelivered}, "
            f"sticky violations {self.sticky_violations}",
        ]
        for kind, rows in self.samples.items():
            for row in rows[:3]:
                lines.append(f"  e.g. {kind}: {json.dumps(row, default=str)}")
        return "\n".join(lines)


def sticky_key(event: dict[str, Any]) -> str:
    """The key Key_Shared hashes: ordering key, else partition key, else ``NONE_KEY``."""
    return str(event.get("okey") or event.get("key") or NONE_KEY)


def _mid(e: dict[str, Any]) -> MsgId:
    return (str(e["topic"]), int(e["ledger"]), int(e["entry"]), int(e.get("batch", -1)))


def audit_events(
    events: Iterable[dict[str, Any]],
    topic_ids: Iterable[MsgId] | None = None,
    *,
    subscription: str | None = None,
    samples: int = 10,
) -> AuditReport:
    """Audit consumption events in plain Python; ``topic_ids`` enables the loss check."""
    evs = [e for e in events if subscription is None or e.get("subscription") == subscription]
    evs.sort(key=lambda e: float(e["ts"]))
    recv = [e for e in evs if e["ev"] == "recv"]
    acks = [e for e in evs if e["ev"] == "ack"]
    end_of_log = float(evs[-1]["ts"]) if evs else 0.0
    leave: dict[tuple[str, str], float] = {}
    ranges: dict[tuple[str, str], list[list[int]]] = {}
    for e in evs:
        if e["ev"] == "leave":
            leave[(e["subscription"], e["consumer"])] = float(e["ts"])
        elif e["ev"] == "join" and e.get("ranges") is not None:
            ranges[(e["subscription"], e["consumer"])] = e["ranges"]
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)

    # Order, first deliveries: per (subscription, topic, key) in first-delivery order.
    first: dict[tuple[str, MsgId], tuple[float, dict[str, Any]]] = {}
    for e in recv:
        first.setdefault((e["subscription"], _mid(e)), (float(e["ts"]), e))
    by_key: dict[tuple[str, str, str], list[tuple[float, MsgId, dict[str, Any]]]] = defaultdict(
        list
    )
    for (sub, mid), (ts, e) in first.items():
        by_key[(sub, mid[0], sticky_key(e))].append((ts, mid, e))
    order = 0
    for (sub, _topic, key), items in by_key.items():
        items.sort(key=lambda t: (t[0], t[1]))
        top: MsgId | None = None
        for _ts, mid, e in items:
            if top is not None and mid < top:
                order += 1
                out["order"].append(_sample("first", sub, key, e, top))
            top = mid if top is None or mid > top else top
    # Order, per consumer (redeliveries excepted).
    tops: dict[tuple[str, str, str, str], MsgId] = {}
    for e in recv:
        k = (e["subscription"], str(e["topic"]), sticky_key(e), e["consumer"])
        mid = _mid(e)
        top = tops.get(k)
        if top is not None and mid < top and int(e.get("redelivery") or 0) == 0:
            order += 1
            out["order"].append(_sample("consumer", k[0], k[2], e, top))
        if top is None or mid > top:
            tops[k] = mid

    # Holds: receipt until the consumer's next ack of that message, its leave, or the log end.
    ack_times: dict[tuple[str, str, MsgId], list[float]] = defaultdict(list)
    for e in acks:
        ack_times[(e["subscription"], e["consumer"], _mid(e))].append(float(e["ts"]))
    holds: dict[tuple[str, str, str], list[tuple[float, float, str]]] = defaultdict(list)
    for e in recv:
        sub, cons, ts = e["subscription"], e["consumer"], float(e["ts"])
        after = [t for t in ack_times.get((sub, cons, _mid(e)), ()) if t >= ts]
        lv = leave.get((sub, cons))
        end = min(after) if after else (lv if lv is not None and lv >= ts else end_of_log)
        holds[(sub, str(e["topic"]), sticky_key(e))].append((ts, end, cons))
    overlaps = 0
    for (sub, _topic, key), hs in holds.items():
        islands = _islands(hs)
        bad = _overlapping(islands)
        if bad:
            overlaps += 1
            a, b = bad
            out["overlap"].append(
                {"subscription": sub, "key": key, "consumers": [a[2], b[2]],
                 "from": max(a[0], b[0]), "to": min(a[1], b[1])}
            )  # fmt: skip

    # Loss, duplicates, redeliveries.
    acked_count = Counter((e["subscription"], _mid(e)) for e in acks)
    duplicates = [k for k, n in acked_count.items() if n > 1]
    for sub, mid in duplicates[:samples]:
        out["duplicate"].append(
            {"subscription": sub, "id": list(mid), "acks": acked_count[(sub, mid)]}
        )
    recv_count = Counter((e["subscription"], _mid(e)) for e in recv)
    redelivered = sum(1 for n in recv_count.values() if n > 1)
    lost: int | None = None
    topic_messages: int | None = None
    if topic_ids is not None:
        ids = set(topic_ids)
        topic_messages = len(ids)
        acked_ids = {mid for (_sub, mid) in acked_count}
        missing = sorted(ids - acked_ids)
        lost = len(missing)
        out["lost"].extend({"id": list(m)} for m in missing[:samples])

    # STICKY ranges.
    sticky = 0
    for e in recv:
        rs = ranges.get((e["subscription"], e["consumer"]))
        if rs is None:
            continue
        slot = range_slot(sticky_key(e).encode())
        if not any(a <= slot <= b for a, b in rs):
            sticky += 1
            out["sticky"].append(
                {"consumer": e["consumer"], "key": sticky_key(e), "slot": slot, "ranges": rs}
            )
    return AuditReport(
        subscription=subscription,
        consumers=sorted({e["consumer"] for e in evs}),
        received=len(recv),
        acked=len(acks),
        topic_messages=topic_messages,
        order_violations=order,
        overlaps=overlaps,
        lost=lost,
        duplicates=len(duplicates),
        redelivered=redelivered,
        sticky_violations=sticky,
        samples={k: v[:samples] for k, v in out.items()},
    )


def _sample(kind: str, sub: str, key: str, e: dict[str, Any], top: MsgId) -> dict[str, Any]:
    return {
        "kind": kind,
        "subscription": sub,
        "key": key,
        "consumer": e["consumer"],
        "id": list(_mid(e)),
        "after": list(top),
        "ts": e["ts"],
    }


def _islands(holds: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Merge each consumer's overlapping hold intervals."""
    per: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s, e, c in holds:
        per[c].append((s, e))
    out: list[tuple[float, float, str]] = []
    for c, iv in per.items():
        iv.sort()
        cur_s, cur_e = iv[0]
        for s, e in iv[1:]:
            if s > cur_e:
                out.append((cur_s, cur_e, c))
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        out.append((cur_s, cur_e, c))
    return out


def _overlapping(
    islands: list[tuple[float, float, str]],
) -> tuple[tuple[float, float, str], tuple[float, float, str]] | None:
    """A pair of islands of different consumers that overlap in time, if any."""
    islands.sort()
    open_: list[tuple[float, float, str]] = []
    for isl in islands:
        open_ = [o for o in open_ if o[1] > isl[0]]
        for o in open_:
            if o[2] != isl[2]:
                return o, isl
        open_.append(isl)
    return None


# --- Spark ---------------------------------------------------------------------------------

LOG_SCHEMA_DDL = (
    "ev STRING, ts DOUBLE, consumer STRING, subscription STRING, topic STRING, key STRING, "
    "okey STRING, ledger BIGINT, entry BIGINT, batch INT, redelivery INT, "
    "ranges ARRAY<ARRAY<INT>>"
)


def read_logs(spark: SparkSession, paths: str | list[str]) -> DataFrame:
    """Consumption logs (files, directories or globs) as a DataFrame."""
    return spark.read.schema(LOG_SCHEMA_DDL).json(paths)


def audit(
    spark: SparkSession,
    logs: str | list[str] | DataFrame,
    *,
    topic_df: DataFrame | None = None,
    subscription: str | None = None,
    samples: int = 10,
) -> AuditReport:
    """The audit with Spark. ``topic_df`` is a batch read of the topic (for the loss check)."""
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    ev = logs if isinstance(logs, SparkDataFrame) else read_logs(spark, logs)
    if subscription is not None:
        ev = ev.filter(F.col("subscription") == subscription)
    ev = ev.withColumn("skey", F.coalesce(F.col("okey"), F.col("key"), F.lit(NONE_KEY)))
    ev = ev.withColumn("batch", F.coalesce(F.col("batch"), F.lit(-1))).cache()
    mid = F.struct("topic", "ledger", "entry", "batch")
    recv = ev.filter(F.col("ev") == "recv").withColumn("mid", mid)
    acks = ev.filter(F.col("ev") == "ack").withColumn("mid", mid)
    out: dict[str, list[dict[str, Any]]] = {}

    def take(kind: str, df: DataFrame) -> int:
        rows = df.limit(samples).collect()
        n = df.count() if len(rows) == samples else len(rows)
        if rows:
            out[kind] = [_jsonable(r.asDict(recursive=True)) for r in rows]
        return n

    head = ev.agg(
        F.max("ts").alias("eol"),
        F.count_if(F.col("ev") == "recv").alias("recv"),
        F.count_if(F.col("ev") == "ack").alias("ack"),
        F.sort_array(F.collect_set("consumer")).alias("consumers"),
        F.count_if((F.col("ev") == "join") & F.col("ranges").isNotNull()).alias("sticky"),
    ).first()
    assert head is not None
    eol = float(head["eol"]) if head["eol"] is not None else 0.0
    unbounded = Window.unboundedPreceding
    # Order, first deliveries.
    first = recv.groupBy("subscription", "topic", "skey", "mid").agg(
        F.min(F.struct("ts", "consumer")).alias("f")
    )
    w = (
        Window.partitionBy("subscription", "topic", "skey")
        .orderBy(F.col("f.ts"), F.col("mid"))
        .rowsBetween(unbounded, -1)
    )
    first_bad = (
        first.withColumn("after", F.max("mid").over(w))
        .filter(F.col("mid") < F.col("after"))
        .select(
            F.lit("first").alias("kind"),
            "subscription",
            F.col("skey").alias("key"),
            F.col("f.consumer").alias("consumer"),
            "mid",
            "after",
        )
    )
    wc = (
        Window.partitionBy("subscription", "topic", "skey", "consumer")
        .orderBy("ts")
        .rowsBetween(unbounded, -1)
    )
    cons_bad = (
        recv.withColumn("after", F.max("mid").over(wc))
        .filter((F.col("mid") < F.col("after")) & (F.coalesce("redelivery", F.lit(0)) == 0))
        .select(
            F.lit("consumer").alias("kind"),
            "subscription",
            F.col("skey").alias("key"),
            "consumer",
            "mid",
            "after",
        )
    )
    order = take("order", first_bad.unionByName(cons_bad))

    # Holds and overlaps.
    leaves = (
        ev.filter(F.col("ev") == "leave")
        .groupBy("subscription", "consumer")
        .agg(F.max("ts").alias("leave_ts"))
    )
    a = acks.select(
        F.col("subscription").alias("a_sub"),
        F.col("consumer").alias("a_cons"),
        F.col("mid").alias("a_mid"),
        F.col("ts").alias("ack_ts"),
    )
    r = recv.select("subscription", "consumer", "topic", "skey", "mid", "ts")
    on = (
        (r["subscription"] == a["a_sub"])
        & (r["consumer"] == a["a_cons"])
        & (r["mid"] == a["a_mid"])
        & (a["ack_ts"] >= r["ts"])
    )
    holds = (
        r.join(a, on, "left")
        .groupBy("subscription", "consumer", "topic", "skey", "mid", "ts")
        .agg(F.min("ack_ts").alias("ack_ts"))
        .join(leaves, ["subscription", "consumer"], "left")
        .withColumn(
            "end",
            F.coalesce(
                "ack_ts",
                F.when(F.col("leave_ts") >= F.col("ts"), F.col("leave_ts")),
                F.lit(eol),
            ),
        )
    )
    wi = Window.partitionBy("subscription", "topic", "skey", "consumer").orderBy("ts", "end")
    islands = (
        holds.withColumn("prev_end", F.max("end").over(wi.rowsBetween(unbounded, -1)))
        .withColumn(
            "island",
            F.sum(
                F.when(F.col("prev_end").isNull() | (F.col("ts") > F.col("prev_end")), 1).otherwise(
                    0
                )
            ).over(wi.rowsBetween(unbounded, 0)),
        )
        .groupBy("subscription", "topic", "skey", "consumer", "island")
        .agg(F.min("ts").alias("s"), F.max("end").alias("e"))
    )
    i1, i2 = islands.alias("i1"), islands.alias("i2")
    pairs = i1.join(
        i2,
        (F.col("i1.subscription") == F.col("i2.subscription"))
        & (F.col("i1.topic") == F.col("i2.topic"))
        & (F.col("i1.skey") == F.col("i2.skey"))
        & (F.col("i1.consumer") < F.col("i2.consumer"))
        & (F.col("i1.s") < F.col("i2.e"))
        & (F.col("i2.s") < F.col("i1.e")),
    )
    overlap_keys = pairs.groupBy(
        F.col("i1.subscription").alias("subscription"),
        F.col("i1.topic").alias("topic"),
        F.col("i1.skey").alias("key"),
    ).agg(
        F.first(F.array(F.col("i1.consumer"), F.col("i2.consumer"))).alias("consumers"),
    )
    overlaps = take("overlap", overlap_keys)

    # Duplicates, redeliveries, loss.
    dup = acks.groupBy("subscription", "mid").agg(F.count("*").alias("acks")).filter("acks > 1")
    duplicates = take("duplicate", dup)
    redelivered = recv.groupBy("subscription", "mid").count().filter("count > 1").count()
    lost: int | None = None
    topic_messages: int | None = None
    if topic_df is not None:
        tids = (
            topic_df.select(
                F.struct(
                    F.col("__topic").alias("topic"),
                    F.col("__ledgerId").alias("ledger"),
                    F.col("__entryId").alias("entry"),
                    F.col("__batchIndex").alias("batch"),
                ).alias("mid")
            )
            .distinct()
            .cache()
        )
        topic_messages = tids.count()
        lost = take("lost", tids.join(acks.select("mid").distinct(), ["mid"], "left_anti"))
        tids.unpersist()

    # STICKY ranges.
    sticky = 0
    joins = ev.filter((F.col("ev") == "join") & F.col("ranges").isNotNull()).select(
        "subscription", "consumer", "ranges"
    )
    if head["sticky"]:
        slot = F.udf(lambda k: range_slot(k.encode()), IntegerType(), useArrow=False)
        checked = (
            recv.drop("ranges")
            .join(joins, ["subscription", "consumer"])
            .withColumn("slot", slot("skey"))
        )
        bad = checked.filter(
            ~F.exists("ranges", lambda rg: (F.col("slot") >= rg[0]) & (F.col("slot") <= rg[1]))
        ).select("consumer", F.col("skey").alias("key"), "slot", "ranges")
        sticky = take("sticky", bad)

    ev.unpersist()
    return AuditReport(
        subscription=subscription,
        consumers=list(head["consumers"]),
        received=int(head["recv"]),
        acked=int(head["ack"]),
        topic_messages=topic_messages,
        order_violations=order,
        overlaps=overlaps,
        lost=lost,
        duplicates=duplicates,
        redelivered=redelivered,
        sticky_violations=sticky,
        samples=out,
    )


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            v = [v.get(x) for x in ("topic", "ledger", "entry", "batch")] if "ledger" in v else v
        out[k] = v
    return out
