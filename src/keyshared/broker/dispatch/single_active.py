"""Exclusive and Failover: every entry goes to the one active consumer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keyshared.broker.consumer import Consumer, SubType
from keyshared.broker.dispatch.base import Dispatcher, Scheduler, on_done
from keyshared.broker.errors import BrokerError, ServerError

if TYPE_CHECKING:
    from keyshared.broker.subscription import Subscription


class SingleActiveDispatcher(Dispatcher):
    """Pulsar's PersistentDispatcherSingleActiveConsumer.

    Exclusive admits one consumer. Failover admits many and makes one active: the first by
    priority level then name, or for partition ``i`` of a partitioned topic the ``i mod n``-th,
    so partitions spread over consumers. When the active consumer changes, the cursor is
    rewound so the new one gets everything still unacked.
    """

    def __init__(self, subscription: Subscription, scheduler: Scheduler, sub_type: SubType):
        super().__init__(subscription, scheduler)
        self.sub_type = sub_type
        self.active: Consumer | None = None
        self._partition_index = subscription.topic.name.partition_index

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer``; a second Exclusive consumer is refused."""
        if self.sub_type is SubType.Exclusive and self.consumers:
            raise BrokerError(ServerError.ConsumerBusy, "Exclusive consumer is already connected")
        self.consumers.append(consumer)
        self._pick_active(joined=consumer)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; if it was active another takes over from the first unacked."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        if not self.consumers:
            self.active = None
            self._reset_reads()
            return
        self._pick_active(joined=None)

    def _pick_active(self, *, joined: Consumer | None) -> None:
        ordered = sorted(self.consumers, key=lambda c: (c.priority_level, c.consumer_name))
        if self.sub_type is SubType.Failover and self._partition_index >= 0:
            top = [c for c in ordered if c.priority_level == ordered[0].priority_level]
            top.sort(key=lambda c: c.consumer_name)
            new_active = top[self._partition_index % len(top)]
        else:
            new_active = ordered[0]
        changed = new_active is not self.active
        self.active = new_active
        if self.sub_type is SubType.Failover:
            # Everyone learns of a change; a consumer that joins learns where it stands.
            told = self.consumers if changed else ([joined] if joined is not None else [])
            for c in told:
                c.transport.active_consumer_change(c, c is new_active)
        if changed:
            # The new active consumer must see everything not yet acked, from the start.
            self._reset_reads()
            self.read_more()

    def _reset_reads(self) -> None:
        self.forget_reads()
        self.cursor.rewind()

    def redeliver(self, consumer: Consumer, positions: Sequence[Any] | None) -> None:
        """Redeliver everything unacked (single-active subscriptions always rewind)."""
        if consumer is not self.active:
            return
        self._reset_reads()
        self.read_more()

    def reset(self) -> None:
        """The cursor was moved by hand: drop the in-flight read."""
        self.forget_reads()

    def consumer_flow(self, consumer: Consumer, permits: int) -> None:
        """Only the active consumer's permits trigger reads."""
        if consumer is self.active:
            self.read_more()

    def read_more_now(self) -> None:
        """Start a read for the active consumer if it has permits and none is in flight."""
        active = self.active
        if active is None or self.have_pending_read:
            return
        permits = active.dispatch_permits()
        if permits <= 0:
            return
        n = self.rate_budget(min(permits, self.read_batch_size))
        if n <= 0:
            return
        self.have_pending_read = True
        if active.read_compacted:
            read = self.subscription.topic.compactor.read_entries_or_wait(self.cursor, n, active)
        else:
            read = self.cursor.read_entries_or_wait(n)
        gen = self.read_generation
        on_done(read, lambda fut: self._read_complete(fut, active, n, gen))

    def _read_complete(self, fut: Any, reader_for: Consumer, asked: int, gen: int) -> None:
        # A read forgotten by a rewind or an active-consumer change is ignored here.
        result = self.read_outcome(fut, gen, replay=False)
        if result is None:
            return
        if result.stale or not result.entries:
            # Stale: the cursor moved (rewind, seek) while the read was in flight; read again.
            self.read_more()
            return
        if self.active is not reader_for or reader_for.closed:
            # The active consumer changed during the read: those entries will be read again.
            self._reset_reads()
            self.read_more()
            return
        if len(result.entries) >= asked:
            self.grow_read_batch()
        # A read of the compacted view says which batch indexes survive.
        self.send_to_consumer(
            reader_for, result.entries, ack_sets=getattr(result, "ack_sets", None)
        )
        self.read_more()
