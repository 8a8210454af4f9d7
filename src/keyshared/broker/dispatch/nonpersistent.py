"""Dispatch on non-persistent topics: a message goes out when it is published, or it is dropped.

There is no cursor, no replay and no pending-ack bookkeeping: each published entry is offered
once to each subscription's dispatcher, which picks a consumer that has permits (and a writable
connection) and sends it, or drops it and counts the messages in ``msgDropRate``. The rules are
Pulsar's ``..svc/nonpersistent`` dispatchers:

=====================  =======================================================================
Exclusive / Failover   the active consumer (priority level, then name; for partition ``i`` the
                       ``i mod n``-th), if it has permits (NonPersistentDispatcherSingleActive…)
Shared                 the next consumer round robin among those with permits, highest priority
                       level first (NonPersistentDispatcherMultipleConsumers + getNextConsumer)
Key_Shared             the consumer the subscription's selector picks for the sticky key hash,
                       if it has permits; no draining, no look-ahead, no replay
                       (NonPersistentStickyKeyDispatcherMultipleConsumers)
=====================  =======================================================================

The decision (:meth:`NonPersistentDispatcher.select`) is plain synchronous code that reads only
the consumers' permits; :meth:`NonPersistentDispatcher.dispatch` then writes to the consumer.

One deliberate difference: Pulsar's Key_Shared dispatcher releases an entry without counting it
when the subscription has no consumer or a STICKY gap leaves the hash without one, while the
other dispatchers count such entries as dropped. Here every message a subscription does not
deliver counts as dropped, whatever the subscription type.
"""

from __future__ import annotations

from typing import Any

from keyshared.broker.consumer import Consumer, OutboundMessage, SubType
from keyshared.broker.dispatch.selectors import (
    ConsumerAssignError,
    StickyKeyConsumerSelector,
    selector_for,
)
from keyshared.broker.entry_meta import EntryMeta
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.rates import RateMeter
from keyshared.config import BrokerConfig
from keyshared.protocol.hashing import slot_of_hash
from keyshared.storage.entry import Entry


def has_room(consumer: Consumer) -> bool:
    """Pulsar's ``getAvailablePermits() > 0 && isWritable()`` for a live consumer."""
    return consumer.dispatch_permits() > 0


def pick_active(consumers: list[Consumer], partition_index: int) -> Consumer | None:
    """The active consumer of an Exclusive/Failover subscription.

    Sorted by priority level then name; among the consumers of the best level, partition ``i``
    of a partitioned topic takes the ``i mod n``-th, so partitions spread over consumers (a
    non-partitioned topic counts as partition 0, as Pulsar's NonPersistentSubscription does).
    """
    if not consumers:
        return None
    ordered = sorted(consumers, key=lambda c: (c.priority_level, c.consumer_name))
    top = [c for c in ordered if c.priority_level == ordered[0].priority_level]
    return top[max(partition_index, 0) % len(top)]


class NonPersistentDispatcher:
    """Base: the consumer list, the drop counter, and sending one entry to one consumer."""

    sub_type: SubType = SubType.Shared

    def __init__(self) -> None:
        self.consumers: list[Consumer] = []
        self.closed = False
        self.msg_drop_counter = 0
        self.drop_rates = RateMeter(1)
        # Never read ahead: these exist so the connection can treat every dispatcher alike.
        self.have_pending_read = False
        self.have_pending_replay_read = False

    # --- consumers -----------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer`` (may raise BrokerError)."""
        self.consumers.append(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def fits(self, consumer: Consumer) -> bool:
        """Whether a dispatcher with no consumers can be kept for ``consumer``."""
        return consumer.sub_type is self.sub_type

    # --- what the connection calls, all no-ops: permits are used when a message arrives ----
    def consumer_flow(self, consumer: Consumer, permits: int) -> None:
        """FLOW: nothing is waiting to be read."""

    def on_writable(self) -> None:
        """The connection drained: the next published message will see it."""

    def read_more(self) -> None:
        """Nothing to read."""

    # --- the decision and the send ---------------------------------------------------------------
    def select(self, meta: EntryMeta) -> Consumer | None:
        """The consumer that gets an entry with ``meta`` now, or None to drop it."""
        raise NotImplementedError

    def dispatch(self, entry: Entry, meta: EntryMeta) -> Consumer | None:
        """Send ``entry`` to the selected consumer, or count its messages as dropped."""
        consumer = None if self.closed else self.select(meta)
        if consumer is None:
            self.msg_drop_counter += meta.num_messages
            return None
        consumer.record_sent(1, meta.num_messages, 0, len(entry.data))
        consumer.transport.send_messages(consumer, [OutboundMessage(entry, 0, None)])
        return consumer

    def close(self) -> None:
        """Stop dispatching."""
        self.closed = True

    # --- stats -------------------------------------------------------------------------------
    def msg_drop_rate(self) -> float:
        """Messages dropped per second (Pulsar's ``msgDropRate``)."""
        (rate,) = self.drop_rates.rates(self.msg_drop_counter)
        return rate

    def stats(self) -> dict[str, Any]:
        """Dispatcher-specific subscription stats."""
        return {}

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        """Dispatcher-specific consumer stats."""
        return {}


class SingleActiveDispatcher(NonPersistentDispatcher):
    """Exclusive and Failover: only the active consumer receives."""

    def __init__(self, sub_type: SubType, partition_index: int) -> None:
        super().__init__()
        self.sub_type = sub_type
        self.partition_index = partition_index
        self.active: Consumer | None = None

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer``; a second Exclusive consumer is refused."""
        if self.sub_type is SubType.Exclusive and self.consumers:
            raise BrokerError(ServerError.ConsumerBusy, "Exclusive consumer is already connected")
        super().add_consumer(consumer)
        self._pick_active(joined=consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; another one may become active."""
        super().remove_consumer(consumer)
        self._pick_active(joined=None)

    def _pick_active(self, *, joined: Consumer | None) -> None:
        new_active = pick_active(self.consumers, self.partition_index)
        changed = new_active is not self.active
        self.active = new_active
        if self.sub_type is SubType.Failover and new_active is not None:
            told = self.consumers if changed else ([joined] if joined is not None else [])
            for c in told:
                c.transport.active_consumer_change(c, c is new_active)

    def select(self, meta: EntryMeta) -> Consumer | None:
        """The active consumer if it has room."""
        active = self.active
        return active if active is not None and has_room(active) else None


class SharedDispatcher(NonPersistentDispatcher):
    """Shared: round robin over the consumers that have permits, best priority level first."""

    sub_type = SubType.Shared

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

    def select(self, meta: EntryMeta) -> Consumer | None:
        """The next consumer with room, at the best priority level among those with room."""
        consumers = self.consumers
        ready = [c for c in consumers if has_room(c)]
        if not ready:
            return None
        level = min(c.priority_level for c in ready)
        n = len(consumers)
        for k in range(n):
            i = (self._next + k) % n
            c = consumers[i]
            if c.priority_level == level and has_room(c):
                self._next = (i + 1) % n
                return c
        return None  # pragma: no cover - ``ready`` holds one


class KeySharedDispatcher(NonPersistentDispatcher):
    """Key_Shared: the selector's consumer for the entry's sticky key hash, if it has room."""

    sub_type = SubType.Key_Shared

    def __init__(self, mode: str, config: BrokerConfig) -> None:
        super().__init__()
        self.mode = mode
        self.selector: StickyKeyConsumerSelector[Consumer] = selector_for(mode, config)
        self._range = self.selector.key_hash_range

    def fits(self, consumer: Consumer) -> bool:
        """Same type and Key_Shared mode (Pulsar's ``hasSameKeySharedPolicy`` compares the mode
        only: without ordering machinery, allowOutOfOrderDelivery changes nothing here)."""
        return consumer.sub_type is SubType.Key_Shared and _mode_of(consumer) == self.mode

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer`` and give it hashes (STICKY: the ranges it asked for)."""
        if self.consumers and _mode_of(consumer) != self.mode:
            raise BrokerError(
                ServerError.ConsumerBusy,
                f"Subscription is of key_shared mode {self.mode}, cannot attach a "
                f"{_mode_of(consumer)} consumer",
            )
        ranges = consumer.key_shared_meta.ranges if consumer.key_shared_meta else []
        try:
            self.selector.add_consumer(consumer, ranges or None)
        except ConsumerAssignError as exc:
            raise BrokerError(ServerError.ConsumerAssignError, str(exc)) from exc
        super().add_consumer(consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; its hashes go to the others at once (nothing to drain)."""
        self.selector.remove_consumer(consumer)
        super().remove_consumer(consumer)

    def slot_of(self, meta: EntryMeta) -> int:
        """The selector's sticky key hash of an entry."""
        start, end = self._range
        return slot_of_hash(meta.key_hash, start, end)

    def select(self, meta: EntryMeta) -> Consumer | None:
        """The owner of the entry's hash, if it has room; otherwise the entry is dropped."""
        consumer = self.selector.select(self.slot_of(meta))
        return consumer if consumer is not None and has_room(consumer) else None

    def stats(self) -> dict[str, Any]:
        """``keySharedMode`` as Pulsar's subscription stats show it."""
        return {"keySharedMode": self.mode}

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        """The consumer's hash ranges."""
        ranges = self.selector.get_consumer_key_hash_ranges().get(consumer, [])
        return {
            "keyHashRangeArrays": [[s, e] for s, e in ranges],
            "keyHashRanges": [f"[{s}, {e}]" for s, e in ranges],
        }


def _mode_of(consumer: Consumer) -> str:
    meta = consumer.key_shared_meta
    return meta.mode if meta else "AUTO_SPLIT"


def new_dispatcher(
    sub_type: SubType, consumer: Consumer, *, partition_index: int, config: BrokerConfig
) -> NonPersistentDispatcher:
    """The dispatcher for a subscription whose first consumer is ``consumer``."""
    if sub_type in (SubType.Exclusive, SubType.Failover):
        return SingleActiveDispatcher(sub_type, partition_index)
    if sub_type is SubType.Shared:
        return SharedDispatcher()
    return KeySharedDispatcher(_mode_of(consumer), config)
