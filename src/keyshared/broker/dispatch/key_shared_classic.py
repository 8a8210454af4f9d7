"""Classic Key_Shared: recently joined consumers wait for what was sent before they joined.

Enabled by ``subscriptionKeySharedUseClassicPersistentImplementation=true``. A consumer that joins
while entries are in flight is "recently joined": it may only receive entries at or before its
join position until the mark-delete position passes that position.

The join position is the *last sent position* of seed pip-282 (PIP-282): every entry at or
before it has already been scheduled to be sent, tracked as a position plus the ranges sent
beyond it.

Beyond the seed and Pulsar: when a join or a leave moves a hash away from a consumer that
holds entries of it, nobody else receives an entry of that hash until those entries have left
it (acked, or handed back). The seed's rule alone frees a new consumer as soon as the
mark-delete position reaches the last sent position while an older consumer may still hold an
individually sent entry of a key the new one took over; the new consumer then received newer
entries of that key before the older one was processed (seen with key-based batches under
churn). Entries of other hashes do not hold a consumer back, so an unrelated slow consumer
cannot stall it. A restricted consumer receives only entries at or before its join
position, all sent before it joined: redeliveries (a nack, a consumer leaving). Without this it
got them while an older consumer still processed an earlier entry of the key, and that earlier
one after them if that consumer left too; and a hash moved by a leave went at once to a
consumer no longer restricted, with the same result (the first found by the simulation in
tests/sim, the second by a timeline built while asking why the simulation had not found it).

Pulsar 4.x's classic dispatcher uses the cursor's *read position* instead, which is
wrong in the two timelines of that seed (entries read but not yet dispatched, and entries
queued for replay without any consumer action). ``join_position="read"`` keeps that older rule
(without the hold-back of moved hashes) so tests can show the difference; it is not meant for
use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from keyshared.broker.consumer import Consumer
from keyshared.broker.dispatch.base import Scheduler
from keyshared.broker.dispatch.key_shared import KeySharedDispatcher
from keyshared.broker.dispatch.shared import NORMAL, REPLAY, DispatchGroup
from keyshared.broker.entry_meta import EntryMeta
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position
from keyshared.storage.range_set import RangeSet

if TYPE_CHECKING:
    from keyshared.broker.subscription import Subscription


class ClassicKeySharedDispatcher(KeySharedDispatcher):
    """PIP-282 Key_Shared: no draining hashes; recently joined consumers keyed by position."""

    def __init__(
        self,
        subscription: Subscription,
        scheduler: Scheduler,
        *,
        mode: str,
        allow_out_of_order: bool,
        join_position: str = "last_sent",
    ) -> None:
        super().__init__(subscription, scheduler, mode=mode, allow_out_of_order=allow_out_of_order)
        # Classic mode has no draining hashes (PIP-379 came after it).
        self.draining = None
        self.join_position = join_position
        self.recently_joined: dict[Consumer, Position] | None = None if allow_out_of_order else {}
        self.joined_at: dict[Consumer, Position] = {}
        # Per hash: entries held by a consumer that no longer owns the hash (a join or a leave
        # moved it away), with their holder. No one else gets the hash while one is held.
        self.stranded: dict[int, dict[Position, Consumer]] = {}
        self.last_sent: Position | None = None
        self.individually_sent = RangeSet()
        # After a replay round that sent nothing, skip the replay once to read ahead. It is
        # about the replay queue of that round: entries queued since (a nack, a consumer
        # leaving) or a new queue (reset) clear it, else the read they trigger skips them and,
        # with a normal read waiting at the tail, nothing brings them back before the next
        # publish (the simulation found a flag set before a reset-cursor doing that).
        self._stuck_on_replays = False

    # --- last sent position (seed pip-282) -------------------------------------------------
    def _last_sent_now(self) -> Position:
        """``updateIfNeededAndGetLastSentPosition``: never behind the mark-delete position."""
        mdp = self.cursor.mark_delete_position
        if self.last_sent is None:
            self.last_sent = mdp
            self.individually_sent = self.cursor.individually_deleted.copy()
        elif self.last_sent < mdp:
            self.last_sent = mdp
            self.individually_sent.remove_up_to(mdp)
        self._fold_sent()
        return self.last_sent

    def _mark_sent(self, entries: list[Entry]) -> None:
        if self.last_sent is None:
            self._last_sent_now()
        assert self.last_sent is not None
        for e in entries:
            if e.position > self.last_sent:
                self.individually_sent.add(e.position)
        self._fold_sent()

    def _fold_sent(self) -> None:
        """Swallow the sent ranges that continue the last sent position."""
        reader = self.cursor.reader
        lac = reader.last_add_confirmed
        while self.last_sent is not None:
            first = self.individually_sent.first_range()
            if first is None:
                break
            start, end = first
            nxt = reader.next_position(self.last_sent)
            if start > nxt or nxt > lac:
                break
            self.last_sent = max(self.last_sent, end)
            self.individually_sent.remove_up_to(end)

    def _join_position(self) -> Position:
        if self.join_position == "read":
            return self.cursor.read_position
        return self._last_sent_now()

    # --- consumers ---------------------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer``; with entries in flight it becomes recently joined."""
        super().add_consumer(consumer)
        joined = self._join_position()
        self.joined_at[consumer] = joined
        if self.recently_joined is not None and len(self.consumers) > 1 and self._in_flight():
            self.recently_joined[consumer] = joined
        self._strand()

    def _in_flight(self) -> bool:
        """Whether an entry after the mark-delete position was read (and is not acked).

        Pulsar asks ``getNumberOfEntriesSinceFirstNotAckedMessage() > 1``: it counts
        ``(mark-delete, read position]`` arithmetically, the read position included even when
        nothing is written there yet, so the answer is "the read position is past the first
        entry after the mark-delete position". Our cursor counts only the entries that exist,
        so with the cursor at the tail and one entry out that figure is 1, and a consumer
        joining then took over its key unrestricted, ahead of the entry still out."""
        cursor = self.cursor
        return cursor.read_position > cursor.reader.next_position(cursor.mark_delete_position)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; the last one leaving forgets what was sent."""
        self._stuck_on_replays = False  # what it held is queued now
        super().remove_consumer(consumer)
        self.joined_at.pop(consumer, None)
        if self.recently_joined is not None:
            self.recently_joined.pop(consumer, None)
            if len(self.consumers) <= 1:
                self.recently_joined.clear()
        if not self.consumers:
            self.last_sent = None
            self.individually_sent.clear()
        self._strand()
        self.read_more()

    def _strand(self) -> None:
        """After a join or a leave: the entries whose holder no longer owns their hash.

        Owners change only here, so between two calls the set only shrinks (entries acked or
        handed back): built afresh each time, it never keeps what left."""
        if self.recently_joined is None or self.join_position != "last_sent":
            return  # allowOutOfOrderDelivery; or the seed's rule, kept as it was
        select = self.selector.select
        stranded: dict[int, dict[Position, Consumer]] = {}
        self.stranded = stranded
        for holder in self.consumers:
            for pos, pa in (holder.pending_acks or {}).items():
                if select(pa.key_hash) is not holder:
                    stranded.setdefault(pa.key_hash, {})[pos] = holder

    def _held_elsewhere(self, consumer: Consumer, key_hash: int) -> bool:
        """Whether a consumer other than ``consumer`` still holds a stranded entry of the hash."""
        entries = self.stranded.get(key_hash)
        if entries is None:
            return False
        blocked = False
        for pos, holder in list(entries.items()):
            pending = holder.pending_acks
            if pending is None or pos not in pending or holder not in self.consumers:
                del entries[pos]
            elif holder is not consumer:
                blocked = True
                break
        if not entries:
            del self.stranded[key_hash]
        return blocked

    def redeliver(self, consumer: Consumer, positions: Sequence[Any] | None) -> None:
        """Nack / ack timeout: what comes back may go at once, so the replay is not skipped."""
        self._stuck_on_replays = False
        super().redeliver(consumer, positions)

    def reset(self) -> None:
        """The cursor moved by hand: what was sent will be sent again."""
        super().reset()
        self.last_sent = None
        self.individually_sent.clear()
        self.stranded.clear()
        self._stuck_on_replays = False

    def on_mark_delete_moved(self, mark_delete: Position) -> None:
        """Recently joined consumers whose join position is acked become ordinary."""
        if self._prune_recently_joined():
            self.read_more()
        super().on_mark_delete_moved(mark_delete)

    def _prune_recently_joined(self) -> bool:
        joined = self.recently_joined
        if not joined:
            return False
        mdp = self.cursor.mark_delete_position
        pruned = False
        for c, pos in list(joined.items()):
            if pos > mdp:
                break  # join positions grow with later joins
            del joined[c]
            pruned = True
        return pruned

    # --- reads -------------------------------------------------------------------------------
    def normal_read_allowed(self) -> bool:
        """Pulsar's hasConsumersNeededNormalRead: someone not recently joined has permits."""
        joined = self.recently_joined or {}
        return any(self.permits_of(c) > 0 and c not in joined for c in self.consumers)

    def max_normal_read(self, n: int) -> int:
        """No look-ahead limit in classic mode."""
        return n

    def replay_candidates(self, max_entries: int) -> list[Position]:
        """Skip the replay once after a round that sent nothing, to read ahead; else the queued
        entries whose consumer has room.

        Pulsar's classic dispatcher replays the queue's head whatever its consumers: with the
        head's consumer busy, each round sent nothing, and at the tail of the topic the read
        ahead found nothing either, so an entry queued behind for a consumer with permits
        waited for the next publish (Key_Shared row 10 stalled this way with key-based
        batches). Taking only entries whose consumer has room keeps each key's order: a key's
        entries all go to one consumer, so all of them are skipped or none."""
        if self._stuck_on_replays:
            self._stuck_on_replays = False
            if self.read_ahead_would_read():
                return []
        if self.recently_joined:
            self._prune_recently_joined()
        return super().replay_candidates(max_entries)

    def replay_held_back(self, c: Consumer, pos: Position, key_hash: int) -> bool:
        """What the restriction would discard (Pulsar's filterOutEntriesWillBeDiscarded).

        Replaying it sends nothing, and while it is a candidate no normal read starts: the
        consumers not recently joined got nothing more (Key_Shared row 22)."""
        max_pos = self._restricted_to(c, replay=True)
        if max_pos is not None and pos > max_pos:
            return True
        return bool(self.stranded) and self._held_elsewhere(c, key_hash)

    def _restricted_to(self, c: Consumer, *, replay: bool) -> Position | None:
        """The last position a recently joined ``c`` may take now (None: not restricted); a
        replay is held to the earliest join position of all, as Pulsar's classic dispatcher."""
        joined = self.recently_joined
        max_pos = joined.get(c) if joined else None
        if max_pos is not None and replay and joined:
            max_pos = min(max_pos, next(iter(joined.values())))
        return max_pos

    def filter_and_group(
        self, entries: list[Entry], read_type: str, metas: list[EntryMeta]
    ) -> list[DispatchGroup]:
        """Group by key owner; each group cut to what the restriction rule allows."""
        selector = self.selector
        by_consumer: dict[Consumer, list[tuple[Entry, int]]] = {}
        for entry, meta in zip(entries, metas, strict=True):
            h = self.slot_of(meta)
            c = selector.select(h)
            if c is None:
                self.add_to_replay(entry.position, h)
                continue
            by_consumer.setdefault(c, []).append((entry, h))
        meta_of = dict(zip((e.position for e in entries), metas, strict=True))
        out: list[DispatchGroup] = []
        for c, items in by_consumer.items():
            chosen, rest = self._choose(c, items, read_type)
            for e, h in rest:
                self.add_to_replay(e.position, h)
            if chosen:
                out.append((c, chosen, [meta_of[e.position] for e in chosen], None))
                self._mark_sent(chosen)
        if not out and not self.recently_joined and read_type == REPLAY:
            # Pulsar sets this after any empty round; after a normal read whose entries were
            # all held behind queued ones of their key, that skipped the very replay that
            # would free them, round after round, until the whole backlog sat in the queue.
            self._stuck_on_replays = True
        return out

    def _choose(
        self, c: Consumer, items: list[tuple[Entry, int]], read_type: str
    ) -> tuple[list[Entry], list[tuple[Entry, int]]]:
        """What ``c`` gets of ``items`` (its entries, in order) now, and what waits."""
        m = min(len(items), self.permits_of(c))
        if m <= 0:
            return [], items
        if (
            self.orders_by_key()
            and read_type == NORMAL
            and any(self.replay.contains_hash(h) for _, h in items)
        ):
            return [], items
        if self.recently_joined:
            self._prune_recently_joined()
        max_pos = self._restricted_to(c, replay=read_type == REPLAY)
        if max_pos is None and not self.stranded:
            return [e for e, _ in items[:m]], items[m:]
        # Restricted: only entries at or before the join position (all sent before it joined,
        # so these are redeliveries). Beyond the seed, for everyone: no entry of a hash while
        # an entry of it is still with a consumer the hash moved away from (else c gets a
        # key's later entry while an earlier one is still being processed, and the earlier
        # one after it if that consumer leaves).
        chosen: list[Entry] = []
        rest: list[tuple[Entry, int]] = []
        for e, h in items:
            if (
                len(chosen) < m
                and (max_pos is None or e.position <= max_pos)
                and not self._held_elsewhere(c, h)
            ):
                chosen.append(e)
            else:
                rest.append((e, h))
        return chosen, rest

    # --- stats ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Classic subscription stats (seed pip-282)."""
        st = super().stats()
        after: dict[str, str] = {}
        for c, pos in (self.recently_joined or {}).items():
            key = f"consumerName={c.consumer_name}, consumerId={c.consumer_id}"
            if c.transport.address:
                key += f", address={c.transport.address}"
            after[key] = str(pos)
        st["consumersAfterMarkDeletePosition"] = after
        st["lastSentPosition"] = str(self.last_sent) if self.last_sent is not None else ""
        st["individuallySentPositions"] = self.individually_sent.to_pulsar_string()
        return st

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        """Classic consumer stats: the join position."""
        st = super().consumer_stats(consumer)
        joined = self.joined_at.get(consumer)
        st["lastSentPositionWhenJoining"] = str(joined) if joined is not None else ""
        return st
