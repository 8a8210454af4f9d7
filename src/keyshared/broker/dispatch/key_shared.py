"""Key_Shared (PIP-379): each key to one consumer at a time, in order, while consumers change.

The decisions follow Pulsar 4.x's PersistentStickyKeyDispatcherMultipleConsumers:

* an entry goes to the consumer the selector picks for its key hash;
* a normal read never overtakes a queued replay of the same hash;
* when a join or leave moves a hash, the hash drains: it is blocked for everyone but its old
  owner until the old owner's pending entries of it are acked or the old owner leaves;
* a consumer without permits, or a blocked hash, sends the entry to the replay queue, bounded
  by the look-ahead limit, so one slow key never stops the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keyshared.broker.consumer import Consumer
from keyshared.broker.dispatch.base import Scheduler, TimerHandle
from keyshared.broker.dispatch.draining import DrainingHashesTracker
from keyshared.broker.dispatch.selectors import (
    ConsumerAssignError,
    StickyKeyConsumerSelector,
    selector_for,
)
from keyshared.broker.dispatch.shared import NORMAL, REPLAY, DispatchGroup, SharedDispatcher
from keyshared.broker.entry_meta import EntryMeta
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.protocol import sticky_key_hash
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.subscription import Subscription


def new_key_shared_dispatcher(
    subscription: Subscription, scheduler: Scheduler, first: Consumer
) -> KeySharedDispatcher:
    """The Key_Shared dispatcher for a subscription whose first consumer is ``first``."""
    meta = first.key_shared_meta
    mode = meta.mode if meta else "AUTO_SPLIT"
    allow_ooo = meta.allow_out_of_order_delivery if meta else False
    if subscription.config.subscriptionKeySharedUseClassicPersistentImplementation:
        from keyshared.broker.dispatch.key_shared_classic import ClassicKeySharedDispatcher

        return ClassicKeySharedDispatcher(
            subscription, scheduler, mode=mode, allow_out_of_order=allow_ooo
        )
    return KeySharedDispatcher(subscription, scheduler, mode=mode, allow_out_of_order=allow_ooo)


class KeySharedDispatcher(SharedDispatcher):
    """The PIP-379 Key_Shared dispatcher (Pulsar 4.x default)."""

    def __init__(
        self,
        subscription: Subscription,
        scheduler: Scheduler,
        *,
        mode: str,
        allow_out_of_order: bool,
    ) -> None:
        self.mode = mode
        self.allow_out_of_order = allow_out_of_order
        super().__init__(subscription, scheduler)
        self.selector: StickyKeyConsumerSelector[Consumer] = selector_for(mode, self.config)
        start, end = self.selector.key_hash_range
        self._slot_start = start
        self._slot_span = end - start + 1
        # Draining only where a hash can move under a consumer that holds it (research §3.9).
        self.draining: DrainingHashesTracker[Consumer] | None = (
            DrainingHashesTracker(self._hash_unblocked, name=subscription.name)
            if mode == "AUTO_SPLIT" and not allow_out_of_order
            else None
        )
        self._unblock_handle: TimerHandle | None = None
        self._skip_next_replay = False

    # --- identity of the subscription's Key_Shared settings ---------------------------------
    def orders_by_key(self) -> bool:
        """Ordering is enforced unless allowOutOfOrderDelivery."""
        return not self.allow_out_of_order

    def fits(self, consumer: Consumer) -> bool:
        """A consumer must ask for the same mode and ordering as the subscription has."""
        meta = consumer.key_shared_meta
        mode = meta.mode if meta else "AUTO_SPLIT"
        ooo = meta.allow_out_of_order_delivery if meta else False
        return mode == self.mode and ooo == self.allow_out_of_order

    def slot_of(self, meta: EntryMeta) -> int:
        """The selector's sticky key hash for an entry (Pulsar's makeStickyKeyHash)."""
        return self.slot_of_hash(meta.key_hash)

    def pending_hash(self, meta: EntryMeta) -> int:
        """Pending acks and the replay queue keep the selector slot."""
        return self.slot_of(meta)

    # --- consumers ---------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer``; hashes it takes over start draining on their old owners."""
        if self.consumers and not self.fits(consumer):
            raise BrokerError(
                ServerError.ConsumerBusy,
                "Key_Shared subscription has a different key-shared mode or "
                "allowOutOfOrderDelivery setting",
            )
        ranges = consumer.key_shared_meta.ranges if consumer.key_shared_meta else []
        super().add_consumer(consumer)
        try:
            impacted = self.selector.add_consumer(consumer, ranges or None)
        except ConsumerAssignError as exc:
            self.consumers.remove(consumer)
            raise BrokerError(ServerError.ConsumerAssignError, str(exc)) from exc
        if self.draining is not None:
            self.draining.register_draining_hashes(impacted, self._pending_hashes, skip=consumer)
        self.read_more()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; its entries are replayed and its draining hashes released."""
        # What it held is queued now and may go at once: a skip-once flag left from an earlier
        # round must not keep that replay behind a normal read waiting at the tail.
        self._skip_next_replay = False
        impacted = self.selector.remove_consumer(consumer)
        draining = self.draining
        if draining is not None:
            pending = consumer.pending_acks or {}
            with draining.batch():
                for pa in pending.values():
                    draining.reduce_ref_count(consumer, pa.key_hash, closing=True)
        super().remove_consumer(consumer)
        if draining is not None:
            if self.consumers:
                draining.register_draining_hashes(impacted, self._pending_hashes, skip=consumer)
            else:
                draining.clear()
            draining.consumer_removed(consumer)

    def _pending_hashes(self, consumer: Consumer) -> list[int]:
        pending = consumer.pending_acks or {}
        return [pa.key_hash for pa in pending.values()]

    def on_pending_ack_removed(self, consumer: Consumer, pos: Position, key_hash: int) -> None:
        """An entry left ``consumer``'s pending acks (acked or redelivered)."""
        if self.draining is not None:
            self.draining.reduce_ref_count(consumer, key_hash, closing=False)

    def redeliver(self, consumer: Consumer, positions: Sequence[Any] | None) -> None:
        """Nack / ack timeout: the entries leave the consumer (draining counts drop too)."""
        self._skip_next_replay = False  # what comes back may go at once (see remove_consumer)
        pending = consumer.pending_acks
        if pending is not None and self.draining is not None:
            chosen = list(pending) if positions is None else [p for p in positions if p in pending]
            with self.draining.batch():
                for pos in chosen:
                    self.draining.reduce_ref_count(consumer, pending[pos].key_hash)
        super().redeliver(consumer, positions)

    def reset(self) -> None:
        """Cursor moved by hand: pending state is gone, so is draining."""
        self._skip_next_replay = False
        super().reset()
        if self.draining is not None:
            self.draining.clear()

    # --- unblocking ----------------------------------------------------------------------------
    def _hash_unblocked(self, _hash: int) -> None:
        """A draining hash cleared: read again after keySharedUnblockingIntervalMs (coalesced)."""
        if self._unblock_handle is not None or self.closed:
            return
        delay = self.config.keySharedUnblockingIntervalMs / 1000.0

        def fire() -> None:
            self._unblock_handle = None
            if len(self.replay) and not self.have_pending_replay_read:
                # A parked normal read must not hold up the replay that just became possible.
                self.cancel_parked_read()
            self.read_more()

        self._unblock_handle = (
            self.scheduler.call_later(delay, fire) if delay > 0 else self.scheduler.call_soon(fire)
        )

    def on_mark_delete_moved(self, mark_delete: Position) -> None:
        """Acked entries leave the replay queue; blocked keys may be free now."""
        super().on_mark_delete_moved(mark_delete)
        self.read_more()

    # --- look-ahead limits ---------------------------------------------------------------------
    def look_ahead_limit(self) -> int:
        """Pulsar's effective look-ahead limit on the replay queue."""
        cfg = self.config
        per_c = cfg.keySharedLookAheadMsgInReplayThresholdPerConsumer
        per_s = cfg.keySharedLookAheadMsgInReplayThresholdPerSubscription
        n = len(self.consumers)
        if per_c <= 0:
            limit = per_s
        else:
            limit = per_c * n
            if per_s > 0:
                limit = min(limit, per_s)
        if limit <= 0:
            big = 1 << 62
            # The unacked limits in force on this topic (policies over broker.conf).
            per_sub = self.unacked_limit.limit
            per_cons = self.subscription.consumer_unacked_limit()
            limit = min(per_sub if per_sub > 0 else big, n * per_cons if per_cons > 0 else big)
        return limit

    def normal_read_allowed(self) -> bool:
        """Below the look-ahead limit and some consumer can take entries."""
        if len(self.replay) >= self.look_ahead_limit():
            return False
        return any(self.permits_of(c) > 0 for c in self.consumers)

    def max_normal_read(self, n: int) -> int:
        """Never read past the look-ahead limit."""
        return min(n, max(self.look_ahead_limit() - len(self.replay), 1))

    # --- replay filtering ----------------------------------------------------------------------
    def read_ahead_would_read(self) -> bool:
        """Whether skipping the replay once, after a replay round that sent nothing, would read
        ahead now: no normal read out yet, something written past the read position, and a
        consumer that may take it. Else the skip only used up the trigger: with a normal read
        already out (waiting at the tail), or nothing to read, the read parked at the tail and
        the queued entries waited for the next publish (a hang, if no client had a FLOW left to
        send). An empty replay round backs off (``read_more_with_backoff``), so replaying again
        instead does not spin."""
        return (
            not self.have_pending_read
            and self.cursor.has_more_entries()
            and self.normal_read_allowed()
        )

    def replay_candidates(self, max_entries: int) -> list[Position]:
        """Queued positions whose consumer has room and whose hash is not blocked."""
        if self._skip_next_replay:
            self._skip_next_replay = False
            if self.read_ahead_would_read():
                return []
        # With allowOutOfOrderDelivery too: a head of entries for consumers without permits must
        # not keep a consumer with permits from what is queued for it behind them.
        ordered = not self.allow_out_of_order
        budgets: dict[Consumer, int] = {}
        out: list[Position] = []
        replay = self.replay
        for pos in replay.iter_positions():
            h = replay.hash_of(pos)
            if h:
                c = self.selector.select(h)
                if c is None:
                    continue
                budget = budgets.get(c)
                if budget is None:
                    budget = budgets[c] = self.permits_of(c)
                if budget <= 0 or (ordered and self.replay_held_back(c, pos, h)):
                    continue
                budgets[c] = budget - 1
            out.append(pos)
            if len(out) >= max_entries:
                break
        return out

    def replay_held_back(self, c: Consumer, pos: Position, key_hash: int) -> bool:
        """Whether ``c`` may not take the queued ``pos`` now though it has permits: its hash
        is draining towards it (an earlier entry of it is still with another consumer)."""
        return self.draining is not None and self.draining.would_block(c, key_hash)

    # --- the decision ----------------------------------------------------------------------------
    def filter_and_group(
        self, entries: list[Entry], read_type: str, metas: list[EntryMeta]
    ) -> list[DispatchGroup]:
        """Route each entry by key; what cannot go now is queued for replay, in order.

        ``metas`` are the entries' metadata, in the same order. Each entry's selector slot is
        computed once, here, and handed on with its group to the pending acks."""
        selector = self.selector
        draining = self.draining
        replay = self.replay
        ordered = not self.allow_out_of_order
        span = self._slot_span
        start = self._slot_start
        budgets: dict[Consumer, int] = {}
        groups: dict[Consumer, tuple[list[Entry], list[EntryMeta], list[int]]] = {}
        look_ahead_allowed = len(replay) < self.look_ahead_limit()
        blocked_consumers: set[Consumer] = set()
        seen: set[Consumer] = set()
        for entry, meta in zip(entries, metas, strict=True):
            # slot_of_hash, inline: this loop runs once per entry dispatched.
            h = meta.key_hash % span + start or 1
            c = selector.select(h)
            dispatch = False
            if c is not None:
                seen.add(c)
                budget = budgets.get(c)
                if budget is None:
                    budget = budgets[c] = self.permits_of(c)
                if budget > 0:
                    if (ordered and read_type == NORMAL and replay.contains_hash(h)) or (
                        draining is not None and draining.should_block_sticky_key_hash(c, h)
                    ):
                        blocked_consumers.add(c)
                    else:
                        budgets[c] = budget - 1
                        dispatch = True
            if dispatch:
                assert c is not None
                group = groups.get(c)
                if group is None:
                    group = groups[c] = ([], [], [])
                group[0].append(entry)
                group[1].append(meta)
                group[2].append(h)
            else:
                # Queued (or kept queued, now with its hash known) behind older entries.
                self.add_to_replay(entry.position, h)
        if look_ahead_allowed and not groups:
            trigger = any(budgets.get(c, 0) > 0 for c in blocked_consumers) or any(
                self.permits_of(c) > 0 for c in self.consumers if c not in seen
            )
            if trigger and read_type == REPLAY:
                self._skip_next_replay = True
            elif trigger and read_type == NORMAL and self.cursor.has_more_entries():
                self.read_more()
        return [(c, es, ms, hs) for c, (es, ms, hs) in groups.items()]

    # --- what blocks a hash ----------------------------------------------------------------------
    def slot_of_key(self, key: bytes) -> int:
        """The selector slot a message key maps to."""
        return self.slot_of_hash(sticky_key_hash(key))

    def slot_of_hash(self, key_hash: int) -> int:
        """The selector slot of a 31-bit sticky key hash."""
        v = key_hash % self._slot_span + self._slot_start
        return v if v != 0 else 1

    def what_blocks(self, slot: int) -> dict[str, Any]:
        """Why entries of ``slot`` may be held back: owner, draining consumer, unacked ids."""
        owner = self.selector.select(slot)
        out: dict[str, Any] = {
            "hash": slot,
            "consumerName": owner.consumer_name if owner else None,
            "consumerId": owner.consumer_id if owner else None,
            "availablePermits": self.permits_of(owner) if owner else 0,
            "draining": False,
            "drainingConsumerName": None,
            "drainingConsumerId": None,
            "blockedAttempts": 0,
            "unackedMessageIds": [],
            "pendingMessageIds": [],
            "replayMessageIds": [
                str(p) for p in self.replay.iter_positions() if self.replay.hash_of(p) == slot
            ],
        }
        if owner is not None and owner.pending_acks:
            out["pendingMessageIds"] = [
                str(p) for p, pa in sorted(owner.pending_acks.items()) if pa.key_hash == slot
            ]
        blocker = self.draining.blocker_of(slot) if self.draining is not None else None
        if blocker is not None:
            holder = blocker.consumer
            out["draining"] = True
            out["drainingConsumerName"] = holder.consumer_name
            out["drainingConsumerId"] = holder.consumer_id
            out["blockedAttempts"] = blocker.blocked_attempts
            out["unackedMessageIds"] = [
                str(p)
                for p, pa in sorted((holder.pending_acks or {}).items())
                if pa.key_hash == slot
            ]
        return out

    # --- stats --------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Subscription stats of Key_Shared (seed pr-23429)."""
        st = super().stats()
        st.update(
            {
                "keySharedMode": self.mode,
                "allowOutOfOrderDelivery": self.allow_out_of_order,
                "drainingHashesCount": 0,
                "drainingHashesClearedTotal": 0,
                "drainingHashesUnackedMessages": 0,
            }
        )
        if self.draining is not None:
            for c in self.consumers:
                cs = self.draining.consumer_stats(c).to_json()
                st["drainingHashesCount"] += cs["drainingHashesCount"]
                st["drainingHashesClearedTotal"] += cs["drainingHashesClearedTotal"]
                st["drainingHashesUnackedMessages"] += cs["drainingHashesUnackedMessages"]
        return st

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        """Per-consumer ranges and draining hashes."""
        ranges = self.selector.get_consumer_key_hash_ranges().get(consumer, [])
        st: dict[str, Any] = {
            "keyHashRangeArrays": [[s, e] for s, e in ranges],
            "keyHashRanges": [f"[{s}, {e}]" for s, e in ranges],
            "drainingHashesCount": 0,
            "drainingHashesClearedTotal": 0,
            "drainingHashesUnackedMessages": 0,
            "drainingHashes": [],
        }
        if self.draining is not None:
            st.update(self.draining.consumer_stats(consumer).to_json())
        return st
