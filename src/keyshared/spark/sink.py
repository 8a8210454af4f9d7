"""The ``keyshared`` sink: DataFrames written to topics, at-least-once or exactly-once.

Input columns: ``value`` (binary or string, required); optional ``__key``, ``__orderingKey``,
``__eventTime``, ``__messageProperties``; ``__topic`` names each row's destination unless the
``topic`` option does.

Each task opens its own producers (one per destination partition and *lane*).

At-least-once (the default): key-based batching, so a batch entry holds one key and Key_Shared
routing stays correct. Rows are sent in chunks of ``chunkRows``: a chunk is stably sorted by
key, sent, and flushed before the next one. Per-key order is kept (order across keys inside a
chunk is not), and the client's sequence ids rise from batch entry to batch entry, which Apache
Pulsar with deduplication on requires (with interleaved keys, key-based batches would carry
overlapping sequence-id ranges and Pulsar drops the later one as a duplicate; keyshared's
deduplication is exact per message and would keep it, but the sink writes to Pulsar too).

Exactly-once (``exactlyOnce=true``, ``producerName=NAME``, broker with deduplication on): every
row carries a sequence id derived from the data alone, never from chunking or sorting, so any
replay computes the same ids:

* *position mode*, when the rows carry the source position (``__topic``, ``__ledgerId``,
  ``__entryId``, ``__batchIndex``, i.e. a topic read without a shuffle) and the ``topic`` option
  names the destination: one producer per source partition named ``NAME-<source partition>``,
  sequence id = :func:`position_sequence_id` of the row's source position;
* *batch mode*, otherwise, for streaming writes: producer ``NAME-p<Spark partition>``, sequence
  id = ``batchId << 31 | row index`` (needs a deterministic row order within a replayed batch).

Rows go out in their input order, one message per entry (batching off: a batch entry's single
sequence range could straddle what the broker already has), so order is kept in full. A producer
learns the last sequence id the broker persisted for its name
(``Producer.last_sequence_id()``) and skips rows at or below it, so a task retried or a
micro-batch replayed after a failure re-sends only what is missing; the broker drops any
duplicate that still gets through (a zombie attempt).

Partitioned destinations are routed by the Java client's default, ``JavaStringHash`` of the key
modulo the partition count, so Java producers of the same topic agree; keyless rows of a task go
to one partition.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pulsar
import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from keyshared.spark.options import OptionError, SinkOptions
from keyshared.spark.reading import shared_client
from keyshared.spark.topics import Topic

log = logging.getLogger(__name__)

_POSITION_COLUMNS = ("__topic", "__ledgerId", "__entryId", "__batchIndex")
_LEDGER_BITS, _ENTRY_BITS, _BATCH_BITS = 23, 24, 16


def position_sequence_id(ledger: int, entry: int, batch_index: int) -> int:
    """A sequence id that rises with the position ``(ledger, entry, batch_index)``."""
    b = batch_index + 1
    if not (0 <= ledger < 1 << _LEDGER_BITS and 0 <= entry < 1 << _ENTRY_BITS and 0 <= b < 1 << 16):
        raise ValueError(f"position {ledger}:{entry}:{batch_index} too large for a sequence id")
    return (ledger << (_ENTRY_BITS + _BATCH_BITS)) | (entry << _BATCH_BITS) | b


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()`` (UTF-16 code units), as a signed 32-bit int."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: str, partitions: int) -> int:
    """Pulsar's ``signSafeMod(JavaStringHash(key), n)``."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task wrote."""

    partition_id: int
    attempt: int
    sent: int
    skipped: int
    producers: dict[str, int] = field(default_factory=dict)


@dataclass
class _Lane:
    """Rows bound for one producer, waiting to be sent as a chunk."""

    topic: str
    producer_name: str | None
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    last_position: tuple[int, int, int] | None = None
    producer: Any = None
    persisted: int = -1


class _Failures:
    """Send results reported from the client's threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: list[str] = []

    def callback(self, res: Any, _msg_id: Any) -> None:
        if res != pulsar.Result.Ok:
            with self.lock:
                self.errors.append(str(res))


class _TaskWriter:
    """Writes one task's rows."""

    def __init__(self, opts: SinkOptions, schema: StructType, batch_id: int | None) -> None:
        self.opts = opts
        self.names = schema.fieldNames()
        if "value" not in self.names:
            raise OptionError("the sink needs a value column (binary or string)")
        if opts.topic is None and "__topic" not in self.names:
            raise OptionError("set the topic option or give rows a __topic column")
        self.batch_id = batch_id
        ctx = TaskContext.get()
        self.partition_id = ctx.partitionId() if ctx else 0
        self.attempt = ctx.attemptNumber() if ctx else 0
        self.mode = "none"
        if opts.exactly_once:
            if opts.topic is not None and all(c in self.names for c in _POSITION_COLUMNS):
                self.mode = "position"
            elif batch_id is not None:
                self.mode = "batch"
            else:
                raise OptionError(
                    "exactlyOnce needs the source position columns (__topic, __ledgerId, "
                    "__entryId, __batchIndex) with the topic option, or a streaming write"
                )
        self.client = shared_client(opts.service_url, opts.client_kwargs)
        self.failures = _Failures()
        self.lanes: dict[tuple[str, str | None], _Lane] = {}
        self.partitions: dict[str, list[str]] = {}
        self.sent = 0
        self.skipped = 0
        self.row_index = 0

    # --- routing ----------------------------------------------------------------------------
    def _destination(self, topic: str, key: str | None) -> str:
        parts = self.partitions.get(topic)
        if parts is None:
            full = Topic.parse(topic).full
            parts = list(self.client.get_topic_partitions(full))
            self.partitions[topic] = parts
        if len(parts) == 1:
            return parts[0]
        i = partition_for_key(key, len(parts)) if key else self.partition_id % len(parts)
        return parts[i]

    def _producer_name(self, source_topic: str | None) -> str | None:
        prefix = self.opts.producer_name
        if self.mode == "position":
            assert source_topic is not None and prefix is not None
            local = Topic.parse(source_topic).local
            digest = hashlib.sha1(source_topic.encode()).hexdigest()[:6]
            return f"{prefix}-{local}-{digest}"
        if self.mode == "batch":
            return f"{prefix}-p{self.partition_id}"
        return prefix if prefix and self.opts.exactly_once else None

    # --- the write --------------------------------------------------------------------------
    def write(self, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
        idx = {n: i for i, n in enumerate(self.names)}
        chunk = self.opts.chunk_rows
        for rb in batches:
            cols = [_pylist(c) for c in rb.columns]
            n = rb.num_rows
            values = cols[idx["value"]]
            keys = cols[idx["__key"]] if "__key" in idx else [None] * n
            okeys = cols[idx["__orderingKey"]] if "__orderingKey" in idx else [None] * n
            events = cols[idx["__eventTime"]] if "__eventTime" in idx else [None] * n
            props = cols[idx["__messageProperties"]] if "__messageProperties" in idx else [None] * n
            topics = cols[idx["__topic"]] if "__topic" in idx else [None] * n
            if self.mode == "position":
                lids, eids, bids = (cols[idx[c]] for c in _POSITION_COLUMNS[1:])
            for i in range(n):
                key = keys[i]
                if isinstance(key, bytes):
                    key = key.decode()
                dest_topic = self.opts.topic or topics[i]
                if dest_topic is None:
                    raise ValueError("a row has no __topic and the topic option is not set")
                dest = self._destination(dest_topic, key)
                source = topics[i] if self.mode == "position" else None
                lane_key = (dest, source)
                lane = self.lanes.get(lane_key)
                if lane is None:
                    lane = self.lanes[lane_key] = _Lane(dest, self._producer_name(source))
                if self.mode == "position":
                    pos = (lids[i], eids[i], bids[i])
                    if lane.last_position is not None and pos <= lane.last_position:
                        raise ValueError(
                            f"exactly-once rows of {source} are not in source order "
                            f"({pos} after {lane.last_position}): write the read without a "
                            "shuffle, or sort by __ledgerId, __entryId, __batchIndex"
                        )
                    lane.last_position = pos
                    tag: int = position_sequence_id(*pos)
                else:
                    tag = self.row_index
                self.row_index += 1
                lane.rows.append((key, okeys[i], values[i], events[i], props[i], tag))
                if len(lane.rows) >= chunk:
                    self._send_chunk(lane)
        for lane in self.lanes.values():
            if lane.rows:
                self._send_chunk(lane)
        self._close()
        return SinkCommit(
            self.partition_id,
            self.attempt,
            self.sent,
            self.skipped,
            {
                lane.topic + "/" + str(lane.producer_name): lane.persisted
                for lane in self.lanes.values()
            },
        )

    def _open(self, lane: _Lane) -> Any:
        kw: dict[str, Any] = {
            "batching_enabled": True,
            "batching_type": pulsar.BatchingType.KeyBased,
            "batching_max_messages": 1000,
            "batching_max_publish_delay_ms": 5,
            "block_if_queue_full": True,
            "max_pending_messages": 5000,
        }
        kw.update(self.opts.producer_kwargs)
        if self.mode != "none":
            kw["batching_enabled"] = False
            kw.pop("batching_type", None)
        if lane.producer_name is not None:
            kw["producer_name"] = lane.producer_name
        producer = self.client.create_producer(lane.topic, **kw)
        lane.producer = producer
        lane.persisted = producer.last_sequence_id() if self.mode != "none" else -1
        return producer

    def _send_chunk(self, lane: _Lane) -> None:
        producer = lane.producer or self._open(lane)
        rows = lane.rows
        lane.rows = []
        exact = self.mode != "none"
        if not exact:
            rows.sort(key=_sort_key)
        high = self.batch_id << 31 if self.mode == "batch" and self.batch_id is not None else 0
        send = producer.send_async
        callback = self.failures.callback
        persisted = lane.persisted
        for key, okey, value, event, props, tag in rows:
            kw: dict[str, Any] = {}
            if exact:
                seq = high | tag
                if seq <= persisted:
                    self.skipped += 1
                    continue
                kw["sequence_id"] = seq
            if key:
                kw["partition_key"] = key
            if okey:
                kw["ordering_key"] = okey.decode() if isinstance(okey, bytes) else okey
            if event is not None:
                kw["event_timestamp"] = event
            if props:
                kw["properties"] = dict(props)
            data = value.encode() if isinstance(value, str) else value
            send(data, callback, **kw)
            self.sent += 1
        producer.flush()
        if self.failures.errors:
            raise RuntimeError(f"sends to {lane.topic} failed: {self.failures.errors[:3]}")
        self._maybe_fail()

    def _maybe_fail(self) -> None:
        """Test hook: fail once after a partial write (``testFailAfterRows``, ``testFailMarker``,
        and for streams ``testFailFromBatch``)."""
        opts = self.opts
        if opts.fail_after_rows is None or opts.fail_marker is None:
            return
        if self.batch_id is not None and self.batch_id < opts.fail_from_batch:
            return
        if self.sent >= opts.fail_after_rows and not os.path.exists(opts.fail_marker):
            with open(opts.fail_marker, "w") as f:
                f.write(f"partition {self.partition_id} failed after {self.sent} rows\n")
            raise RuntimeError(f"injected failure after {self.sent} rows (testFailAfterRows)")

    def _close(self) -> None:
        for lane in self.lanes.values():
            if lane.producer is not None:
                lane.producer.close()


def _sort_key(row: tuple[Any, ...]) -> str:
    okey = row[1]
    if okey:
        return okey.decode(errors="replace") if isinstance(okey, bytes) else str(okey)
    return row[0] or ""


def _pylist(col: pa.Array) -> list[Any]:
    """A column as Python values; timestamps as epoch milliseconds, maps as pair lists."""
    if pa.types.is_timestamp(col.type):
        unit = col.type.unit
        ints = col.cast(pa.int64()).to_pylist()
        div = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        return [None if v is None else int(v // div) for v in ints]
    return list(col.to_pylist())


def _batch_id() -> int | None:
    ctx = TaskContext.get()
    raw = ctx.getLocalProperty("streaming.sql.batchId") if ctx else None
    return int(raw) if raw is not None else None


class KeysharedBatchWriter(DataSourceArrowWriter):
    """``df.write.format("keyshared")``."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Send one task's rows (executor)."""
        return _TaskWriter(self.opts, self.schema, None).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to publish: every row is confirmed by the broker before the task ends."""
        log.info(
            "keyshared sink wrote %d rows",
            sum(m.sent for m in messages if isinstance(m, SinkCommit)),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Rows already confirmed stay (at-least-once); exactly-once re-runs skip them."""


class KeysharedStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("keyshared")``."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Send one task's rows of a micro-batch (executor)."""
        return _TaskWriter(self.opts, self.schema, _batch_id()).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to publish: the rows were confirmed before the tasks ended."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """A replay of ``batchId`` re-sends; exactly-once skips what the broker has."""
