"""Shared: entries spread over the consumers that have permits, with a replay queue."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sortedcontainers import SortedDict

from keyshared.broker.consumer import Consumer
from keyshared.broker.dispatch.base import Dispatcher, Scheduler, TimerHandle, on_done
from keyshared.broker.dispatch.delayed import DelayedDeliveryTracker
from keyshared.broker.dispatch.unacked import SubscriptionUnackedLimit
from keyshared.broker.entry_meta import EntryMeta
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.subscription import Subscription

NORMAL = "normal"
REPLAY = "replay"

# Pulsar's dispatcherMaxRoundRobinBatchSize: entries given to one consumer before moving on.
ROUND_ROBIN_BATCH = 20

# What one round sends to one consumer: the entries, their metadata, and (when the routing
# computed them) the hashes their pending acks keep; the lists run in parallel.
DispatchGroup = tuple[Consumer, list[Entry], list[EntryMeta], list[int] | None]


def _now_ms() -> int:
    return int(time.time() * 1000)


class ReplayQueue:
    """Positions waiting to be delivered again, in position order, with their key hashes.

    Pulsar's MessageRedeliveryController: a hash of 0 means "not known until read". The
    per-hash counts let Key_Shared hold back new entries of a key that has older ones queued.
    """

    __slots__ = ("_hash_counts", "_positions", "min_added_with_hash", "track_hashes")

    def __init__(self, *, track_hashes: bool = False) -> None:
        self._positions: SortedDict = SortedDict()
        self._hash_counts: dict[int, int] = {}
        self.track_hashes = track_hashes
        # The lowest position queued with a known hash since the dispatcher last reset this
        # (when it issues a replay read): Key_Shared checks it when that read completes.
        self.min_added_with_hash: Position | None = None

    def __len__(self) -> int:
        return len(self._positions)

    def __contains__(self, pos: Position) -> bool:
        return pos in self._positions

    def add(self, pos: Position, key_hash: int = 0) -> None:
        """Queue ``pos``; a known ``key_hash`` is counted so that key can be held back."""
        old = self._positions.get(pos)
        if old is not None:
            if old == key_hash or key_hash == 0:
                return
            self._dec(old)
        self._positions[pos] = key_hash
        if key_hash and self.track_hashes:
            self._hash_counts[key_hash] = self._hash_counts.get(key_hash, 0) + 1
            low = self.min_added_with_hash
            if low is None or pos < low:
                self.min_added_with_hash = pos

    def remove(self, pos: Position) -> None:
        """Drop ``pos`` if queued."""
        key_hash = self._positions.pop(pos, None)
        if key_hash:
            self._dec(key_hash)

    def _dec(self, key_hash: int) -> None:
        if not self.track_hashes or not key_hash:
            return
        n = self._hash_counts.get(key_hash, 0) - 1
        if n > 0:
            self._hash_counts[key_hash] = n
        else:
            self._hash_counts.pop(key_hash, None)

    def remove_up_to(self, pos: Position) -> None:
        """Drop every queued position at or before ``pos`` (mark-delete moved past them)."""
        positions = self._positions
        while positions:
            first = positions.peekitem(0)[0]
            if first > pos:
                break
            self.remove(first)

    def contains_hash(self, key_hash: int) -> bool:
        """True if an older entry of this key is queued."""
        return key_hash != 0 and key_hash in self._hash_counts

    def hash_of(self, pos: Position) -> int:
        """The known key hash of a queued position (0 if unknown)."""
        return int(self._positions.get(pos, 0))

    def first(self) -> Position | None:
        """The lowest queued position."""
        return self._positions.peekitem(0)[0] if self._positions else None

    def iter_positions(self) -> Any:
        """Queued positions in order."""
        return iter(self._positions.keys())

    def clear(self) -> None:
        """Forget everything."""
        self._positions.clear()
        self._hash_counts.clear()


class SharedDispatcher(Dispatcher):
    """Pulsar's PersistentDispatcherMultipleConsumers: round-robin over consumers with permits."""

    def __init__(self, subscription: Subscription, scheduler: Scheduler) -> None:
        super().__init__(subscription, scheduler)
        self.replay = ReplayQueue(track_hashes=self.orders_by_key())
        self.delayed = DelayedDeliveryTracker(self.config.delayedDeliveryTickTimeMillis)
        self._delayed_timer: TimerHandle | None = None
        self._rr = 0
        self._should_rewind = False
        self._min_replayed: Position | None = None
        self.unacked_limit = SubscriptionUnackedLimit(self._subscription_unacked_limit)

    def _subscription_unacked_limit(self) -> int:
        """``maxUnackedMessagesPerSubscription`` in force (none on a non-durable one, as a
        non-durable consumer has no limit of its own either)."""
        sub = self.subscription
        if not sub.durable:
            return 0
        return int(sub.topic.policy("maxUnackedMessagesPerSubscription") or 0)

    def orders_by_key(self) -> bool:
        """Whether the replay queue must hold back keys (Key_Shared without out-of-order)."""
        return False

    # --- consumers -----------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer``; the first one restarts reading from the first unacked entry."""
        if not self.consumers:
            if self.have_pending_read:
                self._should_rewind = True
            else:
                self.cursor.rewind()
            self.replay.clear()
        self.consumers.append(consumer)
        self.consumers.sort(key=lambda c: c.priority_level)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; its unacked entries go back to the replay queue for the others."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        pending = consumer.pending_acks
        if not self.consumers:
            self.forget_reads()
            self.replay.clear()
            self.delayed.clear()
            if pending is not None:
                pending.clear()
            return
        if pending:
            for pos, pa in sorted(pending.items()):
                self.add_to_replay(pos, pa.key_hash)
            pending.clear()
        self.read_more()

    def redeliver(self, consumer: Consumer, positions: Sequence[Any] | None) -> None:
        """Put ``consumer``'s unacked entries (all or some) back into the replay queue."""
        pending = consumer.pending_acks
        if pending is None:
            return
        chosen = sorted(pending) if positions is None else [p for p in positions if p in pending]
        counts = self.subscription.redelivery_counts
        track = self.config.subscriptionRedeliveryTrackerEnabled
        released = 0
        for pos in chosen:
            pa = pending.pop(pos)
            # Indexes acked one by one were released from the count when they were acked.
            released += pa.batch_size - pa.acked_indexes
            # Without a known hash, as Pulsar: the entry's key is looked at again once read.
            self.add_to_replay(pos, 0)
            if track:
                counts[pos] = counts.get(pos, 0) + 1
        consumer.msg_redeliver_counter += released
        consumer.release_unacked(released)
        self.read_more()

    def reset(self) -> None:
        """The cursor was moved by hand: drop queued replays and in-flight reads."""
        self.forget_reads()
        self.replay.clear()
        self.delayed.clear()
        for c in self.consumers:
            if c.pending_acks is not None:
                c.pending_acks.clear()
            c.unacked_messages = 0

    def add_to_replay(self, pos: Position, key_hash: int) -> None:
        """Queue ``pos`` unless it is already acked."""
        if pos > self.cursor.mark_delete_position:
            self.replay.add(pos, key_hash)

    def on_mark_delete_moved(self, mark_delete: Position) -> None:
        """Acked positions can leave the replay queue."""
        self.replay.remove_up_to(mark_delete)
        self.delayed.remove_up_to(mark_delete)

    # --- delayed delivery ------------------------------------------------------------------
    def _hold_delayed(
        self, entries: list[Entry], metas: list[EntryMeta]
    ) -> tuple[list[Entry], list[EntryMeta], int]:
        """Take out the entries not yet due; returns the rest (entries and their metadata)
        and how many were held."""
        if not self.subscription.topic.policy("delayedDeliveryEnabled"):
            return entries, metas, 0
        now = _now_ms()
        if all(m.deliver_at_time <= now for m in metas):
            return entries, metas, 0
        out: list[Entry] = []
        out_metas: list[EntryMeta] = []
        held = 0
        for e, m in zip(entries, metas, strict=True):
            at = m.deliver_at_time
            if at > now:
                self.delayed.add(e.position, at)
                held += 1
            else:
                out.append(e)
                out_metas.append(m)
        if held:
            self._arm_delayed_timer()
        return out, out_metas, held

    def _move_due_to_replay(self) -> None:
        if len(self.delayed):
            for pos in self.delayed.pop_due(_now_ms()):
                self.add_to_replay(pos, 0)
            self._arm_delayed_timer()

    def _arm_delayed_timer(self) -> None:
        if self._delayed_timer is not None:
            self._delayed_timer.cancel()
            self._delayed_timer = None
        now = _now_ms()
        wake = self.delayed.next_wakeup_ms(now)
        if wake is None or self.closed:
            return

        def fire() -> None:
            self._delayed_timer = None
            self.delayed.ticked(_now_ms())
            self.read_more()

        self._delayed_timer = self.scheduler.call_later(max(wake - now, 0) / 1000.0, fire)

    # --- the unacked limits --------------------------------------------------------------
    def unacked_messages(self) -> int:
        """Messages the subscription's consumers hold unacked, together."""
        return sum(c.unacked_messages for c in self.consumers)

    def permits_of(self, consumer: Consumer) -> int:
        """Entries ``consumer`` may receive now: its own permits and limit, and none at all
        while the subscription is blocked on its unacked limit."""
        if self.unacked_limit.blocked:
            return 0
        return consumer.dispatch_permits()

    def update_unacked_block(self) -> None:
        """Block or unblock the subscription on ``maxUnackedMessagesPerSubscription``.

        Run before each step of the read loop and after each send; every path that lowers a
        consumer's count (ack, nack, a consumer leaving, a policy change) ends in a read, so
        the unblocking is seen there."""
        if self.unacked_limit.update(self.unacked_messages()):
            self.read_more()

    # --- the read loop -------------------------------------------------------------------
    def total_permits(self) -> int:
        """Entries all consumers together may receive now."""
        return sum(self.permits_of(c) for c in self.consumers)

    def replay_candidates(self, max_entries: int) -> list[Position]:
        """Queued positions to read again now, in order."""
        out: list[Position] = []
        for pos in self.replay.iter_positions():
            out.append(pos)
            if len(out) >= max_entries:
                break
        return out

    def normal_read_allowed(self) -> bool:
        """Whether a normal (sequential) read may start now."""
        return True

    def max_normal_read(self, n: int) -> int:
        """Cap on the entries of one normal read."""
        return n

    def read_more_now(self) -> None:
        """Start a replay read if anything is queued, else a normal read."""
        if not self.consumers:
            return
        self.update_unacked_block()
        permits = self.total_permits()
        if permits <= 0:
            return
        n = min(permits, self.read_batch_size)
        room = self.unacked_limit.room(self.unacked_messages())
        if room is not None:
            n = max(min(n, room), 1)
        n = self.rate_budget(n)
        if n <= 0:
            return
        self._move_due_to_replay()
        if len(self.replay) and not self.have_pending_replay_read:
            positions = self.replay_candidates(n)
            if positions:
                self.have_pending_replay_read = True
                # The head of the whole queue, as Pulsar 4.x's updateMinReplayedPosition, not
                # the first candidate: a head the filter skipped (its consumer has no permits)
                # would otherwise make every replay read look overtaken, and be re-read at once
                # forever without dispatching anything.
                self._min_replayed = self.replay.first()
                self.replay.min_added_with_hash = None
                gen = self.read_generation
                on_done(
                    self.cursor.replay_entries(positions),
                    lambda fut: self._replay_complete(fut, positions, gen),
                )
                return
        if self.have_pending_read or self.have_pending_replay_read:
            return
        if not self.normal_read_allowed():
            self.read_more_with_backoff()
            return
        if self.subscription.should_pause_on_ack_state():
            return
        n = self.max_normal_read(n)
        self.have_pending_read = True
        self._min_replayed = self.replay.first()
        gen = self.read_generation
        on_done(self.cursor.read_entries_or_wait(n), lambda fut: self._read_complete(fut, n, gen))

    def _replay_complete(self, fut: Any, positions: list[Position], gen: int) -> None:
        entries: list[Entry] | None = self.read_outcome(fut, gen, replay=True)
        if entries is None:
            return
        returned = {e.position for e in entries}
        for pos in positions:
            if pos not in returned:
                # Acked meanwhile, or gone: nothing to replay.
                self.replay.remove(pos)
        self.dispatch(entries, REPLAY)

    def _read_complete(self, fut: Any, asked: int, gen: int) -> None:
        result = self.read_outcome(fut, gen, replay=False)
        if result is None:
            return
        if result.stale:
            self.read_more()
            return
        if self._should_rewind:
            self._should_rewind = False
            self.cursor.rewind()
            self.read_more()
            return
        if len(result.entries) >= asked:
            self.grow_read_batch()
        self.dispatch(result.entries, NORMAL)

    def dispatch(self, entries: list[Entry], read_type: str) -> None:
        """Send what can be sent; queue the rest for replay; keep the loop going."""
        if not entries:
            self.read_more()
            return
        if not self.consumers:
            if read_type == NORMAL:
                self.cursor.rewind()
            return
        meta_of = self.subscription.topic.entry_meta
        # Each entry's metadata is looked up once a round, here: delay, routing, pending acks.
        metas = [meta_of(e) for e in entries]
        entries, metas, held = self._hold_delayed(entries, metas)
        if not entries:
            # Everything read is delayed: read on at once, no backoff (Pulsar row 36).
            self.read_more()
            return
        if self.orders_by_key():
            first = self.replay.first()
            if first is not None and self._min_replayed is not None and first < self._min_replayed:
                # An older entry was queued while this read was in flight: dispatching this
                # read now could overtake it, so queue everything and replay in order.
                if read_type == NORMAL:
                    for e, m in zip(entries, metas, strict=True):
                        # The hash the replay queue counts is the one filter_and_group looks
                        # up: the selector slot, not the raw key hash.
                        self.add_to_replay(e.position, self.pending_hash(m))
                self.read_more()
                return
            added = self.replay.min_added_with_hash
            if read_type == REPLAY and added is not None and added < entries[-1].position:
                # A consumer left while this replay read was in flight, and what it held was
                # queued, older than some entries read: if one is of the same key it must go
                # first, and the head check above cannot see that when an even older entry
                # heads the queue. Everything read is still queued: replay again, in order.
                self.read_more()
                return
        groups = self.filter_and_group(entries, read_type, metas)
        sent = 0
        for consumer, chosen, chosen_metas, hashes in groups:
            if read_type == REPLAY:
                for e in chosen:
                    self.replay.remove(e.position)
            sent += len(chosen)
            self.send_to_consumer(consumer, chosen, track=True, metas=chosen_metas, hashes=hashes)
        if sent:
            self.update_unacked_block()
        if sent or held:
            self.backoff.reset()
            self.read_more()
        else:
            self.read_more_with_backoff()

    def filter_and_group(
        self, entries: list[Entry], read_type: str, metas: list[EntryMeta]
    ) -> list[DispatchGroup]:
        """Round-robin: give each consumer with permits up to a small batch, in turn.

        Only consumers of the best priority level (the lowest ``priorityLevel``) among those
        with permits take turns, as in Pulsar's ``getNextConsumer``: a lower level is sent
        something only while every consumer above it has no permits left.
        ``metas`` are the entries' metadata, in the same order."""
        budgets = {c: self.permits_of(c) for c in self.consumers}
        groups: dict[Consumer, list[Entry]] = {}
        group_metas: dict[Consumer, list[EntryMeta]] = {}
        n = len(self.consumers)
        i = 0
        idx = self._rr
        while i < len(entries):
            level = min((c.priority_level for c in self.consumers if budgets[c] > 0), default=None)
            if level is None:
                break
            consumer = None
            for step in range(n):
                c = self.consumers[(idx + step) % n]
                if budgets[c] > 0 and c.priority_level == level:
                    consumer = c
                    idx = (idx + step) % n
                    break
            assert consumer is not None  # a consumer of that level has permits
            take = min(budgets[consumer], ROUND_ROBIN_BATCH, len(entries) - i)
            groups.setdefault(consumer, []).extend(entries[i : i + take])
            group_metas.setdefault(consumer, []).extend(metas[i : i + take])
            budgets[consumer] -= take
            i += take
            idx = (idx + 1) % n
        self._rr = idx
        for e in entries[i:]:
            self.add_to_replay(e.position, 0)
        return [(c, chosen, group_metas[c], None) for c, chosen in groups.items()]

    def stats(self) -> dict[str, Any]:
        """Replay-queue size (Pulsar's msgInReplay), delayed entries (msgDelayed), and whether
        the subscription is blocked on its unacked limit."""
        self.update_unacked_block()
        return {
            "msgInReplay": len(self.replay),
            "msgDelayed": len(self.delayed),
            "blockedSubscriptionOnUnackedMsgs": self.unacked_limit.blocked,
        }

    def close(self) -> None:
        """Stop dispatching and the delayed-delivery timer."""
        super().close()
        if self._delayed_timer is not None:
            self._delayed_timer.cancel()
            self._delayed_timer = None
