"""Deduplication's decision logic: which sends are new, duplicates, or wait on a write.

Synchronous and free of I/O so that tests and the simulator drive it directly;
:mod:`keyshared.broker.dedup` keeps it with a topic's ledger and metadata store. The rules
(exact persisted ranges per producer, the floor past :data:`MAX_RANGES`, chunked messages,
producer-name expiry) are described in that module's docstring.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from keyshared.broker.sequence_ids import SendIds, SequenceRanges
from keyshared.storage.position import Position

log = logging.getLogger("keyshared.broker.dedup")

RECENT_LIMIT = 100_000
"""Entries per topic whose position is remembered to answer a duplicate with it."""
MAX_RANGES = 4096
"""Ranges of persisted sequence ids kept per producer (~72 bytes each in memory)."""
MAX_PARTIAL_CHUNKED = 64
"""Chunked messages per producer tracked while only some of their chunks are stored."""

T = TypeVar("T", bound=Hashable)

__all__ = [
    "DUPLICATE",
    "MAX_PARTIAL_CHUNKED",
    "MAX_RANGES",
    "NEW",
    "RECENT_LIMIT",
    "WAIT",
    "Decision",
    "DedupState",
    "ProducerState",
]

NEW = "new"
DUPLICATE = "duplicate"
WAIT = "wait"


@dataclass(slots=True)
class Decision(Generic[T]):
    """What to do with one send.

    ``NEW``: store it. ``DUPLICATE``: confirm it with ``position`` (the original, or None when
    forgotten) without storing. ``WAIT``: the same messages are being written right now by an
    earlier send (whose tokens are ``waits``); answer like it once those writes end.
    """

    kind: str
    position: Position | None = None
    waits: tuple[T, ...] = ()


@dataclass(slots=True)
class _Chunked:
    num_chunks: int
    stored: set[int] = field(default_factory=set)


@dataclass(slots=True)
class ProducerState(Generic[T]):
    """One producer name's persisted and in-flight sequence ids."""

    persisted: SequenceRanges = field(default_factory=SequenceRanges)
    highest: int = -1
    # Ids below the floor are no longer known: stored if sent (see the module docstring).
    floor: int | None = None
    chunked: OrderedDict[int, _Chunked] = field(default_factory=OrderedDict)
    in_flight: dict[int, T] = field(default_factory=dict)
    chunks_in_flight: dict[tuple[int, int], T] = field(default_factory=dict)


class DedupState(Generic[T]):
    """Per-topic deduplication decisions, pure and synchronous.

    The caller asks :meth:`check` before storing a send; for a ``NEW`` one it calls
    :meth:`pushed` when the entry is handed to storage (with a token that identifies that
    write, e.g. its future) and then :meth:`persisted` or :meth:`failed` once the write ends.
    """

    def __init__(self, max_ranges: int = MAX_RANGES, recent_limit: int = RECENT_LIMIT) -> None:
        self.producers: dict[str, ProducerState[T]] = {}
        self.max_ranges = max_ranges
        self.recent_limit = recent_limit
        self._recent: OrderedDict[tuple[str, int, int], Position] = OrderedDict()
        self.duplicates_dropped = 0
        self.duplicates_maybe_stored = 0
        # Names with a producer connected, and since when each other known name has had none
        # (oldest first).
        self.connected: set[str] = set()
        self.idle: OrderedDict[str, float] = OrderedDict()

    # --- queries ---------------------------------------------------------------------------
    def last_sequence_id(self, producer_name: str) -> int:
        """Highest persisted sequence id of ``producer_name`` (-1 if none)."""
        st = self.producers.get(producer_name)
        return st.highest if st is not None else -1

    def is_persisted(self, producer_name: str, sequence_id: int) -> bool | None:
        """Whether the id is known persisted; None when it is below the producer's floor."""
        st = self.producers.get(producer_name)
        if st is None:
            return False
        if sequence_id in st.persisted:
            return True
        if st.floor is not None and sequence_id < st.floor:
            return None
        return False

    def original(self, producer_name: str, send: SendIds) -> Position | None:
        """Where the entry that first stored ``send`` is, if still remembered."""
        chunk_id = send.chunk[0] if send.chunk is not None else -1
        return self._recent.get((producer_name, send.first, chunk_id))

    def check(self, producer_name: str, send: SendIds) -> Decision[T]:
        """Classify a send before it is stored."""
        st = self.producers.get(producer_name)
        if st is None:
            return Decision(NEW)
        if send.chunk is not None:
            return self._check_chunk(producer_name, st, send.first, send.chunk[0])
        seen = 0
        writing = 0
        unknown = 0
        waits: dict[T, None] = {}
        floor = st.floor
        persisted = st.persisted
        in_flight = st.in_flight
        for i in send.ids:
            if i in persisted:
                seen += 1
                continue
            tok = in_flight.get(i)
            if tok is not None:
                writing += 1
                waits[tok] = None
            elif floor is not None and i < floor:
                unknown += 1
        if seen + writing == len(send.ids):
            self.duplicates_dropped += 1
            if waits:
                return Decision(WAIT, None, tuple(waits))
            return Decision(DUPLICATE, self.original(producer_name, send))
        if seen or writing or unknown:
            self.duplicates_maybe_stored += 1
            log.warning(
                "producer %s: entry with sequence id %d holds messages stored before or not "
                "known either way (%d of %d); storing it so that none is lost",
                producer_name,
                send.first,
                seen + writing + unknown,
                len(send.ids),
            )
        return Decision(NEW)

    def _check_chunk(
        self, producer_name: str, st: ProducerState[T], seq: int, chunk_id: int
    ) -> Decision[T]:
        key = (producer_name, seq, chunk_id)
        if seq in st.persisted:
            self.duplicates_dropped += 1
            return Decision(DUPLICATE, self._recent.get(key))
        progress = st.chunked.get(seq)
        if progress is not None and chunk_id in progress.stored:
            self.duplicates_dropped += 1
            return Decision(DUPLICATE, self._recent.get(key))
        tok = st.chunks_in_flight.get((seq, chunk_id))
        if tok is not None:
            self.duplicates_dropped += 1
            return Decision(WAIT, None, (tok,))
        if st.floor is not None and seq < st.floor:
            self.duplicates_maybe_stored += 1
        return Decision(NEW)

    # --- updates ---------------------------------------------------------------------------
    def _state(self, producer_name: str) -> ProducerState[T]:
        st = self.producers.get(producer_name)
        if st is None:
            st = self.producers[producer_name] = ProducerState()
        return st

    def pushed(self, producer_name: str, send: SendIds, token: T) -> None:
        """A ``NEW`` send was handed to storage as the write ``token``."""
        st = self._state(producer_name)
        if send.chunk is not None:
            st.chunks_in_flight[(send.first, send.chunk[0])] = token
            return
        for i in send.ids:
            st.in_flight[i] = token

    def failed(self, producer_name: str, send: SendIds, token: T) -> None:
        """The write ``token`` failed: its messages are not stored (a resend is new)."""
        st = self.producers.get(producer_name)
        if st is not None:
            self._forget_in_flight(st, send, token)

    def persisted(
        self, producer_name: str, send: SendIds, position: Position, token: T | None = None
    ) -> None:
        """The entry at ``position`` holding ``send`` is durable (``token``: its write, or
        None when replayed from the log)."""
        st = self._state(producer_name)
        if token is not None:
            self._forget_in_flight(st, send, token)
        if send.chunk is not None:
            self._chunk_persisted(producer_name, st, send.first, send.chunk, position)
            return
        self._remember(producer_name, send.first, -1, position)
        st.persisted.add(send.ids)
        top = max(send.ids)
        if top > st.highest:
            st.highest = top
        self._bound(producer_name, st)

    def _chunk_persisted(
        self,
        producer_name: str,
        st: ProducerState[T],
        seq: int,
        chunk: tuple[int, int],
        position: Position,
    ) -> None:
        chunk_id, num_chunks = chunk
        self._remember(producer_name, seq, chunk_id, position)
        if seq in st.persisted:
            return
        progress = st.chunked.get(seq)
        if progress is None:
            progress = st.chunked[seq] = _Chunked(num_chunks)
        progress.stored.add(chunk_id)
        if len(progress.stored) >= progress.num_chunks:
            del st.chunked[seq]
            st.persisted.add((seq,))
            if seq > st.highest:
                st.highest = seq
            self._remember(producer_name, seq, -1, position)
        self._bound(producer_name, st)

    @staticmethod
    def _forget_in_flight(st: ProducerState[T], send: SendIds, token: T) -> None:
        if send.chunk is not None:
            key = (send.first, send.chunk[0])
            if st.chunks_in_flight.get(key) is token:
                del st.chunks_in_flight[key]
            return
        in_flight = st.in_flight
        for i in send.ids:
            if in_flight.get(i) is token:
                del in_flight[i]

    def _remember(self, producer_name: str, seq: int, chunk_id: int, position: Position) -> None:
        recent = self._recent
        recent[(producer_name, seq, chunk_id)] = position
        if len(recent) > self.recent_limit:
            recent.popitem(last=False)

    def _bound(self, producer_name: str, st: ProducerState[T]) -> None:
        while len(st.chunked) > MAX_PARTIAL_CHUNKED:
            seq, _ = st.chunked.popitem(last=False)
            log.warning(
                "producer %s: forgetting half-stored chunked message %d (over %d)",
                producer_name,
                seq,
                MAX_PARTIAL_CHUNKED,
            )
        if len(st.persisted) > self.max_ranges:
            while len(st.persisted) > self.max_ranges:
                st.floor = st.persisted.drop_lowest()
            log.info(
                "producer %s: over %d sequence-id ranges, ids below %d are no longer tracked "
                "(such a send is stored)",
                producer_name,
                self.max_ranges,
                st.floor,
            )

    # --- producer names coming and going ---------------------------------------------------
    def producer_added(self, producer_name: str) -> None:
        """A producer with this name connected: the name is not idle."""
        self.connected.add(producer_name)
        self.idle.pop(producer_name, None)

    def producer_removed(self, producer_name: str, now: float) -> None:
        """The name's producer left at ``now`` (seconds, any monotonic clock)."""
        self.connected.discard(producer_name)
        self.idle.pop(producer_name, None)
        self.idle[producer_name] = now

    def mark_idle(self, now: float) -> None:
        """Every known name without a connected producer is idle from ``now`` (after recovery:
        Pulsar counts a name's inactivity from when the topic loaded)."""
        for name in self.producers:
            if name not in self.connected and name not in self.idle:
                self.idle[name] = now

    def purge_inactive(
        self, now: float, timeout: float, max_producers: int | None = None
    ) -> list[str]:
        """Forget the names idle for more than ``timeout`` seconds, then, while more than
        ``max_producers`` names are known, the idle ones idle longest. Returns those forgotten."""
        gone: list[str] = []
        idle = self.idle
        for name, since in list(idle.items()):
            if now - since <= timeout:
                break
            if self._writing(name):
                continue
            del idle[name]
            self.producers.pop(name, None)
            gone.append(name)
        if max_producers is not None and len(self.producers) > max_producers:
            for name in list(idle):
                if len(self.producers) <= max_producers:
                    break
                if self._writing(name):
                    continue
                del idle[name]
                self.producers.pop(name, None)
                gone.append(name)
        return gone

    def _writing(self, producer_name: str) -> bool:
        # A name whose writes are still in flight is kept until they end: forgetting them
        # would let a resend in the meantime be stored twice.
        st = self.producers.get(producer_name)
        return st is not None and bool(st.in_flight or st.chunks_in_flight)

    # --- persistence -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """The persisted part of the state (in-flight writes are not)."""
        out: dict[str, Any] = {}
        for name, st in self.producers.items():
            entry: dict[str, Any] = {"highest": st.highest, "ranges": st.persisted.bounds}
            if st.floor is not None:
                entry["floor"] = st.floor
            if st.chunked:
                entry["chunked"] = [
                    [seq, c.num_chunks, sorted(c.stored)] for seq, c in st.chunked.items()
                ]
            out[name] = entry
        return out

    def load_json(self, producers: dict[str, Any]) -> None:
        """Restore what :meth:`to_json` wrote."""
        for name, entry in producers.items():
            st: ProducerState[T] = ProducerState()
            if isinstance(entry, int):
                # A version-1 snapshot held only Pulsar's highest id: what lies at or below it
                # is unknown, so it is stored if sent again (never dropped on a guess).
                st.highest = entry
                st.floor = entry + 1
            else:
                st.highest = int(entry["highest"])
                st.persisted = SequenceRanges(int(b) for b in entry["ranges"])
                floor = entry.get("floor")
                st.floor = int(floor) if floor is not None else None
                for seq, n, stored in entry.get("chunked", ()):
                    st.chunked[int(seq)] = _Chunked(int(n), {int(c) for c in stored})
            self.producers[name] = st
