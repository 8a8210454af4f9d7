"""Executor side of the source: read one topic partition's ``(start, end]`` with a reader.

A Spark task reads exactly one range in publish order with a non-durable ``pulsar.Reader``, so
a retried task or a replayed micro-batch returns the same rows. Rows leave as Arrow record
batches. Clients are cached per Python worker process (Spark reuses its workers), created
lazily after the fork.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from keyshared.spark.options import SourceOptions
from keyshared.spark.positions import BEFORE_ALL, AckedRanges, Pos, format_pos
from keyshared.spark.schema import BatchBuilder

log = logging.getLogger(__name__)

_CLIENTS: dict[tuple[Any, ...], pulsar.Client] = {}
_LOCK = threading.Lock()


class DataLossError(RuntimeError):
    """Entries the query must read are gone (retention, deleted topic); see ``failOnDataLoss``."""


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One Spark partition: the entries of ``topic`` in ``(start, end]``, minus ``acked``.

    ``expect_first`` is the first entry of the range when it was planned: a read that finds a
    later one first has lost entries to retention in between.
    """

    topic: str
    partition: int
    start: Pos
    end: Pos
    acked: tuple[tuple[Pos, Pos], ...] = ()
    expect_first: Pos | None = None

    def __repr__(self) -> str:
        return (
            f"RangePartition({self.topic}, ({format_pos(self.start)}, {format_pos(self.end)}]"
            f"{', acked holes' if self.acked else ''})"
        )


def quiet_logger() -> logging.Logger:
    """The client library's logger, warnings only (its INFO lines flood Spark's logs)."""
    logger = logging.getLogger("keyshared.spark.pulsar-client")
    logger.setLevel(logging.WARNING)
    return logger


def shared_client(service_url: str, kwargs: dict[str, Any]) -> pulsar.Client:
    """One ``pulsar.Client`` per (process, url, settings); safe across forks."""
    key = (os.getpid(), service_url, tuple(sorted(kwargs.items())))
    with _LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            kw = dict(kwargs)
            kw.setdefault("operation_timeout_seconds", 30)
            kw.setdefault("logger", quiet_logger())
            client = pulsar.Client(service_url, **kw)
            _CLIENTS[key] = client
        return client


def start_message_id(partition: int, start: Pos) -> pulsar.MessageId:
    """The reader's (exclusive) start for a range beginning after ``start``."""
    if start == BEFORE_ALL:
        return pulsar.MessageId.earliest
    return pulsar.MessageId(partition, start[0], start[1], -1)


def read_range(part: RangePartition, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    """Yield the rows of ``part`` in publish order, ``opts.arrow_batch_rows`` at a time."""
    start, end = part.start, part.end
    if end <= start:
        return
    from keyshared.spark import native

    if opts.reader == "native" or (
        opts.reader == "auto"
        and native.usable(opts.service_url, opts.client_kwargs, opts.read_compacted)
    ):
        yield from _read_native(part, opts)
        return
    client = shared_client(opts.service_url, opts.client_kwargs)
    reader_kwargs = dict(opts.reader_kwargs)
    reader_kwargs.setdefault("receiver_queue_size", 2000)
    reader = client.create_reader(
        part.topic,
        start_message_id(part.partition, start),
        start_message_id_inclusive=False,
        is_read_compacted=opts.read_compacted,
        **reader_kwargs,
    )
    try:
        yield from _read(reader, part, opts)
    finally:
        reader.close()


def _read_native(part: RangePartition, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    from keyshared.spark.native import read_native

    def on_first(pos: Pos) -> None:
        if part.expect_first is not None and pos > part.expect_first:
            _lost(
                opts,
                f"{part!r}: entries {format_pos(part.expect_first)}..before {format_pos(pos)} "
                "were deleted (retention) after the range was planned",
            )

    def on_timeout(last: Pos) -> None:
        _lost(
            opts,
            f"{part!r}: no entry after {format_pos(last)} within pollTimeoutMs="
            f"{opts.poll_timeout_ms}; the range's entries are gone (retention, deleted topic) "
            "or the broker is down",
        )

    yield from read_native(
        opts.service_url,
        part.topic,
        part.partition,
        part.start,
        part.end,
        acked=AckedRanges(part.acked),
        builder=BatchBuilder(part.topic, part.partition),
        rows_per_batch=opts.arrow_batch_rows,
        poll_timeout_ms=opts.poll_timeout_ms,
        on_first=on_first,
        on_timeout=on_timeout,
    )


def _read(reader: Any, part: RangePartition, opts: SourceOptions) -> Iterator[pa.RecordBatch]:
    start, end = part.start, part.end
    acked = AckedRanges(part.acked)
    builder = BatchBuilder(part.topic, part.partition)
    add = builder.add
    read_next = reader.read_next
    timeout = opts.poll_timeout_ms
    rows = opts.arrow_batch_rows
    last = start
    expect = part.expect_first
    n = 0
    while True:
        # At the end entry, only a message already on its way can still belong to the range
        # (the rest of a batch entry); asking first avoids waiting pollTimeoutMs for nothing.
        if last >= end and not reader.has_message_available():
            break
        try:
            msg = read_next(timeout)
        except pulsar.Timeout:
            _lost(
                opts,
                f"{part!r}: no entry after {format_pos(last)} within pollTimeoutMs={timeout}; "
                "the range's entries are gone (retention, deleted topic) or the broker is down",
            )
            break
        mid = msg.message_id()
        pos = (mid.ledger_id(), mid.entry_id())
        if pos <= start:
            continue
        if pos > end:
            break
        if expect is not None:
            if pos > expect:
                _lost(
                    opts,
                    f"{part!r}: entries {format_pos(expect)}..before {format_pos(pos)} were "
                    "deleted (retention) after the range was planned",
                )
            expect = None
        last = pos
        if acked and acked.contains(pos):
            continue
        add(msg, pos[0], pos[1], mid.batch_index())
        n += 1
        if n == rows:
            yield builder.build()
            n = 0
    if n:
        yield builder.build()


def _lost(opts: SourceOptions, text: str) -> None:
    """Fail on data loss, or log it when ``failOnDataLoss=false``."""
    if opts.fail_on_data_loss:
        raise DataLossError(text + " (set failOnDataLoss=false to go on)")
    log.warning("%s: skipped", text)
