"""Record what Key_Shared consumers receive and ack, then check per-key order and exclusivity.

A consumer loop tells a :class:`ConsumptionRecorder` what happens, at the moment it happens:

* ``received(consumer, msg)`` right after ``receive()`` returned;
* ``acking(delivery)`` right *before* calling ``acknowledge()``;
* ``releasing(delivery)`` right before ``negative_acknowledge()`` (the message goes back);
* ``closing(consumer)`` right before ``Consumer.close()`` (whatever it holds goes back).

Times come from one monotonic clock in one process, and each is taken on the conservative side
(a receive is recorded after the broker sent it, an ack before the broker can have seen it), so
an overlap the checker reports is a real overlap at the broker, never an artefact of timing.
What it cannot see (a message dispatched to a consumer's receiver queue but never taken out of
it) makes it less strict, never wrong.

:func:`check` then asserts, for every key:

* exclusivity: no two consumers hold an unacked message of the key at the same time;
* per consumer, increasing message ids, except deliveries of an id seen before (redeliveries);
* across consumers, first deliveries in increasing id order (what a key's processing sees);
* nothing lost: every expected id was acked;
* duplicates only where allowed: an id is delivered again only if no earlier delivery was acked.

An ordering test must be able to fail: it needs few hot keys and uneven consumer speed
(research anchors §2), otherwise every key recurs too rarely for an inversion to show.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Protocol


class _MessageId(Protocol):
    def ledger_id(self) -> int: ...
    def entry_id(self) -> int: ...
    def batch_index(self) -> int: ...


class _Message(Protocol):
    def message_id(self) -> _MessageId: ...
    def partition_key(self) -> str: ...
    def ordering_key(self) -> str: ...
    def redelivery_count(self) -> int: ...
    def topic_name(self) -> str: ...


@dataclass(frozen=True, slots=True, order=True)
class MsgPos:
    """A message's position: (ledger, entry, batch index); orderable like Pulsar's ids."""

    ledger: int
    entry: int
    batch: int = -1

    @classmethod
    def of(cls, message_id: _MessageId) -> MsgPos:
        """The position of an official client ``MessageId``."""
        return cls(message_id.ledger_id(), message_id.entry_id(), message_id.batch_index())

    def __str__(self) -> str:
        return f"{self.ledger}:{self.entry}" + (f":{self.batch}" if self.batch >= 0 else "")


@dataclass(slots=True)
class Delivery:
    """One message handed to one consumer's application."""

    seq: int
    consumer: str
    key: str
    pos: MsgPos
    received: float
    redelivery_count: int
    topic: str = ""
    acked: float | None = None
    released: float | None = None

    @property
    def end(self) -> float:
        """When the consumer stopped holding it (inf while still held)."""
        if self.acked is not None:
            return self.acked
        if self.released is not None:
            return self.released
        return float("inf")

    def __str__(self) -> str:
        state = (
            f"acked@{self.acked:.4f}"
            if self.acked is not None
            else f"released@{self.released:.4f}"
            if self.released is not None
            else "held"
        )
        return (
            f"#{self.seq} {self.consumer} key={self.key!r} {self.pos} "
            f"recv@{self.received:.4f} redeliveries={self.redelivery_count} {state}"
        )


def _default_key(msg: _Message) -> str:
    ordering = msg.ordering_key()
    return ordering if ordering else msg.partition_key()


class ConsumptionRecorder:
    """Thread-safe log of deliveries, acks and releases from any number of consumer loops."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        key_of: Callable[[_Message], str] = _default_key,
    ) -> None:
        self._clock = clock
        self._key_of = key_of
        self._lock = threading.Lock()
        self._deliveries: list[Delivery] = []
        self._expected: dict[tuple[str, MsgPos], str] = {}

    # --- what was sent ----------------------------------------------------------------------
    def expect(self, key: str, message_id: _MessageId, topic: str = "") -> None:
        """Register a sent message that must be consumed (acked) in the end."""
        with self._lock:
            self._expected[(topic, MsgPos.of(message_id))] = key

    @property
    def expected_count(self) -> int:
        """How many messages were registered with :meth:`expect`."""
        with self._lock:
            return len(self._expected)

    # --- what consumers do ------------------------------------------------------------------
    def now(self) -> float:
        """The recorder's clock."""
        return self._clock()

    def received(self, consumer: str, msg: _Message, *, topic: str = "") -> Delivery:
        """Call right after ``receive()`` returned ``msg`` to ``consumer``."""
        now = self._clock()
        pos = MsgPos.of(msg.message_id())
        key = self._key_of(msg)
        count = msg.redelivery_count()
        with self._lock:
            d = Delivery(len(self._deliveries), consumer, key, pos, now, count, topic)
            self._deliveries.append(d)
        return d

    def acking(self, delivery: Delivery) -> None:
        """Call right before acknowledging ``delivery``'s message."""
        now = self._clock()
        with self._lock:
            if delivery.acked is None and delivery.released is None:
                delivery.acked = now

    def releasing(self, delivery: Delivery) -> None:
        """Call right before a negative ack (or any redelivery request) of ``delivery``."""
        now = self._clock()
        with self._lock:
            if delivery.acked is None and delivery.released is None:
                delivery.released = now

    def closing(self, consumer: str, *, at: float | None = None) -> None:
        """Call right before ``consumer`` closes: every message it holds goes back.

        ``at``: a time taken earlier (before the close), for loops that can only be stopped
        by closing their consumer and may record a delivery in between.
        """
        now = self._clock() if at is None else at
        with self._lock:
            for d in self._deliveries:
                if d.consumer == consumer and d.acked is None and d.released is None:
                    d.released = now

    # --- reading ------------------------------------------------------------------------------
    def deliveries(self) -> list[Delivery]:
        """A snapshot of every delivery, in recording order."""
        with self._lock:
            return list(self._deliveries)

    def acked_positions(self) -> set[tuple[str, MsgPos]]:
        """Every (topic, position) acked at least once."""
        with self._lock:
            return {(d.topic, d.pos) for d in self._deliveries if d.acked is not None}

    def missing(self) -> list[tuple[str, MsgPos]]:
        """Expected messages not acked (yet)."""
        with self._lock:
            acked = {(d.topic, d.pos) for d in self._deliveries if d.acked is not None}
            return sorted(k for k in self._expected if k not in acked)

    def expected(self) -> dict[tuple[str, MsgPos], str]:
        """The registered messages and their keys."""
        with self._lock:
            return dict(self._expected)


class OrderingViolation(AssertionError):
    """A delivery log broke one of the Key_Shared rules."""


@dataclass(slots=True)
class CheckReport:
    """What :func:`check` found (raised as :class:`OrderingViolation` when not ok)."""

    deliveries: int = 0
    keys: int = 0
    consumers: int = 0
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no rule was broken."""
        return not self.problems


@dataclass(frozen=True, slots=True)
class _Problem:
    """One broken rule, with the key and time to show the key's history around."""

    text: str
    topic: str = ""
    key: str | None = None
    at: float | None = None


def _exclusivity(by_key: dict[tuple[str, str], list[Delivery]], out: list[_Problem]) -> None:
    for (topic, key), ds in by_key.items():
        # Sweep deliveries by receive time, keeping the open holds of each consumer.
        holds: list[Delivery] = []
        for d in sorted(ds, key=lambda x: x.received):
            holds = [h for h in holds if h.end > d.received]
            other = next((h for h in holds if h.consumer != d.consumer), None)
            if other is not None:
                text = (
                    f"exclusivity: key {key!r}{_at(topic)} held by {other.consumer} "
                    f"({other}) when {d.consumer} received ({d})"
                )
                out.append(_Problem(text, topic, key, d.received))
                break
            holds.append(d)


def _consumer_order(by_key: dict[tuple[str, str], list[Delivery]], out: list[_Problem]) -> None:
    for (topic, key), ds in by_key.items():
        seen: set[MsgPos] = set()
        last: dict[str, Delivery] = {}
        for d in sorted(ds, key=lambda x: x.seq):
            repeat = d.pos in seen or d.redelivery_count > 0
            seen.add(d.pos)
            prev = last.get(d.consumer)
            if not repeat:
                if prev is not None and d.pos <= prev.pos:
                    text = (
                        f"order on {d.consumer}: key {key!r}{_at(topic)} got {d.pos} "
                        f"after {prev.pos} ({prev} / {d})"
                    )
                    out.append(_Problem(text, topic, key, d.received))
                    break
                last[d.consumer] = d


def _key_order(by_key: dict[tuple[str, str], list[Delivery]], out: list[_Problem]) -> None:
    for (topic, key), ds in by_key.items():
        seen: set[MsgPos] = set()
        prev: Delivery | None = None
        for d in sorted(ds, key=lambda x: x.received):
            repeat = d.pos in seen or d.redelivery_count > 0
            seen.add(d.pos)
            if repeat:
                continue
            if prev is not None and d.pos < prev.pos:
                text = (
                    f"key order: key {key!r}{_at(topic)} first delivered {d.pos} after "
                    f"{prev.pos} ({prev} / {d})"
                )
                out.append(_Problem(text, topic, key, d.received))
                break
            prev = d


def _duplicates(ds: Iterable[Delivery], allow_after_ack: bool, out: list[_Problem]) -> int:
    by_pos: dict[tuple[str, MsgPos], list[Delivery]] = defaultdict(list)
    for d in ds:
        by_pos[(d.topic, d.pos)].append(d)
    dups = 0
    for (topic, pos), group in by_pos.items():
        if len(group) < 2:
            continue
        dups += len(group) - 1
        if allow_after_ack:
            continue
        group.sort(key=lambda x: x.received)
        for earlier, later in pairwise(group):
            if earlier.acked is not None and earlier.acked <= later.received:
                text = (
                    f"duplicate after ack: {pos}{_at(topic)} acked by {earlier.consumer} "
                    f"({earlier}) then delivered again ({later})"
                )
                out.append(_Problem(text, topic))
                break
            if earlier.end > later.received:
                text = (
                    f"duplicate while held: {pos}{_at(topic)} held by {earlier.consumer} "
                    f"({earlier}) when delivered again ({later})"
                )
                out.append(_Problem(text, topic))
                break
    return dups


def _at(topic: str) -> str:
    return f" on {topic}" if topic else ""


def history(
    ds: Iterable[Delivery], key: str, *, around: float | None = None, span: int = 15
) -> str:
    """A key's deliveries by receive time, compactly (``consumer:pos+state``), for reports.

    With ``around`` (a receive time) only ``span`` deliveries either side of it are shown.
    """
    mine = sorted((d for d in ds if d.key == key), key=lambda x: x.received)
    if around is not None:
        at = next((i for i, d in enumerate(mine) if d.received >= around), len(mine))
        mine = mine[max(0, at - span) : at + span]

    def state(d: Delivery) -> str:
        return "" if d.acked is not None else "~" if d.released is not None else "!"

    return " ".join(f"{d.consumer}:{d.pos}{state(d)}" for d in mine)


def check(
    recorder: ConsumptionRecorder,
    *,
    exclusive: bool = True,
    consumer_order: bool = True,
    key_order: bool = True,
    complete: bool = True,
    duplicates_after_ack: bool = False,
) -> CheckReport:
    """Check the recorded log; raise :class:`OrderingViolation` listing every rule broken.

    ``exclusive``: no key held unacked by two consumers at once (PIP-379's contract).
    ``consumer_order`` / ``key_order``: per consumer, and per key across consumers, first
    deliveries come in increasing id order. ``complete``: every expected message was acked.
    ``duplicates_after_ack``: allow an acked id to come again (broker crash, lost acks).
    """
    ds = recorder.deliveries()
    by_key: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
    for d in ds:
        by_key[(d.topic, d.key)].append(d)
    report = CheckReport(
        deliveries=len(ds), keys=len(by_key), consumers=len({d.consumer for d in ds})
    )
    found: list[_Problem] = []
    if exclusive:
        _exclusivity(by_key, found)
    if consumer_order:
        _consumer_order(by_key, found)
    if key_order:
        _key_order(by_key, found)
    report.duplicates = _duplicates(ds, duplicates_after_ack, found)
    if complete:
        missing = recorder.missing()
        if missing:
            shown = ", ".join(f"{p}{_at(t)}" for t, p in missing[:10])
            found.append(_Problem(f"lost: {len(missing)} expected messages never acked: {shown}"))
    report.problems = [p.text for p in found]
    if found:
        lines = list(report.problems)
        shown_keys: set[tuple[str, str]] = set()
        for p in found:
            if p.key is None or (p.topic, p.key) in shown_keys:
                continue
            shown_keys.add((p.topic, p.key))
            lines.append(
                f"history of {p.key!r}{_at(p.topic)} around the problem "
                f"(consumer:position, ~ released, ! held): "
                + history(by_key[(p.topic, p.key)], p.key, around=p.at)
            )
        raise OrderingViolation(
            f"{len(found)} problem(s) in {report.deliveries} deliveries of {report.keys} "
            f"keys over {report.consumers} consumers:\n  " + "\n  ".join(lines)
        )
    return report
