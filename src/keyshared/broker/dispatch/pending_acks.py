"""Per-consumer pending acks: the entries sent to a consumer and not yet acked by it.

Pulsar's ``PendingAcksMap``: position -> (batch size, sticky key hash), iterated in position order,
with an *add handler* that may refuse an entry (the dispatcher re-queues it) and a *remove handler*
told about every removal (the draining-hash tracker lowers its ref counts). Closing the map (the
consumer left) hands every pending entry back and refuses new ones.

Layout, for the hot path (one add per dispatched entry, one remove per ack): a plain dict keyed by
the position object the caller already has, whose value packs ``batch_size << 32 | sticky_hash``
into one int. Entries normally arrive in position order, so the dict's insertion order *is*
position order; an out-of-order add (a replayed entry) marks the map unsorted and the next ordered
walk sorts it once. There is no per-hash index: "which positions hold hash h" is a scan of one
consumer's pending entries, which is rare (an admin query) and cheaper than an index maintained
on every add and ack (see ``bench/bench_selectors.py`` for bytes per entry).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from keyshared.broker.dispatch.selectors.base import C

P = TypeVar("P", bound=tuple[int, int])
"""A position ``(ledger_id, entry_id)``; ``keyshared.storage.position.Position`` in the broker."""

C_contra = TypeVar("C_contra", contravariant=True)

_HASH_MASK = 0xFFFFFFFF


class PendingAck(NamedTuple, Generic[P]):
    """One pending entry: where it is, how many messages it carries, its sticky key hash."""

    position: P
    batch_size: int
    sticky_hash: int


class PendingAcksAddHandler(Protocol[C_contra]):
    """Decides whether an entry may become pending for a consumer (False: the caller re-queues)."""

    def __call__(self, consumer: C_contra, position: Any, sticky_hash: int, /) -> bool: ...


class PendingAcksRemoveHandler(Protocol[C_contra]):
    """Told about every removal; batches bracket bulk removals (``DrainingHashesTracker`` fits)."""

    def handle_removing(
        self, consumer: C_contra, position: Any, sticky_hash: int, closing: bool
    ) -> None:
        """A pending entry went away (``closing``: because the consumer is leaving)."""
        ...

    def start_batch(self) -> None:
        """Many removals follow."""
        ...

    def end_batch(self) -> None:
        """The removals announced by ``start_batch`` are done."""
        ...


class PendingAcksMap(Generic[C, P]):
    """The pending entries of one consumer, with Pulsar's add/remove handler hooks."""

    __slots__ = (
        "_acks",
        "_closed",
        "_last",
        "_ordered",
        "add_handler",
        "consumer",
        "remove_handler",
    )

    def __init__(
        self,
        consumer: C,
        add_handler: PendingAcksAddHandler[C] | None = None,
        remove_handler: PendingAcksRemoveHandler[C] | None = None,
    ) -> None:
        self.consumer = consumer
        self.add_handler = add_handler
        self.remove_handler = remove_handler
        self._acks: dict[P, int] = {}
        self._last: P | None = None
        self._ordered = True
        self._closed = False

    # --- adding -----------------------------------------------------------------------------
    def add_pending_ack_if_allowed(self, position: P, batch_size: int, sticky_hash: int) -> bool:
        """Record ``position`` as pending unless the map is closed or the add handler refuses.

        Re-adding a pending position overwrites its batch size and hash (as Pulsar's map does).
        """
        if self._closed:
            return False
        handler = self.add_handler
        if handler is not None and not handler(self.consumer, position, sticky_hash):
            return False
        acks = self._acks
        last = self._last
        if last is None or position > last:
            self._last = position
        elif position not in acks:
            self._ordered = False
        acks[position] = batch_size << 32 | sticky_hash
        return True

    # --- removing ---------------------------------------------------------------------------
    def remove(self, position: P) -> bool:
        """Drop ``position`` (acked or redelivered); False if it was not pending."""
        packed = self._acks.pop(position, None)
        if packed is None:
            return False
        if not self._acks:
            self._reset_order()
        handler = self.remove_handler
        if handler is not None:
            handler.handle_removing(self.consumer, position, packed & _HASH_MASK, False)
        return True

    def remove_all_up_to(self, position: P) -> int:
        """Drop every pending position ``<= position`` (mark-delete jumped); returns how many."""
        if not self._acks:
            return 0
        self._sort()
        acks = self._acks
        if self._last is not None and self._last <= position:
            removed = list(acks.items())
            acks.clear()
        else:
            removed = []
            for pos, packed in acks.items():
                if pos > position:
                    break
                removed.append((pos, packed))
            for pos, _ in removed:
                del acks[pos]
        if not acks:
            self._reset_order()
        handler = self.remove_handler
        if handler is not None and removed:
            handler.start_batch()
            try:
                for pos, packed in removed:
                    handler.handle_removing(self.consumer, pos, packed & _HASH_MASK, False)
            finally:
                handler.end_batch()
        return len(removed)

    def for_each_and_close(
        self, callback: Callable[[PendingAck[P]], None] | None = None
    ) -> list[PendingAck[P]]:
        """The consumer is leaving: refuse new entries, hand back every pending one in order.

        For each entry, in position order: ``callback(ack)`` (the dispatcher re-queues it), then
        the remove handler with ``closing=True``. Returns the entries handed back.
        """
        self._closed = True
        acks = self.sorted_acks()
        self._acks = {}
        self._reset_order()
        handler = self.remove_handler
        if handler is not None:
            handler.start_batch()
        try:
            for ack in acks:
                if callback is not None:
                    callback(ack)
                if handler is not None:
                    handler.handle_removing(self.consumer, ack.position, ack.sticky_hash, True)
        finally:
            if handler is not None:
                handler.end_batch()
        return acks

    # --- queries ----------------------------------------------------------------------------
    def get(self, position: P) -> tuple[int, int] | None:
        """``(batch_size, sticky_hash)`` of a pending position, else ``None``."""
        packed = self._acks.get(position)
        if packed is None:
            return None
        return (packed >> 32, packed & _HASH_MASK)

    def __contains__(self, position: object) -> bool:
        return position in self._acks

    def __len__(self) -> int:
        return len(self._acks)

    def __iter__(self) -> Iterator[PendingAck[P]]:
        """Pending entries in position order (do not mutate the map while iterating)."""
        self._sort()
        for position, packed in self._acks.items():
            yield PendingAck(position, packed >> 32, packed & _HASH_MASK)

    def sorted_acks(self) -> list[PendingAck[P]]:
        """A list of the pending entries in position order."""
        return list(self)

    def positions(self) -> list[P]:
        """The pending positions in order."""
        self._sort()
        return list(self._acks)

    def sticky_hashes(self) -> Iterator[int]:
        """The sticky hash of every pending entry (one per entry, unordered, no sorting cost)."""
        for packed in self._acks.values():
            yield packed & _HASH_MASK

    def positions_for_sticky_hash(self, sticky_hash: int, limit: int | None = None) -> list[P]:
        """Pending positions carrying ``sticky_hash``, in order, at most ``limit`` of them.

        This answers "what blocks this hash": pass the draining entry's unacked count as
        ``limit`` and the scan stops as soon as it has found them all.
        """
        self._sort()
        found: list[P] = []
        if limit is not None and limit <= 0:
            return found
        for position, packed in self._acks.items():
            if packed & _HASH_MASK == sticky_hash:
                found.append(position)
                if limit is not None and len(found) >= limit:
                    break
        return found

    def unacked_messages(self) -> int:
        """Sum of batch sizes of the pending entries."""
        return sum(packed >> 32 for packed in self._acks.values())

    @property
    def closed(self) -> bool:
        """Whether the consumer left (no new entries are accepted)."""
        return self._closed

    # --- internals --------------------------------------------------------------------------
    def _sort(self) -> None:
        if not self._ordered:
            self._acks = dict(sorted(self._acks.items()))
            self._ordered = True

    def _reset_order(self) -> None:
        self._last = None
        self._ordered = True
