"""The ``keyshared`` data source: batch and streaming reads of topics, batch and streaming writes.

Offsets (streaming checkpoints, ``startingOffsets`` / ``endingOffsets`` JSON) map each topic
partition's full name to the last entry included, ``"LEDGER:ENTRY"`` (``"-1:-1"``: nothing yet).
A range is ``(start, end]``, read by one Spark task in publish order; Spark's checkpoint is the
only record of progress, so a restarted query replays an unfinished micro-batch with the same
offsets and gets the same rows (exactly-once together with an idempotent sink).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pulsar
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from keyshared.spark.options import SinkOptions, SourceOptions
from keyshared.spark.planner import PartitionState, Planner
from keyshared.spark.positions import (
    BEFORE_ALL,
    Pos,
    advance,
    count_between,
    format_pos,
    next_entry,
    parse_pos,
    split_range,
)
from keyshared.spark.reading import RangePartition, read_range, shared_client
from keyshared.spark.schema import ROW_SCHEMA

log = logging.getLogger(__name__)

FORMAT = "keyshared"
"""The short name: ``spark.read.format("keyshared")``."""


class KeysharedDataSource(DataSource):
    """Topics of a keyshared (or Pulsar) broker as DataFrames; see the package README."""

    @classmethod
    def name(cls) -> str:
        """The format name Spark registers."""
        return FORMAT

    def schema(self) -> StructType:
        """The fixed row schema (:data:`keyshared.spark.schema.ROW_SCHEMA`)."""
        return ROW_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read."""
        return KeysharedBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A streaming read."""
        return KeysharedStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch write (appends; ``overwrite`` has no meaning for a topic)."""
        from keyshared.spark.sink import KeysharedBatchWriter

        return KeysharedBatchWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """A streaming write."""
        from keyshared.spark.sink import KeysharedStreamWriter

        return KeysharedStreamWriter(SinkOptions.parse(self.options), schema)


# --- planning helpers shared by both readers ----------------------------------------------


def _resolve(spec: str | dict[str, str], name: str, state: PartitionState) -> Pos:
    """One partition's position named by an offsets option."""
    if isinstance(spec, dict):
        value = spec.get(name)
        if value is None:
            value = spec.get(state.topic.base.full + "/" + str(state.topic.partition_index))
        if value is None:
            return BEFORE_ALL
        spec = value
    if spec == "earliest":
        return BEFORE_ALL
    if spec == "latest":
        return state.latest
    return parse_pos(spec)


def _ranges(
    planner: Planner,
    states: dict[str, PartitionState],
    starts: dict[str, Pos],
    ends: dict[str, Pos],
    acked: dict[str, tuple[tuple[Pos, Pos], ...]] | None = None,
) -> list[RangePartition]:
    opts = planner.opts
    out: list[RangePartition] = []
    for name in sorted(ends):
        end = ends[name]
        start = starts.get(name, BEFORE_ALL)
        if end <= start:
            continue
        state = states.get(name)
        index = state.topic.partition_index if state else -1
        if state is not None:
            planner.check_data_loss(state, start)
        holes = (acked or {}).get(name, ())
        expect = None
        if state is not None and state.ledgers is not None:
            expect = next_entry(state.ledgers, start)
            if expect is not None and expect > end:
                expect = None
        out.append(RangePartition(name, index, start, end, holes, expect))
    want = opts.min_partitions
    if want > len(out) and out:
        pieces = -(-want // len(out))
        split: list[RangePartition] = []
        for part in out:
            state = states.get(part.topic)
            if state is None or state.ledgers is None:
                split.append(part)
                continue
            lo = part.start
            for hi in split_range(state.ledgers, part.start, part.end, pieces):
                first = next_entry(state.ledgers, lo)
                split.append(RangePartition(part.topic, part.partition, lo, hi, part.acked, first))
                lo = hi
        out = split
    return out


class KeysharedBatchReader(DataSourceReader):
    """``spark.read.format("keyshared")``: one Spark partition per topic partition."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        """Plan the ranges on the driver; ends are fixed here, so task retries agree."""
        planner = Planner(self.opts)
        try:
            states = planner.snapshot()
            starts: dict[str, Pos] = {}
            acked: dict[str, tuple[tuple[Pos, Pos], ...]] = {}
            ends: dict[str, Pos] = {}
            for name, state in states.items():
                if self.opts.subscription:
                    mdp, holes = planner.cursor_start(state, self.opts.subscription)
                    starts[name] = mdp
                    acked[name] = tuple(holes)
                else:
                    starts[name] = _resolve(self.opts.starting_offsets, name, state)
                ends[name] = min(_resolve(self.opts.ending_offsets, name, state), state.latest)
            return _ranges(planner, states, starts, ends, acked)
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one range (executor)."""
        assert isinstance(partition, RangePartition)
        return read_range(partition, self.opts)


class KeysharedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of per-partition ranges; ``maxRecordsPerBatch`` caps each one."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._planner: Planner | None = None
        self._target: dict[str, Pos] | None = None
        self._tracking: dict[str, Any] = {}

    @property
    def planner(self) -> Planner:
        """Created on first use: executors unpickle this object and never need it."""
        if self._planner is None:
            self._planner = Planner(self.opts, cache_seconds=0.1)
        return self._planner

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "_planner": None, "_target": None, "_tracking": {}}

    def initialOffset(self) -> dict[str, str]:
        """Where a new query starts: ``startingOffsets`` (default ``latest``)."""
        states = self.planner.snapshot()
        return {
            n: format_pos(_resolve(self.opts.starting_offsets, n, s)) for n, s in states.items()
        }

    def getDefaultReadLimit(self) -> ReadLimit:
        """``ReadMaxRows(maxRecordsPerBatch)`` when set."""
        n = self.opts.max_records_per_batch
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the end of an ``availableNow`` run at what exists now."""
        self._target = {n: s.latest for n, s in self.planner.snapshot().items()}

    def latestOffset(self, start: dict[str, str], limit: ReadLimit) -> dict[str, str]:
        """The end of the next micro-batch."""
        states = self.planner.snapshot()
        starts = {n: parse_pos(v) for n, v in (start or {}).items()}
        latest = {n: s.latest for n, s in states.items()}
        if self._target is not None:
            latest = {n: min(p, self._target.get(n, BEFORE_ALL)) for n, p in latest.items()}
        for n, p in starts.items():
            latest[n] = max(latest.get(n, p), p)
        if isinstance(limit, ReadMaxRows):
            latest = self._cap(states, starts, latest, limit.max_rows)
        return {n: format_pos(p) for n, p in sorted(latest.items())}

    def _cap(
        self,
        states: dict[str, PartitionState],
        starts: dict[str, Pos],
        latest: dict[str, Pos],
        budget: int,
    ) -> dict[str, Pos]:
        backlog: dict[str, int] = {}
        for n, end in latest.items():
            s = starts.get(n, BEFORE_ALL)
            st = states.get(n)
            if end <= s:
                continue
            if st is not None and st.ledgers is not None:
                backlog[n] = count_between(st.ledgers, s, end)
            else:
                backlog[n] = end[1] - s[1] if s[0] == end[0] else budget
        total = sum(backlog.values())
        if total <= budget:
            return latest
        # Proportional shares, then the remainder to the largest backlogs (Kafka's rule).
        share = {n: budget * b // total for n, b in backlog.items()}
        left = budget - sum(share.values())
        for n in sorted(backlog, key=lambda k: (-backlog[k], k)):
            if left <= 0:
                break
            if share[n] < backlog[n]:
                share[n] += 1
                left -= 1
        out = dict(latest)
        for n, k in share.items():
            st = states.get(n)
            ledgers = st.ledgers if st is not None else None
            out[n] = advance(ledgers, starts.get(n, BEFORE_ALL), k, latest[n])
        return out

    def reportLatestOffset(self) -> dict[str, str]:
        """The uncapped ends, for progress reports."""
        return {n: format_pos(s.latest) for n, s in self.planner.snapshot().items()}

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> Sequence[InputPartition]:
        """One range per partition that has new entries."""
        planner = self.planner
        states = planner.snapshot()
        starts = {n: parse_pos(v) for n, v in start.items()}
        ends = {n: parse_pos(v) for n, v in end.items()}
        return _ranges(planner, states, starts, ends)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one range (executor)."""
        assert isinstance(partition, RangePartition)
        return read_range(partition, self.opts)

    def commit(self, end: dict[str, str]) -> None:
        """Move the tracking subscription (if configured) to ``end``: a retention guard and a
        visible backlog. Spark calls it one batch late; the checkpoint stays the truth."""
        name = self.opts.predefined_subscription or (
            f"{self.opts.subscription_prefix}-tracking" if self.opts.subscription_prefix else None
        )
        if name is None:
            return
        client = shared_client(self.opts.service_url, self.opts.client_kwargs)
        for topic, value in end.items():
            pos = parse_pos(value)
            if pos == BEFORE_ALL:
                continue
            consumer = self._tracking.get(topic)
            if consumer is None:
                consumer = client.subscribe(
                    topic,
                    name,
                    receiver_queue_size=1,
                    initial_position=pulsar.InitialPosition.Earliest,
                )
                self._tracking[topic] = consumer
            index = states_index(topic)
            consumer.acknowledge_cumulative(pulsar.MessageId(index, pos[0], pos[1], -1))

    def stop(self) -> None:
        """Close the driver's consumers."""
        for consumer in self._tracking.values():
            try:
                consumer.close()
            except Exception:
                log.debug("close failed", exc_info=True)
        self._tracking.clear()
        if self._planner is not None:
            self._planner.close()


def states_index(topic: str) -> int:
    """Partition index of a topic partition's full name (-1 when not partitioned)."""
    from keyshared.spark.topics import Topic

    return Topic.parse(topic).partition_index
