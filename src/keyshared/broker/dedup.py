"""Message deduplication: a message is dropped only if that very message was stored before.

Pulsar's MessageDeduplication keeps one number per producer, the highest sequence id pushed,
and drops every send at or below it. That is wrong as soon as a producer's entries do not
carry rising sequence ids: key-based batching (the batching Key_Shared users are told to use)
fills one batch per key and flushes them together, so a batch holding ids 1, 17, 33 goes out
after one holding 0, 16, 32, ..., 48, and Pulsar drops it (apache/pulsar#15413).

Here each producer's *persisted sequence ids* are kept exactly, as disjoint ranges, and a send
is a duplicate only if every message it holds is among them (or is being written right now,
in which case its answer waits for that write). The sequence ids of a batch's messages are
read from the batch itself (each ``SingleMessageMetadata.sequence_id``, which the official
clients set): the SEND command's ``sequence_id`` is only the first of them and, without
``highest_sequence_id`` (the C++ client never sets it), ``sequence_id + num_messages - 1`` is
not the last one for a key-based batch. A chunked message is one sequence id stored as several
entries; each chunk is tracked until the last one is stored.

Bound: at most ``max_ranges`` ranges per producer (:data:`MAX_RANGES`). A producer whose ids
are contiguous (the client's own counter, key-based batching included once its batches have
landed) needs one range whatever it sends; each hole left behind (a send that failed for good,
explicit ids with gaps) costs one. Past the bound the oldest ranges are forgotten and the
producer's *floor* rises to the first range kept: an id below the floor is no longer known
either way and is **stored** (at worst a duplicate, logged and counted in
``duplicates_maybe_stored``), never dropped, because a message that may be new must not be
lost. Refusing it instead would not help: the client answers a send error by reconnecting and
resending the same message, forever. Likewise at most :data:`MAX_PARTIAL_CHUNKED` chunked
messages per producer are tracked half-stored; past that the oldest is forgotten and its
chunks are stored again if resent. A batch some of whose messages were stored and some not
(a client that re-batched resent messages) is stored whole: its new messages must not be lost.
An encrypted batch's body cannot be read: only the ids its metadata names (the first, and the
highest if sent) are tracked, so a resend of that batch is a duplicate but a lone resend of one
of its other messages would be stored.

Producer names expire as in Pulsar: a name with no producer connected for
``brokerDeduplicationProducerInactivityTimeoutMinutes`` (default 360) is forgotten, checked every
third of that time (Pulsar's schedule) and followed by a snapshot so that a restart does not bring
it back; names loaded by recovery count as idle from then on. A producer that comes back under a
forgotten name starts afresh (``last_sequence_id`` -1) and its resends are stored again.
``brokerDeduplicationMaxNumberOfProducers`` (default 10000) bounds the names kept per topic:
Pulsar applies it to the snapshot only (the names past it, in hash-map order, are lost on
restart); here it bounds the state itself, at each check and when a producer leaves, by
forgetting the names idle longest first, and never the name of a connected producer. The ranges
per producer (:data:`MAX_RANGES`) stay a constant: Pulsar keeps one number per producer and so
has no setting this could borrow the name of.

A duplicate is answered with the original's message id while the original is among the last
:data:`RECENT_LIMIT` entries recorded for the topic; older ones get ``-1:-1`` as in Pulsar.

:class:`DedupState` (:mod:`keyshared.broker.dedup_state`) is the decision logic, synchronous and
free of I/O so that tests and a simulator can drive it; :class:`Deduplication` adds the topic's ledger and metadata store:
a snapshot of the state is written to the metadata store (SQLite, key ``dedup/<topic>``) every
:data:`SNAPSHOT_INTERVAL` entries and on close, naming the last entry it covers; recovery
loads it and replays the entries after it, reading each one's per-message sequence ids. The
snapshot only ever covers entries already durable, so after a crash or a power loss the state
is rebuilt from synced data alone: an older snapshot just means a longer replay.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keyshared.broker.dedup_state import (
    DUPLICATE,
    MAX_PARTIAL_CHUNKED,
    MAX_RANGES,
    NEW,
    RECENT_LIMIT,
    WAIT,
    Decision,
    DedupState,
    ProducerState,
)
from keyshared.broker.sequence_ids import SendIds, ids_of, send_ids
from keyshared.protocol import split_payload
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.storage.ledger import ManagedLedger
    from keyshared.storage.metadata import MetadataStore

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL = 1000
"""Entries recorded between two snapshots (Pulsar's ``brokerDeduplicationEntriesInterval``)."""
_SCAN_BATCH = 500
_SNAPSHOT_VERSION = 2

PublishDone = Callable[[Position | None, BaseException | None], None]
"""Called once a send is answered: its position, or the error that failed it."""
Append = Callable[[bytes], tuple[Position, "asyncio.Future[None]"]]
"""Hands an entry to storage: where it goes and a future that ends when it is durable."""

__all__ = [
    "DUPLICATE",
    "MAX_PARTIAL_CHUNKED",
    "MAX_RANGES",
    "NEW",
    "RECENT_LIMIT",
    "WAIT",
    "Decision",
    "DedupState",
    "Deduplication",
    "ProducerState",
]


# --- the topic's deduplication: state + ledger + metadata store -------------------------


class Deduplication:
    """A topic's deduplication: :class:`DedupState` kept with the topic's data."""

    def __init__(
        self,
        topic_name: str,
        ledger: ManagedLedger,
        metadata: MetadataStore,
        max_ranges: int = MAX_RANGES,
        *,
        inactivity_timeout: float = 360 * 60.0,
        max_producers: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.key = f"dedup/{topic_name}"
        self.ledger = ledger
        self.metadata = metadata
        self.state: DedupState[Any] = DedupState(max_ranges)
        self.inactivity_timeout = inactivity_timeout
        self.max_producers = max_producers
        self.clock = clock
        self._since_snapshot = 0
        # Every entry up to here is recorded: what a snapshot covers.
        self._covered: Position | None = None
        # Writes handed to storage, in position order: None while in flight, then whether it
        # was stored (True) or failed (False).
        self._outstanding: OrderedDict[Position, bool | None] = OrderedDict()

    # --- recovery --------------------------------------------------------------------------
    async def recover(self) -> None:
        """Load the snapshot and replay the entries written after it."""
        snap: Any = self.metadata.get_json(self.key)
        start: Position | None = None
        lac = self.ledger.last_add_confirmed
        if snap:
            pos = snap.get("position")
            covered = Position(int(pos[0]), int(pos[1])) if pos is not None else None
            if covered is not None and covered > lac:
                # The log lost entries the snapshot covers (unsynced writes): rebuild from the
                # log alone rather than trust ids it no longer holds.
                log.warning(
                    "%s: deduplication snapshot is ahead of the log, replaying it", self.key
                )
            else:
                self.state.load_json(snap.get("producers", {}))
                if covered is not None:
                    self._covered = covered
                    start = self.ledger.next_position(covered)
        if start is None:
            start = self.ledger.first_position
        replayed = 0
        while start is not None and start <= lac:
            entries = await self.ledger.read_entries(start, _SCAN_BATCH)
            if not entries:
                break
            for e in entries:
                self._covered = e.position
                try:
                    md, payload = split_payload(e.data)
                    ids = ids_of(md, payload)
                except Exception:  # a stored entry always parsed once; skip if not
                    continue
                self.state.persisted(md.producer_name, ids, e.position)
                replayed += 1
            start = self.ledger.next_position(entries[-1].position)
        if replayed:
            log.info("%s: replayed %d entries for deduplication", self.key, replayed)
        self.state.mark_idle(self.clock())

    # --- producer names ----------------------------------------------------------------------
    def producer_added(self, producer_name: str) -> None:
        """A producer with this name connected to the topic."""
        self.state.producer_added(producer_name)

    def producer_removed(self, producer_name: str) -> None:
        """The producer with this name left the topic."""
        self.state.producer_removed(producer_name, self.clock())
        if len(self.state.producers) > self.max_producers:
            self.purge_inactive()

    def purge_inactive(self) -> list[str]:
        """Forget the names idle past ``brokerDeduplicationProducerInactivityTimeoutMinutes``
        (and the idle ones past ``brokerDeduplicationMaxNumberOfProducers``); a snapshot follows
        so that a restart does not bring them back."""
        gone = self.state.purge_inactive(self.clock(), self.inactivity_timeout, self.max_producers)
        if gone:
            log.info(
                "%s: purging deduplication information of %d inactive producers (%s)",
                self.key,
                len(gone),
                ", ".join(gone[:10]) + (", ..." if len(gone) > 10 else ""),
            )
            self.snapshot()
        return gone

    # --- the publish path ------------------------------------------------------------------
    def publish(
        self, producer_name: str, data: bytes, append: Append, on_done: PublishDone
    ) -> Position | None:
        """Store the entry ``data`` with ``append`` unless it is a duplicate; ``on_done`` gets
        its position once durable, the original's for a duplicate (``-1:-1`` once forgotten),
        or the error. Returns the position it was handed to storage at (None: not stored).
        """
        send = send_ids(data)
        decision = self.check(producer_name, send)
        if decision.kind != NEW:
            self._answer_duplicate(producer_name, send, decision, on_done)
            return None
        position, fut = append(data)
        self.pushed_send(producer_name, send, position, fut)

        def done(f: asyncio.Future[None]) -> None:
            exc = f.exception() if not f.cancelled() else asyncio.CancelledError()
            if exc is None:
                self.persisted_send(producer_name, send, position, f)
                on_done(position, None)
            else:
                self.failed_send(producer_name, send, position, f)
                on_done(None, exc)

        fut.add_done_callback(done)
        return position

    def _answer_duplicate(
        self, name: str, send: SendIds, decision: Decision[Any], on_done: PublishDone
    ) -> None:
        """Confirm a resent message with the original's id, never storing it again; one whose
        original is still being written waits for that write."""
        if decision.kind == DUPLICATE:
            on_done(decision.position or Position(-1, -1), None)
            return
        waits: list[asyncio.Future[None]] = list(decision.waits)
        answered = False

        def done(_: asyncio.Future[None]) -> None:
            nonlocal answered
            if answered or not all(w.done() for w in waits):
                return
            answered = True
            for w in waits:
                exc = w.exception() if not w.cancelled() else asyncio.CancelledError()
                if exc is not None:
                    # The original was not stored: the producer resends, and that is new.
                    on_done(None, exc)
                    return
            on_done(self.state.original(name, send) or Position(-1, -1), None)

        for w in waits:
            w.add_done_callback(done)

    # --- the check -------------------------------------------------------------------------
    def last_sequence_id(self, producer_name: str) -> int:
        """Highest persisted sequence id of ``producer_name`` (-1 if none)."""
        return self.state.last_sequence_id(producer_name)

    def check(self, producer_name: str, send: SendIds) -> Decision[Any]:
        """Classify a send before it is stored."""
        return self.state.check(producer_name, send)

    def pushed_send(
        self, producer_name: str, send: SendIds, position: Position, token: Any
    ) -> None:
        """A new send was handed to storage at ``position``."""
        self.state.pushed(producer_name, send, token)
        self._outstanding[position] = None

    def persisted_send(
        self, producer_name: str, send: SendIds, position: Position, token: Any
    ) -> None:
        """A send became durable."""
        self.state.persisted(producer_name, send, position, token)
        self._ended(position, True)
        self._since_snapshot += 1
        if self._since_snapshot >= SNAPSHOT_INTERVAL:
            self.snapshot()

    def failed_send(
        self, producer_name: str, send: SendIds, position: Position, token: Any
    ) -> None:
        """A send failed: the producer will resend it, which must not count as a duplicate."""
        self.state.failed(producer_name, send, token)
        self._ended(position, False)

    def _ended(self, position: Position, stored: bool) -> None:
        out = self._outstanding
        if position in out:
            out[position] = stored
        # Cover only a prefix of ended writes: a snapshot must not claim an entry whose
        # completion has not been recorded yet. Nor a failed write's position: it is not in
        # the log, and one past the log's end would make recovery distrust the snapshot.
        while out:
            first, ended = next(iter(out.items()))
            if ended is None:
                break
            del out[first]
            if ended:
                self._covered = first

    def snapshot(self) -> None:
        """Write the persisted state and the last entry it covers."""
        self._since_snapshot = 0
        pos = self._covered
        if pos is None:
            return
        self.metadata.put_json(
            self.key,
            {
                "version": _SNAPSHOT_VERSION,
                "producers": self.state.to_json(),
                "position": [pos.ledger_id, pos.entry_id],
            },
        )

    def delete(self) -> None:
        """Forget the topic's state (topic deleted)."""
        self.metadata.delete(self.key)
