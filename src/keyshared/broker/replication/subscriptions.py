"""Replicated subscriptions of one persistent topic (Pulsar's ``ReplicatedSubscriptionsController``).

A durable subscription is *replicated* once a consumer subscribes with
``replicate_subscription_state`` (or the admin sets it): its mark-delete position then follows
to the other clusters, so a consumer failing over there starts where it stopped (at or before
the first message it had not acknowledged, never after one). Only the mark-delete position
follows, never individual acks, as in Pulsar.

The mechanism is Pulsar's marker entries, written into the topic and replicated like data
(:mod:`keyshared.protocol.markers`, the state machine in :mod:`.snapshots`):

* every ``replicatedSubscriptionsSnapshotFrequencyMillis``, while the topic has a replicated
  subscription, new data and every replicator connected, a snapshot request is written here;
* a request arriving from another cluster is answered with a response carrying its position
  in this copy (replicated back to the asker only); a response arriving here feeds the pending
  snapshot, and a finished snapshot is stored here only;
* dispatch hides every marker from consumers and acknowledges it for the subscription
  (``Subscription.hide_markers``, on every read, readers included); a replicated
  subscription keeps the snapshots its dispatcher reads in its cache (:meth:`cache_snapshots`);
* when a replicated subscription's mark-delete position passes a cached snapshot, an update
  naming each remote cluster's position is written and replicated; the remote moves its copy
  of the subscription there (creating it if absent), only ever forward.

Markers from other clusters are acted upon once they are durable here. Unlike Pulsar, a cluster
answers requests whether or not it holds a replicated subscription itself (Pulsar's remote stays
silent until one exists there), so the first failover works without subscribing on both sides
first. Resent markers are harmless (markers bypass deduplication: they all carry sequence id 0):
a second response is ignored, a second update moves nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from keyshared.broker.dispatch.base import TimerHandle
from keyshared.broker.entry_meta import EntryMeta
from keyshared.broker.replication.decisions import is_replicator_producer
from keyshared.broker.replication.snapshots import (
    SnapshotCache,
    SnapshotCoordinator,
    position_for,
)
from keyshared.protocol import ProtocolError, split_payload
from keyshared.protocol.markers import (
    ClusterPosition,
    Marker,
    MarkerError,
    MarkerType,
    Snapshot,
    SnapshotRequest,
    SnapshotResponse,
    SubscriptionUpdate,
    decode_marker,
    marker_entry,
    marker_type_of,
)
from keyshared.storage.entry import Entry
from keyshared.storage.errors import StorageError
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.subscription import Subscription
    from keyshared.broker.topic import PersistentTopic, Producer, PublishCallback

log = logging.getLogger(__name__)

REPLICATED_FIELD = "replicated"
"""The flag in a durable subscription's stored record (Pulsar keeps it as the cursor property
``pulsar.replicated.subscription``)."""


class ReplicatedSubscriptions:
    """The replicated-subscription markers of one persistent topic (module docstring)."""

    def __init__(self, topic: PersistentTopic) -> None:
        self.topic = topic
        cfg = topic.config
        self.enabled = bool(cfg.enableReplicatedSubscriptions)
        self.local = cfg.clusterName
        self.frequency = max(cfg.replicatedSubscriptionsSnapshotFrequencyMillis, 10) / 1000.0
        self.max_cached = cfg.replicatedSubscriptionsSnapshotMaxCachedPerSubscription
        self.coordinator = SnapshotCoordinator(
            self.local,
            cfg.replicatedSubscriptionsSnapshotTimeoutSeconds * 1000,
            lambda: uuid.uuid4().hex,
        )
        self._caches: weakref.WeakKeyDictionary[Subscription, SnapshotCache] = (
            weakref.WeakKeyDictionary()
        )
        self._timer: TimerHandle | None = None
        self.markers_written = 0
        self.updates_applied = 0
        for sub in topic.subscriptions.values():
            if sub.durable and self._stored_flag(sub.name):
                sub.replicated = self.enabled
        self.ensure_timer()

    # --- the replicated flag -----------------------------------------------------------------
    def _record_key(self, name: str) -> str:
        return self.topic._sub_key(name)  # the topic's own layout of subscription records

    def _stored_flag(self, name: str) -> bool:
        raw = self.topic.service.storage.metadata.get(self._record_key(name))
        try:
            record = json.loads(raw) if raw else {}
        except ValueError:
            return False
        return isinstance(record, dict) and bool(record.get(REPLICATED_FIELD))

    def set_replicated(self, sub: Subscription, replicated: bool) -> bool:
        """Turn ``sub``'s replication on or off (stored with it); False when refused (a
        non-durable subscription, or the feature disabled on this broker)."""
        if replicated and (not self.enabled or not sub.durable):
            return False
        if sub.replicated == replicated:
            return True
        sub.replicated = replicated
        if sub.durable:
            record = {REPLICATED_FIELD: True} if replicated else {}
            self.topic.service.storage.metadata.put(
                self._record_key(sub.name), json.dumps(record).encode()
            )
        if not replicated:
            self._caches.pop(sub, None)
        self.ensure_timer()
        return True

    # --- snapshots -----------------------------------------------------------------------------
    def ensure_timer(self) -> None:
        """Run the snapshot timer while the topic has a replicated subscription."""
        if self._timer is not None or not self.enabled or self.topic.closed:
            return
        if not any(s.replicated for s in self.topic.subscriptions.values()):
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # a topic opened outside the loop (tests): started at the next subscribe
        self._timer = self.topic.scheduler.call_later(self.frequency, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.topic.closed:
            return
        replicators = self.topic.replication.replicators
        request = self.coordinator.tick(
            _clock_ms(),
            replicators,
            all(r.connected for r in replicators.values()),
            self.topic.msg_in_counter,
        )
        if request is not None:
            self._write(request)
        self.ensure_timer()

    def _write(self, marker: Marker, replicate_to: Sequence[str] = ()) -> Position | None:
        data = marker_entry(marker, publish_time_ms=_now_ms(), replicate_to=replicate_to)
        topic = self.topic
        try:
            position, fut = topic.ledger.add_entry(data)
        except StorageError as exc:
            log.warning("%s: cannot write %s marker: %s", topic.name, type(marker).__name__, exc)
            return None
        topic.meta_cache.put(position, _marker_meta(marker))
        fut.add_done_callback(_log_failure)
        self.markers_written += 1
        return position

    # --- markers from other clusters -----------------------------------------------------------
    def publish_marker(self, producer: Producer, data: bytes, on_done: PublishCallback) -> None:
        """Store a marker a producer sent (another cluster's replicator), then act on it."""
        topic = self.topic
        try:
            md, payload = split_payload(data)
            position, fut = topic.ledger.add_entry(data)
        except (StorageError, ProtocolError) as exc:
            on_done(None, exc)
            return
        topic.meta_cache.get(position, data)  # cached: dispatch asks every entry's type
        remote = md.replicated_from if md.HasField("replicated_from") else ""
        acted = bool(remote) and remote != self.local
        acted = acted and is_replicator_producer(producer.producer_name)
        marker_type = md.marker_type
        body = bytes(payload)

        def stored(f: asyncio.Future[None]) -> None:
            exc = f.exception() if not f.cancelled() else asyncio.CancelledError()
            on_done(None if exc is not None else position, exc)
            if exc is None and acted:
                self.received(position, marker_type, body, remote)

        fut.add_done_callback(stored)

    def received(self, position: Position, marker_type: int, payload: bytes, remote: str) -> None:
        """Act on a marker from cluster ``remote`` stored here at ``position``."""
        if not self.enabled or self.topic.closed:
            return
        try:
            marker = decode_marker(marker_type, payload)
        except MarkerError as exc:
            log.warning(
                "%s: unreadable marker at %s from %s: %s", self.topic.name, position, remote, exc
            )
            return
        if isinstance(marker, SnapshotRequest):
            reply = SnapshotResponse(
                marker.snapshot_id,
                ClusterPosition(self.local, position.ledger_id, position.entry_id),
            )
            self._write(reply, replicate_to=[marker.source_cluster or remote])
        elif isinstance(marker, SnapshotResponse):
            step = self.coordinator.on_response(
                (position.ledger_id, position.entry_id), marker, _clock_ms()
            )
            if isinstance(step, SnapshotRequest):
                self._write(step)
            elif isinstance(step, Snapshot):
                self._write(step, replicate_to=[self.local])
        elif isinstance(marker, SubscriptionUpdate):
            self._apply_update(marker)

    def _apply_update(self, update: SubscriptionUpdate) -> None:
        at = position_for(update.clusters, self.local)
        if at is None:
            return
        topic = self.topic
        sub = topic.subscriptions.get(update.subscription_name)
        if sub is None:
            log.info(
                "%s: creating replicated subscription %s at %s:%s",
                topic.name,
                update.subscription_name,
                *at,
            )
            sub = topic._create_subscription(update.subscription_name, True, True, None)
        if not sub.durable:
            return
        self.set_replicated(sub, True)
        if sub.apply_replicated_mark_delete(Position(*at)):
            self.updates_applied += 1

    # --- dispatch ------------------------------------------------------------------------------
    def cache_snapshots(self, sub: Subscription, markers: Sequence[Entry]) -> None:
        """The dispatcher of replicated subscription ``sub`` read ``markers``: keep the
        snapshots among them."""
        cache = self._caches.get(sub)
        if cache is None:
            cache = self._caches[sub] = SnapshotCache(self.max_cached)
        marker_type = self.topic.meta_cache.marker_type
        for e in markers:
            if marker_type(e.position, e.data) == MarkerType.REPLICATED_SUBSCRIPTION_SNAPSHOT:
                snapshot = _decode_snapshot(e)
                if snapshot is not None:
                    cache.add(snapshot)

    def mark_delete_moved(self, sub: Subscription, mark_delete: Position) -> None:
        """A replicated subscription's mark-delete position moved: send an update when it
        passed a snapshot."""
        cache = self._caches.get(sub)
        if cache is None or not self.enabled:
            return
        snapshot = cache.advanced((mark_delete.ledger_id, mark_delete.entry_id))
        if snapshot is not None and snapshot.clusters:
            self._write(SubscriptionUpdate(sub.name, snapshot.clusters))

    # --- lifecycle and stats -------------------------------------------------------------------
    def close(self) -> None:
        """Stop the snapshot timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def stats(self) -> dict[str, Any]:
        """Counters for internal stats."""
        c = self.coordinator
        return {
            "pendingSnapshots": len(c.pending),
            "completedSnapshots": c.completed,
            "timedOutSnapshots": c.timed_out,
            "lastCompletedSnapshotId": c.last_completed_id,
            "markersWritten": self.markers_written,
            "updatesApplied": self.updates_applied,
        }


async def last_dispatchable(topic: PersistentTopic, last: Position) -> tuple[Position, int]:
    """The last entry at or before ``last`` that is not a marker, with its last batch index
    (-1 when not a batch), for GET_LAST_MESSAGE_ID; the position before the first entry when
    there is none. Markers come a few per snapshot interval, so the walk back is short."""
    ledger = topic.ledger
    first = ledger.first_position
    pos = last
    while first is not None and pos >= first and pos.entry_id >= 0:
        entry = await ledger.read_entry(pos)
        if entry is None:
            break
        meta = topic.entry_meta(entry)
        if not meta.marker_type:
            return pos, meta.num_messages - 1 if meta.num_messages > 1 else -1
        pos = ledger.previous_position(pos)
    return pos, -1


def snapshot_gauges(topics: Iterable[PersistentTopic]) -> list[tuple[str, float, str]]:
    """Pulsar's broker-wide replicated-subscription gauges, summed over ``topics``."""
    pending = timed_out = 0
    for t in topics:
        c = t.replicated_subscriptions.coordinator
        pending += len(c.pending)
        timed_out += c.timed_out
    return [
        (
            "pulsar_replicated_subscriptions_pending_snapshots",
            pending,
            "Replicated-subscription snapshots waiting for the other clusters' answers",
        ),
        (
            "pulsar_replicated_subscriptions_timedout_snapshots",
            timed_out,
            "Replicated-subscription snapshots given up after the timeout",
        ),
    ]


def _decode_snapshot(entry: Entry) -> Snapshot | None:
    try:
        md, payload = split_payload(entry.data)
        marker = decode_marker(md.marker_type, payload)
    except (ProtocolError, MarkerError):
        return None
    return marker if isinstance(marker, Snapshot) else None


def _marker_meta(marker: Marker) -> EntryMeta:
    return EntryMeta(1, 0, _now_ms(), 0, 0, int(marker_type_of(marker)))


def _log_failure(f: asyncio.Future[None]) -> None:
    if not f.cancelled() and f.exception() is not None:
        log.warning("marker write failed: %s", f.exception())


def _clock_ms() -> int:
    """Snapshot start times and timeouts: monotonic, so a wall-clock step changes nothing."""
    return int(time.monotonic() * 1000)


def _now_ms() -> int:
    return int(time.time() * 1000)
