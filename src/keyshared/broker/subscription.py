"""A subscription: a cursor, its consumers, and the dispatcher that feeds them."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from keyshared.broker.consumer import Consumer, PendingAck, SubType
from keyshared.broker.dispatch.base import Dispatcher, Scheduler
from keyshared.broker.dispatch.shared import SharedDispatcher
from keyshared.broker.dispatch.single_active import SingleActiveDispatcher
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.topic_common import consumer_stats, disconnect_all, drop_if_unused
from keyshared.config import BrokerConfig
from keyshared.storage.cursor import ManagedCursor
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.throttle import DispatchThrottle
    from keyshared.broker.topic import PersistentTopic

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AckItem:
    """One id of an ACK command: a position and, for a partial batch ack, the unacked bits."""

    position: Position
    ack_set: list[int] | None = None


class Subscription:
    """Pulsar's PersistentSubscription."""

    def __init__(
        self,
        topic: PersistentTopic,
        name: str,
        cursor: ManagedCursor,
        *,
        durable: bool,
        config: BrokerConfig,
        scheduler: Scheduler,
    ) -> None:
        self.topic = topic
        self.name = name
        self.cursor = cursor
        self.durable = durable
        self.config = config
        self.scheduler = scheduler
        self.sub_type: SubType | None = None
        self.dispatcher: Dispatcher | None = None
        self.redelivery_counts: dict[Position, int] = {}
        self.last_mark_delete_advanced = 0
        self.blocked_on_ack_state = False
        self.last_expire_timestamp = 0
        self.last_consumed_timestamp = 0
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.closed = False
        # The dispatch rate limits it obeys (broker/throttle.py); None: unlimited.
        self.dispatch_throttle: DispatchThrottle | None = None
        # True while a seek / reset-cursor closes the consumers: a reader's cursor then
        # outlives its last consumer, for the client's re-subscribe (Pulsar's isResetCursor).
        self._resetting = False
        # Replicated subscription (broker/replication/subscriptions.py): its mark-delete
        # position follows to the other clusters.
        self.replicated = False

    @property
    def consumers(self) -> list[Consumer]:
        """The attached consumers."""
        return self.dispatcher.consumers if self.dispatcher is not None else []

    # --- consumers -----------------------------------------------------------------------
    def _new_dispatcher(self, sub_type: SubType, consumer: Consumer) -> Dispatcher:
        if sub_type in (SubType.Exclusive, SubType.Failover):
            return SingleActiveDispatcher(self, self.scheduler, sub_type)
        if sub_type is SubType.Shared:
            return SharedDispatcher(self, self.scheduler)
        from keyshared.broker.dispatch.key_shared import new_key_shared_dispatcher

        return new_key_shared_dispatcher(self, self.scheduler, consumer)

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer`` (raises BrokerError when refused)."""
        if self.closed:
            raise BrokerError(ServerError.ServiceNotReady, "Subscription is being closed")
        if self.dispatcher is not None and self.dispatcher.consumers:
            held = self.sub_type
            if consumer.sub_type is not held:
                # Not ``if held``: Exclusive is 0 and read as false.
                held_name = held.name if held is not None else "None"
                raise BrokerError(
                    ServerError.ConsumerBusy,
                    f"Subscription {self.name} is of type {held_name}"
                    f", cannot attach a {consumer.sub_type.name} consumer",
                )
        elif self.dispatcher is None or not self._dispatcher_fits(consumer):
            if self.dispatcher is not None:
                self.dispatcher.close()
            self.sub_type = consumer.sub_type
            self.dispatcher = self._new_dispatcher(consumer.sub_type, consumer)
        if consumer.pending_acks is not None:
            consumer.max_unacked_messages = self.consumer_unacked_limit()
        self.dispatcher.add_consumer(consumer)

    def _dispatcher_fits(self, consumer: Consumer) -> bool:
        """A dispatcher with no consumers is kept only for the same type and Key_Shared mode."""
        if self.sub_type is not consumer.sub_type or self.dispatcher is None:
            return False
        fits = getattr(self.dispatcher, "fits", None)
        return bool(fits(consumer)) if callable(fits) else True

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; non-durable subscriptions go away with their last consumer."""
        consumer.closed = True
        if self.dispatcher is not None:
            self.dispatcher.remove_consumer(consumer)
        if self._resetting and not self.durable and not self.consumers:
            self.topic.park_reset_cursor(self)
        else:
            drop_if_unused(self.topic, self)

    # --- unacked limits --------------------------------------------------------------------
    def consumer_unacked_limit(self) -> int:
        """``maxUnackedMessagesPerConsumer`` in force (topic > namespace > broker.conf); none
        on a non-durable subscription, as in Pulsar."""
        if not self.durable:
            return 0
        return int(self.topic.policy("maxUnackedMessagesPerConsumer") or 0)

    def apply_unacked_limits(self) -> None:
        """A policy changed: the consumers that count unacked messages take the new limit
        (a consumer it unblocks gets the permits it sent while blocked), then dispatch looks
        again (the subscription's own limit is read there)."""
        limit = self.consumer_unacked_limit()
        for c in self.consumers:
            if c.pending_acks is not None and c.max_unacked_messages != limit:
                c.set_max_unacked(limit)
        self.kick_dispatch()

    def disconnect_all(self) -> None:
        """Close every consumer (they re-subscribe), as Pulsar does on seek and reset-cursor."""
        disconnect_all(self)

    # --- acks ----------------------------------------------------------------------------
    def acknowledge(self, consumer: Consumer, cumulative: bool, items: Sequence[AckItem]) -> None:
        """Apply an ACK command from ``consumer``."""
        cursor = self.cursor
        before = cursor.mark_delete_position
        if cumulative:
            if self.sub_type in (SubType.Shared, SubType.Key_Shared):
                # Pulsar ignores cumulative acks on these types (the client refuses them too).
                log.warning(
                    "cumulative ack ignored on %s subscription %s", self.sub_type, self.name
                )
                return
            for item in items:
                pos = item.position
                if pos > cursor.last_add_confirmed:
                    continue
                cursor.ack_cumulative(pos)
            acked = 0
            consumer.msg_ack_counter += len(items)
        else:
            acked = self._ack_individually(consumer, items)
        after = cursor.mark_delete_position
        if after != before:
            self._mark_delete_moved(after)
        if acked or after != before:
            self.kick_dispatch()

    def kick_dispatch(self) -> None:
        """Let the dispatcher look again, honouring a PIP-299 pause that just began."""
        disp = self.dispatcher
        if disp is None:
            return
        if disp.have_pending_read and self.should_pause_on_ack_state():
            # A normal read parked at the tail would deliver new entries despite the pause;
            # drop it (the cursor's epoch makes that safe) and let only replays run. A read
            # that already completed is not dropped: the cursor moved past its entries.
            disp.cancel_parked_read()
        disp.read_more()

    def _ack_individually(self, consumer: Consumer, items: Sequence[AckItem]) -> int:
        """Apply the ids of an individual ACK; returns the messages it released.

        Whole-entry acks go to the cursor together, so its range set and mark-delete advance
        are worked once per command rather than once per id (a consumer of a Key_Shared
        subscription acks out of position order: each id alone meant a range-set insert and a
        mark-delete check); the owners' unacked counts are settled once per command too.
        A batch-index ack reads the cursor's state, so the whole-entry acks before it are
        applied first: the result is the same as applying the ids one by one, in order.
        """
        cursor = self.cursor
        counts = self.redelivery_counts
        removed_hook = getattr(self.dispatcher, "on_pending_ack_removed", None)
        plain: list[Position] = []
        released: dict[Consumer, int] = {}
        acked = 0
        for item in items:
            if item.ack_set is not None:
                if plain:
                    cursor.ack_individual(plain)
                    plain = []
                acked += self._ack_one(consumer, item)
                continue
            pos = item.position
            plain.append(pos)
            counts.pop(pos, None)
            owner, pa = self._owner_of(consumer, pos)
            if pa is None or owner is None or owner.pending_acks is None:
                acked += 1
                continue
            del owner.pending_acks[pos]
            if removed_hook is not None:
                removed_hook(owner, pos, pa.key_hash)
            remaining = pa.batch_size - pa.acked_indexes
            released[owner] = released.get(owner, 0) + remaining
            acked += remaining
        if plain:
            cursor.ack_individual(plain)
        for owner, messages in released.items():
            if owner.record_acked(messages) and self.dispatcher is not None:
                self.dispatcher.read_more()
        return acked

    def _ack_one(self, consumer: Consumer, item: AckItem) -> int:
        pos = item.position
        cursor = self.cursor
        owner, pending = self._owner_of(consumer, pos)
        if item.ack_set is not None and pending is not None and pending.batch_size > 1:
            # What this ack released is what the cursor no longer has unacked: the client's ack
            # set may list every index it acked so far, or only the new ones.
            before = self._unacked_indexes(pos, pending.batch_size)
            cursor.ack_batch_index(pos, item.ack_set, pending.batch_size)
            if not cursor.is_acked(pos):
                newly = max(0, before - self._unacked_indexes(pos, pending.batch_size))
                pending.acked_indexes += newly
                if owner is not None and newly:
                    released = owner.record_acked(newly)
                    if released and self.dispatcher is not None:
                        self.dispatcher.read_more()
                return newly
        elif item.ack_set is not None:
            size = self.topic.known_batch_size(pos) or _batch_size_hint(item.ack_set)
            cursor.ack_batch_index(pos, item.ack_set, size)
            if not cursor.is_acked(pos):
                return 0
        else:
            cursor.ack_individual((pos,))
        self.redelivery_counts.pop(pos, None)
        if owner is not None and owner.pending_acks is not None:
            pa = owner.pending_acks.pop(pos, None)
            if pa is not None:
                self.on_pending_ack_removed(owner, pos, pa.key_hash)
                remaining = pa.batch_size - pa.acked_indexes
                released = owner.record_acked(remaining)
                if released and self.dispatcher is not None:
                    self.dispatcher.read_more()
                return remaining
        return 1

    def _unacked_indexes(self, pos: Position, batch_size: int) -> int:
        """Indexes of the batch at ``pos`` the cursor has not acked."""
        words = self.cursor.get_ack_set(pos)
        return batch_size if words is None else _bit_count(words)

    def on_pending_ack_removed(self, consumer: Consumer, pos: Position, key_hash: int) -> None:
        """Hook for Key_Shared's draining-hash bookkeeping."""
        hook = getattr(self.dispatcher, "on_pending_ack_removed", None)
        if hook is not None:
            hook(consumer, pos, key_hash)

    def _owner_of(
        self, consumer: Consumer, pos: Position
    ) -> tuple[Consumer | None, PendingAck | None]:
        """The consumer that holds ``pos`` (usually the one acking it)."""
        if consumer.pending_acks is None:
            return consumer, None
        pa = consumer.pending_acks.get(pos)
        if pa is not None:
            return consumer, pa
        for c in self.consumers:
            if c.pending_acks is not None:
                pa = c.pending_acks.get(pos)
                if pa is not None:
                    return c, pa
        return None, None

    def _mark_delete_moved(self, mark_delete: Position) -> None:
        self.last_mark_delete_advanced = int(time.time() * 1000)
        hook = getattr(self.dispatcher, "on_mark_delete_moved", None)
        if hook is not None:
            hook(mark_delete)
        counts = self.redelivery_counts
        if counts and len(counts) > 1024:
            for pos in [p for p in counts if p <= mark_delete]:
                del counts[pos]
        if self.replicated:
            self.topic.replicated_subscriptions.mark_delete_moved(self, mark_delete)
        self.topic.on_subscription_progress()

    def hide_markers(self, entries: list[Entry]) -> list[Entry]:
        """``entries`` read by dispatch without the server-only marker entries, which are
        acknowledged instead of delivered (Pulsar's ``filterEntriesForConsumer``)."""
        meta_cache = self.topic.meta_cache
        if not meta_cache.has_marker(entries):
            return entries
        marker_type = meta_cache.marker_type
        markers = [e for e in entries if marker_type(e.position, e.data)]
        if self.replicated:
            self.topic.replicated_subscriptions.cache_snapshots(self, markers)
        if self.cursor.ack_individual([e.position for e in markers]):
            self._mark_delete_moved(self.cursor.mark_delete_position)
        return [e for e in entries if not marker_type(e.position, e.data)]

    def apply_replicated_mark_delete(self, position: Position) -> bool:
        """Another cluster's update moves this replicated subscription's mark-delete position
        forward to ``position`` (never back); returns whether it moved. What consumers hold
        stays held until they ack it, as after an admin skip."""
        cursor = self.cursor
        if position <= cursor.mark_delete_position or position > cursor.last_add_confirmed:
            return False
        cursor.ack_cumulative(position)
        self._after_manual_ack()
        return True

    def redeliver_unacknowledged(
        self, consumer: Consumer, positions: Sequence[Position] | None
    ) -> None:
        """REDELIVER_UNACKNOWLEDGED_MESSAGES from ``consumer``."""
        if self.dispatcher is not None:
            self.dispatcher.redeliver(consumer, positions)

    # --- manual cursor moves ---------------------------------------------------------------
    def reset_cursor(self, position: Position) -> None:
        """Seek / reset-cursor: consumers are closed, the cursor is reset to ``position``.

        The clients re-subscribe and resume there: a durable subscription stays; a reader's
        (non-durable) one goes with its consumer but its cursor is kept for the reader that
        re-subscribes under the same name, as Pulsar keeps it in the managed ledger.
        """
        self._resetting = True
        try:
            self.disconnect_all()
        finally:
            self._resetting = False
        if self.dispatcher is not None:
            self.dispatcher.reset()
        self.redelivery_counts.clear()
        self.cursor.reset_cursor(position)
        self._mark_delete_moved(self.cursor.mark_delete_position)

    def skip(self, n: int) -> int:
        """Admin skip: ack the next ``n`` unacked entries; returns how many were skipped."""
        skipped = self.cursor.skip_entries(n)
        self._after_manual_ack()
        return skipped

    def clear_backlog(self) -> None:
        """Admin clear-backlog: ack everything stored so far."""
        self.cursor.clear_backlog()
        self._after_manual_ack()

    def _after_manual_ack(self, *, release_held: bool = False) -> None:
        """After entries were acked for the consumers: the mark-delete position moved;
        dispatch goes on.

        An admin skip or clear-backlog leaves the entries a consumer still holds in its pending
        acks until it acks them (its client is still processing them and will) or leaves:
        dropping them freed a Key_Shared key that was moving to another consumer, which then got
        the key's next entry while the first still processed earlier ones (apache/pulsar#25627,
        open upstream). Expiry (``release_held``) lets them go, as Pulsar does: expired messages
        are over, and dispatch must go on even if a consumer never acks what it holds (Key_Shared
        row 15). Acked entries still queued for replay are dropped when the replay read finds
        them acked."""
        cursor = self.cursor
        if release_held:
            for c in self.consumers:
                pending = c.pending_acks
                if not pending:
                    continue
                for pos in [p for p in pending if cursor.is_acked(p)]:
                    pa = pending.pop(pos)
                    self.on_pending_ack_removed(c, pos, pa.key_hash)
                    c.release_unacked(pa.batch_size - pa.acked_indexes)
        self._mark_delete_moved(cursor.mark_delete_position)
        self.kick_dispatch()

    def should_pause_on_ack_state(self) -> bool:
        """PIP-299: stop normal reads while the ack holes exceed what can be persisted.

        Only Shared and Key_Shared pause; replay reads go on, so the entries of a closed
        consumer still reach the others. Any ack, skip, clear-backlog, seek or reset-cursor
        (all of which call the dispatcher's read loop) re-checks, as does turning it off.
        """
        if (
            not self.durable
            or self.sub_type not in (SubType.Shared, SubType.Key_Shared)
            or not self.topic.policy("dispatcherPauseOnAckStatePersistentEnabled")
        ):
            self.blocked_on_ack_state = False
            return False
        cursor = self.cursor
        paused = not cursor.is_ack_state_fully_persistable()
        if paused:
            # Beyond Pulsar: reading back inside the acked ranges (after every consumer left
            # and the cursor rewound) can only fill holes, which shrinks the ack state; pausing
            # there would stall the subscription until an operator stepped in.
            last = cursor.individually_deleted.last_range()
            if last is not None and cursor.read_position <= last[1]:
                paused = False
        self.blocked_on_ack_state = paused
        return paused

    # --- stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """SubscriptionStats with Pulsar's field names."""
        consumers = [consumer_stats(c) for c in self.consumers]
        cursor = self.cursor
        backlog = cursor.number_of_entries_in_backlog
        st: dict[str, Any] = {
            # As Pulsar: a subscription's rates are the sums of its consumers' rates.
            "msgRateOut": sum(c["msgRateOut"] for c in consumers),
            "msgThroughputOut": sum(c["msgThroughputOut"] for c in consumers),
            "bytesOutCounter": sum(c.bytes_out_counter for c in self.consumers)
            + self.bytes_out_counter,
            "msgOutCounter": sum(c.msg_out_counter for c in self.consumers) + self.msg_out_counter,
            "msgRateRedeliver": sum(c["msgRateRedeliver"] for c in consumers),
            "messageAckRate": sum(c["messageAckRate"] for c in consumers),
            "msgBacklog": backlog,
            "backlogSize": 0,
            "msgBacklogNoDelayed": backlog,
            "blockedSubscriptionOnUnackedMsgs": False,
            "msgDelayed": 0,
            "unackedMessages": sum(c.unacked_messages for c in self.consumers),
            "type": (self.sub_type or SubType.Exclusive).name,
            "lastExpireTimestamp": self.last_expire_timestamp,
            "lastConsumedFlowTimestamp": max(
                (c.last_consumed_flow_timestamp for c in self.consumers), default=0
            ),
            "lastConsumedTimestamp": max(
                (c.last_consumed_timestamp for c in self.consumers), default=0
            ),
            "lastAckedTimestamp": max((c.last_acked_timestamp for c in self.consumers), default=0),
            "lastMarkDeleteAdvancedTimestamp": self.last_mark_delete_advanced,
            "consumers": consumers,
            "isDurable": self.durable,
            "blockedOnAckStatePersistent": self.should_pause_on_ack_state(),
            "isReplicated": self.replicated,
            "nonContiguousDeletedMessagesRanges": len(cursor.individually_deleted),
            "nonContiguousDeletedMessagesRangesSerializedSize": 0,
            "subscriptionProperties": {},
        }
        if self.dispatch_throttle is not None:
            st.update(self.dispatch_throttle.stats())
        if self.dispatcher is not None:
            st.update(self.dispatcher.stats())
        st["msgBacklogNoDelayed"] = max(backlog - st["msgDelayed"], 0)
        return st


def _bit_count(words: Sequence[int]) -> int:
    return sum((w & 0xFFFFFFFFFFFFFFFF).bit_count() for w in words)


def _batch_size_hint(words: Sequence[int]) -> int:
    """Without a pending record, the batch size is at least the highest unacked index + 1."""
    top = 0
    for i, w in enumerate(words):
        w &= 0xFFFFFFFFFFFFFFFF
        if w:
            top = i * 64 + w.bit_length()
    return max(top, 1)
