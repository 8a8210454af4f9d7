"""The row schema of a topic read, and a builder of Arrow record batches in that schema.

Columns (research/spark.md §5.2, StreamNative's names plus explicit position columns so that
per-key order can be restored after a shuffle):

====================== ======================= ==========================================
column                 type                    from the message
====================== ======================= ==========================================
``value``              binary                  payload
``__key``              string (null if none)   partition key
``__orderingKey``      binary (null if none)   ordering key (Key_Shared hashes it first)
``__topic``            string                  topic partition it was read from
``__messageId``        binary                  ``MessageId.serialize()``
``__partition``        int                     partition index (-1: not partitioned)
``__ledgerId``         bigint                  ledger id
``__entryId``          bigint                  entry id
``__batchIndex``       int                     index in its batch entry (-1: not batched)
``__publishTime``      timestamp               publish time
``__eventTime``        timestamp (null if 0)   event time
``__messageProperties`` map<string,string>     properties
====================== ======================= ==========================================
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

COLUMNS = (
    "value",
    "__key",
    "__orderingKey",
    "__topic",
    "__messageId",
    "__partition",
    "__ledgerId",
    "__entryId",
    "__batchIndex",
    "__publishTime",
    "__eventTime",
    "__messageProperties",
)

ROW_SCHEMA = StructType(
    [
        StructField("value", BinaryType(), True),
        StructField("__key", StringType(), True),
        StructField("__orderingKey", BinaryType(), True),
        StructField("__topic", StringType(), True),
        StructField("__messageId", BinaryType(), True),
        StructField("__partition", IntegerType(), True),
        StructField("__ledgerId", LongType(), True),
        StructField("__entryId", LongType(), True),
        StructField("__batchIndex", IntegerType(), True),
        StructField("__publishTime", TimestampType(), True),
        StructField("__eventTime", TimestampType(), True),
        StructField("__messageProperties", MapType(StringType(), StringType(), True), True),
    ]
)
"""The schema of every topic read."""

ARROW_SCHEMA: pa.Schema = to_arrow_schema(ROW_SCHEMA, timezone="UTC")
"""The Arrow form Spark expects back from ``read()`` (it checks equality)."""

_TS = ARROW_SCHEMA.field("__publishTime").type
_MAP = ARROW_SCHEMA.field("__messageProperties").type


class BatchBuilder:
    """Column lists for one topic partition's rows, turned into a ``pyarrow.RecordBatch``.

    Constant columns (topic, partition) are not collected per row.
    """

    __slots__ = (
        "batch",
        "eids",
        "event_ms",
        "ids",
        "keys",
        "lids",
        "okeys",
        "partition",
        "prop_keys",
        "prop_offsets",
        "prop_vals",
        "publish_ms",
        "topic",
        "values",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.reset()

    def reset(self) -> None:
        """Start an empty batch."""
        self.values: list[bytes] = []
        self.keys: list[str | None] = []
        self.okeys: list[bytes | None] = []
        self.ids: list[bytes] = []
        self.lids: list[int] = []
        self.eids: list[int] = []
        self.batch: list[int] = []
        self.publish_ms: list[int] = []
        self.event_ms: list[int | None] = []
        self.prop_offsets: list[int] = [0]
        self.prop_keys: list[str] = []
        self.prop_vals: list[str] = []

    def __len__(self) -> int:
        return len(self.values)

    def add(self, msg: Any, ledger: int, entry: int, batch_index: int) -> None:
        """Append one ``pulsar.Message`` whose id parts the caller already has."""
        self.values.append(msg.data())
        key = msg.partition_key()
        self.keys.append(key or None)
        okey = msg.ordering_key()
        self.okeys.append(okey.encode() if isinstance(okey, str) and okey else (okey or None))
        self.ids.append(msg.message_id().serialize())
        self.lids.append(ledger)
        self.eids.append(entry)
        self.batch.append(batch_index)
        self.publish_ms.append(msg.publish_timestamp())
        ev = msg.event_timestamp()
        self.event_ms.append(ev or None)
        props = msg.properties()
        if props:
            self.prop_keys.extend(props.keys())
            self.prop_vals.extend(props.values())
        self.prop_offsets.append(len(self.prop_keys))

    def build(self) -> pa.RecordBatch:
        """The collected rows as one record batch in ``ARROW_SCHEMA``; then start anew."""
        n = len(self.values)
        publish = pa.array(self.publish_ms, pa.int64())
        event = pa.array(self.event_ms, pa.int64())
        props = pa.MapArray.from_arrays(
            pa.array(self.prop_offsets, pa.int32()),
            pa.array(self.prop_keys, pa.string()),
            pa.array(self.prop_vals, pa.string()),
            type=_MAP,
        )
        arrays = [
            pa.array(self.values, pa.binary()),
            pa.array(self.keys, pa.string()),
            pa.array(self.okeys, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array(self.ids, pa.binary()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.lids, pa.int64()),
            pa.array(self.eids, pa.int64()),
            pa.array(self.batch, pa.int32()),
            _ms_to_ts(publish),
            _ms_to_ts(event),
            props,
        ]
        self.reset()
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _ms_to_ts(ms: pa.Array) -> pa.Array:
    import pyarrow.compute as pc

    return pc.multiply(ms, 1000).cast(_TS)
