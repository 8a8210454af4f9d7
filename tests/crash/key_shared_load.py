"""Keyed producers and Key_Shared consumers that ack with holes across broker crashes, what the
crashed broker had persisted of their acks, and the audits that compare the two.

Used by ``test_crash_key_shared.py`` (its docstring explains the model). Everything here runs in
the test process with the official client, which reconnects by itself after a restart.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import random
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pulsar

from keyshared.storage import batch_ack
from keyshared.storage.cursor_codec import decode_snapshot
from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet
from tests.ordering import ConsumptionRecorder, Delivery, MsgPos

TopicPos = tuple[str, MsgPos]


# --- producers -----------------------------------------------------------------------------------
class KeyedProducer:
    """A thread that publishes ``name:seq`` over a few hot keys at a steady rate and registers
    every confirmed message with the recorder (under the partition's topic name).

    The send timeout is off: messages pending when the broker dies are resent by the client
    once it has reconnected, so a message may be stored twice (once unconfirmed); only the
    confirmed copy is expected, the other is consumed like any message.
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        name: str,
        *,
        batched: bool,
        keys: Sequence[str],
        rng: random.Random,
        recorder: ConsumptionRecorder,
        rate: float,
    ) -> None:
        kwargs: dict[str, object] = {"batching_enabled": batched}
        if batched:
            kwargs.update(
                batching_type=pulsar.BatchingType.KeyBased,
                batching_max_publish_delay_ms=5,
                batching_max_messages=20,
            )
        self.producer = client.create_producer(
            topic,
            producer_name=name,
            max_pending_messages=300,
            block_if_queue_full=True,
            send_timeout_millis=0,
            **kwargs,
        )
        self.topic = topic
        self.name = name
        self.keys = list(keys)
        self.rng = rng
        self.recorder = recorder
        self.interval = 1.0 / rate
        self.sent = 0
        self.confirmed = 0
        self.failures: list[str] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"producer-{name}", daemon=True)

    def start(self) -> KeyedProducer:
        """Start publishing."""
        self._thread.start()
        return self

    def _topic_of(self, mid: pulsar.MessageId) -> str:
        p = mid.partition()
        return f"{self.topic}-partition-{p}" if p >= 0 else self.topic

    def _done(self, key: str) -> Callable[[pulsar.Result, pulsar.MessageId], None]:
        def done(res: pulsar.Result, mid: pulsar.MessageId) -> None:
            if res == pulsar.Result.Ok:
                self.recorder.expect(key, mid, topic=self._topic_of(mid))
                self.confirmed += 1
            else:
                self.failures.append(str(res))

        return done

    def _run(self) -> None:
        try:
            next_at = time.monotonic()
            while not self._stop.is_set():
                key = self.rng.choice(self.keys)
                data = f"{self.name}:{self.sent}".encode()
                self.producer.send_async(data, self._done(key), partition_key=key)
                self.sent += 1
                next_at += self.interval
                pause = next_at - time.monotonic()
                if pause > 0:
                    self._stop.wait(pause)
                else:
                    next_at = time.monotonic()  # fell behind (broker down): no burst after
        except BaseException as exc:  # reported by stop()
            self.errors.append(exc)

    def stop(self) -> None:
        """Stop publishing and wait until every message sent is confirmed."""
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), f"producer {self.name} is stuck"
        self.producer.flush()
        deadline = time.monotonic() + 10
        while self.confirmed + len(self.failures) < self.sent and time.monotonic() < deadline:
            time.sleep(0.01)  # the last callbacks may still be running
        self.producer.close()
        if self.errors:
            raise self.errors[0]
        assert not self.failures, f"{self.name}: failed sends {self.failures[:5]}"
        assert self.confirmed == self.sent, f"{self.name}: {self.confirmed}/{self.sent} confirmed"


# --- consumers -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ConsumerSpec:
    """How one Key_Shared consumer behaves."""

    name: str
    delay: float
    """Mean processing time of a message that is acked at once (exponential)."""
    hold_p: float
    """Chance that a message is held unacked (a hole) ..."""
    hold_s: tuple[float, float]
    """... for a uniform time in this range, then acked."""
    rejoin_p: float = 0.0
    """Chance per received message to close the consumer and subscribe again (same name)."""
    queue: int = 50


class CrashWorker:
    """One Key_Shared consumer in a thread: receive, record, ack at once or hold and ack later.

    The broker may die at any moment; the controller then calls :meth:`pause` (the loop stops
    between two steps), :meth:`drop_held` (what the application held is forgotten, as by an
    application whose session ended: the broker redelivers it), and after the restart and the
    client's reconnection :meth:`resume`. While the broker is down the loop may still take
    messages out of the client's receiver queue and ack them: that is what applications do.
    A rejoin (close, subscribe again) only happens while it can take ``rejoin_lock``, which the
    controller holds around a crash, so a subscribe never waits for a dead broker.
    """

    def __init__(
        self,
        client: pulsar.Client,
        topic: str,
        sub: str,
        spec: ConsumerSpec,
        recorder: ConsumptionRecorder,
        rng: random.Random,
        rejoin_lock: threading.Lock,
        *,
        batch_index_ack: bool,
        label: str,
    ) -> None:
        self.client = client
        self.topic = topic
        self.sub = sub
        self.spec = spec
        self.recorder = recorder
        self.rng = rng
        self.rejoin_lock = rejoin_lock
        self.batch_index_ack = batch_index_ack
        self.hold_p = spec.hold_p
        self.rejoin_p = spec.rejoin_p
        self.incarnation = 0
        self.base_label = label
        """Unique among the workers: the recorder tells consumers apart by label."""
        self.label = f"{label}#0"
        self.consumer = self._subscribe()
        self.held: list[tuple[float, pulsar.Message, Delivery]] = []
        self.received = 0
        self.acked = 0
        self.rejoins = 0
        self.rejoin_log: list[str] = []
        self.ack_errors: list[str] = []
        self.errors: list[BaseException] = []
        self.last_receive = time.monotonic()
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._paused = threading.Event()
        self._resume = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ks-{label}", daemon=True)

    def _subscribe(self) -> pulsar.Consumer:
        return self.client.subscribe(
            self.topic,
            self.sub,
            consumer_type=pulsar.ConsumerType.KeyShared,
            consumer_name=self.spec.name,
            receiver_queue_size=self.spec.queue,
            initial_position=pulsar.InitialPosition.Earliest,
            batch_index_ack_enabled=self.batch_index_ack,
        )

    def start(self) -> CrashWorker:
        """Start the loop."""
        self._thread.start()
        return self

    # --- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._pause.is_set():
                    self._paused.set()
                    self._resume.wait()
                    self._resume.clear()
                    continue
                self._step()
        except BaseException as exc:  # reported by check_errors
            self.errors.append(exc)
            self._paused.set()

    def _step(self) -> None:
        now = time.monotonic()
        if self.held and self.held[0][0] <= now:
            due = [h for h in self.held if h[0] <= now]
            self.held = [h for h in self.held if h[0] > now]
            for _, msg, d in due:
                self._ack(msg, d)
        try:
            msg = self.consumer.receive(timeout_millis=20)
        except pulsar.Timeout:
            return
        d = self.recorder.received(self.label, msg, topic=msg.topic_name())
        self.received += 1
        self.last_receive = time.monotonic()
        if self.rng.random() < self.hold_p:
            self.held.append((self.last_receive + self.rng.uniform(*self.spec.hold_s), msg, d))
            self.held.sort(key=lambda h: h[0])
        else:
            if self.spec.delay > 0:
                time.sleep(self.rng.expovariate(1.0 / self.spec.delay))
            self._ack(msg, d)
        if self.rng.random() < self.rejoin_p and self.rejoin_lock.acquire(blocking=False):
            try:
                self._rejoin()
            finally:
                self.rejoin_lock.release()

    def _ack(self, msg: pulsar.Message, d: Delivery) -> None:
        self.recorder.acking(d)
        try:
            self.consumer.acknowledge(msg)
            self.acked += 1
        except pulsar.PulsarException as exc:
            self.ack_errors.append(f"{d}: {exc!r}")

    def _rejoin(self) -> None:
        """Close (whatever is held goes back) and subscribe again under the same name."""
        at = self.recorder.now()
        self.consumer.close()
        self.recorder.closing(self.label, at=at)
        self.held = []
        self.incarnation += 1
        self.rejoins += 1
        self.label = f"{self.base_label}#{self.incarnation}"
        self.consumer = self._subscribe()
        self.rejoin_log.append(f"{self.label}@{at:.4f}-{self.recorder.now():.4f}")

    # --- control -------------------------------------------------------------------------------
    def pause(self, timeout: float = 15.0) -> None:
        """Stop the loop between two steps."""
        self._pause.set()
        assert self._paused.wait(timeout), f"{self.label} did not pause"
        self.check_errors()

    def drop_held(self, at: float) -> None:
        """(Paused) Forget the held messages: released at ``at`` in the recorder."""
        self.recorder.closing(self.label, at=at)
        self.held = []

    def resume(self) -> None:
        """Continue after :meth:`pause`."""
        self._paused.clear()  # here, not in the loop: a pause right after must wait again
        self._pause.clear()
        self._resume.set()

    def finish(self) -> None:
        """No more holes or rejoins; what is held gets acked now."""
        self.pause()
        self.hold_p = 0.0
        self.rejoin_p = 0.0
        self.held = [(0.0, m, d) for _, m, d in self.held]
        self.resume()

    def close(self) -> None:
        """Stop the loop and close the consumer."""
        self._stop.set()
        self._resume.set()
        self._thread.join(10)
        at = self.recorder.now()
        with contextlib.suppress(pulsar.PulsarException):
            self.consumer.close()
        self.recorder.closing(self.label, at=at)

    def check_errors(self) -> None:
        """Raise the first exception the loop hit."""
        if self.errors:
            raise self.errors[0]


# --- persisted ack state -------------------------------------------------------------------------
@dataclass(slots=True)
class PersistedAcks:
    """A durable cursor's ack state as stored: what a restarted broker starts from."""

    mark_delete: Position
    ranges: RangeSet
    batches: dict[Position, int]
    """Partially acked batch entries: position -> bitset of the still-UNacked indexes."""

    def is_acked(self, pos: MsgPos) -> bool:
        """Whether message ``pos`` (a batch index, or -1 for a whole entry) is acked."""
        entry = Position(pos.ledger, pos.entry)
        if entry <= self.mark_delete or self.ranges.contains(entry):
            return True
        bits = self.batches.get(entry)
        return bits is not None and pos.batch >= 0 and batch_ack.is_index_acked(bits, pos.batch)

    def describe(self) -> str:
        """Mark-delete position and counts, for reports."""
        return (
            f"mdp={self.mark_delete} ranges={len(self.ranges)} partial-batches={len(self.batches)}"
        )


def read_persisted_acks(
    data_dir: Path, topics: Iterable[str], sub: str
) -> dict[str, PersistedAcks]:
    """The stored cursor of ``sub`` on each topic (partition), read from the metadata database
    of a broker that is not running. Read only: the database is left for the broker to recover.
    """
    uri = f"file:{data_dir / 'metadata.sqlite'}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        out = {}
        for topic in topics:
            row = conn.execute(
                "SELECT value FROM kv WHERE key = ?", (f"cursors/{topic}/{sub}",)
            ).fetchone()
            assert row is not None, f"no stored cursor {sub} for {topic}"
            snap = decode_snapshot(bytes(row[0]))
            out[topic] = PersistedAcks(
                snap.mark_delete,
                RangeSet.from_bytes(snap.ranges),
                {pos: batch_ack.from_words(words) for pos, words in snap.batch_indexes},
            )
        return out
    finally:
        conn.close()


@dataclass(slots=True)
class Crash:
    """One SIGKILL: when, and what the broker had persisted by then."""

    killed_at: float
    """Recorder time taken just before the SIGKILL: an ack recorded later cannot be in ``acks``."""
    restart_at: float
    """Recorder time taken just before the restart, every consumer paused: deliveries recorded
    later belong to the restarted broker."""
    acks: dict[str, PersistedAcks]


@dataclass(slots=True)
class AuditReport:
    """Figures of the crash audits."""

    redeliveries: int = 0
    after_lost_ack: int = 0
    """Redeliveries of a message acked before a restart whose ack was not persisted."""
    persisted_acked: list[int] = field(default_factory=list)
    """Per kill: known messages whose ack was persisted."""
    problems: list[str] = field(default_factory=list)


def session_of(crashes: Sequence[Crash], t: float) -> int:
    """0 before the first restart, k after the k-th."""
    return bisect.bisect_right([c.restart_at for c in crashes], t)


def entry_ack_times(
    deliveries: Sequence[Delivery], known: Iterable[TopicPos], topics: Iterable[str]
) -> dict[int, float | None]:
    """When the client acked the entry of each batched delivery on ``topics`` (consumers
    without batch-index acks), by delivery ``seq``: None while an index stays unacked.

    Such a client acks an entry only once the application has acked every message of the
    batch it came in; an index acked before that never reached the broker. A batch's size is
    its highest index seen plus one (a batch is confirmed, and delivered, all or nothing).
    """
    wanted = set(topics)
    size: dict[tuple[str, int, int], int] = defaultdict(int)
    for topic, pos in known:
        if topic in wanted and pos.batch >= 0:
            key = (topic, pos.ledger, pos.entry)
            size[key] = max(size[key], pos.batch + 1)
    runs: dict[tuple[str, str, int, int], list[list[Delivery]]] = defaultdict(list)
    for d in sorted(deliveries, key=lambda x: x.seq):
        if d.topic not in wanted or d.pos.batch < 0:
            continue
        group = runs[(d.topic, d.consumer, d.pos.ledger, d.pos.entry)]
        # One delivery of the entry to this consumer, until an index comes again.
        if not group or any(x.pos.batch == d.pos.batch for x in group[-1]):
            group.append([])
        group[-1].append(d)
    out: dict[int, float | None] = {}
    for (topic, _, ledger, entry_id), groups in runs.items():
        n = size[(topic, ledger, entry_id)]
        for run in groups:
            acks = [x.acked for x in run if x.acked is not None]
            at = max(acks) if len(acks) == len(run) == n else None
            for x in run:
                out[x.seq] = at
    return out


def audit_crashes(
    deliveries: Sequence[Delivery],
    expected: Iterable[TopicPos],
    crashes: Sequence[Crash],
    entry_ack_topics: Iterable[str] = (),
) -> AuditReport:
    """The crash rules, on top of :func:`tests.ordering.check` (which runs with duplicates
    allowed, as acks may be lost in a crash):

    1. an ack the broker had persisted when it was killed was made by the application before
       the kill (else a message was dropped without being consumed);
    2. persisted ack state never goes back: acked at one kill, acked at every later one;
    3. a message whose ack was persisted at a kill is never delivered after that restart;
    4. a message delivered twice was not held when delivered again, and if its ack had been
       sent before, a restart lies between that ack and the new delivery: an ack a broker
       received is not lost while it lives (the client flushes acks before a close).

    ``entry_ack_topics``: topics whose consumers ack batches as whole entries (no batch-index
    acks), where an acked message of a partly acked batch is legitimately delivered again.
    """
    report = AuditReport()
    problems = report.problems
    by_pos: dict[TopicPos, list[Delivery]] = defaultdict(list)
    for d in deliveries:
        by_pos[(d.topic, d.pos)].append(d)
    known = sorted(set(expected) | set(by_pos))

    previous: dict[str, PersistedAcks] = {}
    for k, crash in enumerate(crashes, 1):
        count = 0
        for topic, pos in known:
            acks = crash.acks.get(topic)
            if acks is None or not acks.is_acked(pos):
                if topic in previous and previous[topic].is_acked(pos):
                    problems.append(f"kill {k}: {pos} on {topic} acked at kill {k - 1}, not now")
                continue
            count += 1
            made = by_pos.get((topic, pos), [])
            if not any(d.acked is not None and d.acked <= crash.killed_at for d in made):
                problems.append(
                    f"kill {k}: {pos} on {topic} persisted as acked, yet no consumer acked it "
                    f"before the kill ({[str(d) for d in made]})"
                )
        report.persisted_acked.append(count)
        previous = crash.acks

    entry_acked = entry_ack_times(deliveries, known, entry_ack_topics)
    for (topic, pos), group in by_pos.items():
        for d in group:
            s = session_of(crashes, d.received)
            if s and any(c.acks[topic].is_acked(pos) for c in crashes[:s] if topic in c.acks):
                problems.append(
                    f"acked and persisted before restart {s}, yet delivered again: {d} on {topic}"
                )
        if len(group) < 2:
            continue
        group = sorted(group, key=lambda x: x.received)
        report.redeliveries += len(group) - 1
        for earlier, later in itertools.pairwise(group):
            if earlier.end > later.received:
                problems.append(f"delivered again while held: {earlier} / {later} on {topic}")
                continue
            sent = entry_acked.get(earlier.seq, earlier.acked)
            if sent is None or sent > later.received:
                continue
            if session_of(crashes, sent) == session_of(crashes, later.received):
                problems.append(
                    f"delivered again after its ack reached the same broker: "
                    f"{earlier} / {later} on {topic}"
                )
            else:
                report.after_lost_ack += 1
    return report
