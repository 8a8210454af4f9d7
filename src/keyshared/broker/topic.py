"""A persistent topic: its managed ledger, producers and subscriptions, and their stats."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from keyshared.broker import limits
from keyshared.broker.backlog_quota import TopicBacklogQuota
from keyshared.broker.compaction import COMPACTION_SUBSCRIPTION, Compactor
from keyshared.broker.consumer import Consumer, SubType
from keyshared.broker.dedup import Deduplication
from keyshared.broker.dispatch.base import Scheduler
from keyshared.broker.entry_meta import EntryMeta, EntryMetaCache, MetaFields, parse_entry_fields
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.producer_access import Admission, ProducerAccess, WaitCallback
from keyshared.broker.rates import RateMeter
from keyshared.broker.replication import (
    REPLICATOR_PREFIX,
    TopicReplication,
    dedup_producer_name,
)
from keyshared.broker.replication.subscriptions import (
    ReplicatedSubscriptions,
    last_dispatchable,
)
from keyshared.broker.sub_types import check_enabled
from keyshared.broker.subscription import Subscription
from keyshared.broker.topic_common import (
    ProducerRegistry,
    attach_consumer,
    unsubscribe,
)
from keyshared.broker.topic_name import TopicName
from keyshared.broker.topic_producer import Producer, ProducerTransport, PublishCallback
from keyshared.broker.topic_retention import TopicRetention
from keyshared.broker.topic_stats import topic_internal_stats, topic_stats
from keyshared.config import BrokerConfig
from keyshared.storage.cursor import CursorConfig, KeyValueCursorStore, ManagedCursor
from keyshared.storage.entry import Entry
from keyshared.storage.errors import StorageError, is_disk_full
from keyshared.storage.ledger import ManagedLedger
from keyshared.storage.position import EARLIEST, LATEST, Position

if TYPE_CHECKING:
    from keyshared.broker.service import BrokerService

log = logging.getLogger(__name__)

__all__ = [
    "RESET_CURSOR_KEEP_SECONDS",
    "PersistentTopic",
    "Producer",
    "ProducerTransport",
    "PublishCallback",
    "topic_epoch_key",
]


def topic_epoch_key(name: TopicName) -> str:
    """Where a persistent topic's epoch is stored."""
    return f"topic-epoch/{name.full}"


# How long a reader's cursor waits for the reader to re-subscribe after a seek closed it.
RESET_CURSOR_KEEP_SECONDS = 60.0


class PersistentTopic:
    """Pulsar's PersistentTopic, over one managed ledger."""

    def __init__(
        self,
        name: TopicName,
        ledger: ManagedLedger,
        service: BrokerService,
        scheduler: Scheduler,
    ) -> None:
        self.name = name
        self.ledger = ledger
        self.service = service
        self.config: BrokerConfig = service.config
        self.scheduler = scheduler
        self.producers = ProducerRegistry(
            ProducerAccess(self._load_topic_epoch(), self._save_topic_epoch),
            on_added=self._producer_name_added,
            on_removed=self._producer_name_removed,
        )
        self.subscriptions: dict[str, Subscription] = {}
        # Shared by the broker's topics, bounded for the whole broker (see EntryMetaCache).
        self.meta_cache: EntryMetaCache = service.entry_meta_cache
        self.msg_in_counter = 0
        self.rates_in = RateMeter()
        self.bytes_in_counter = 0
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.closed = False
        self._read_errors = 0
        self.cursor_config = CursorConfig.from_broker_config(self.config)
        self.cursor_store = KeyValueCursorStore(service.storage.metadata, f"cursors/{ledger.name}/")
        self.dedup: Deduplication | None = None
        # Sends that arrive while deduplication state is being recovered wait here.
        self._held: list[tuple[Producer, int, int, bytes, PublishCallback]] | None = None
        self.ready: asyncio.Future[None] | None = None
        self.retention = TopicRetention(self)
        self._policy_cache: dict[str, Any] = {}
        self._policy_generation = -1
        # Reader cursors a seek / reset-cursor left without consumers, by subscription name.
        self._reset_cursors: dict[str, ManagedCursor] = {}
        if self.policy("deduplicationEnabled"):
            self._enable_dedup()
        self._restore_subscriptions()
        self.compactor = Compactor(self)
        self.replication = TopicReplication(self)
        self.replicated_subscriptions = ReplicatedSubscriptions(self)
        self.backlog_quota = TopicBacklogQuota(self)
        # When the topic was last seen in use (monotonic), for inactive-topic deletion.
        self.last_active = time.monotonic()

    # --- subscriptions on disk -----------------------------------------------------------
    def _sub_key(self, sub: str) -> str:
        return f"subscriptions/{self.name.full}/{sub}"

    def _restore_subscriptions(self) -> None:
        md = self.service.storage.metadata
        prefix = f"subscriptions/{self.name.full}/"
        for key in md.list_keys(prefix):
            name = key[len(prefix) :]
            self._add_subscription(name, self._open_cursor(name, True, EARLIEST), durable=True)

    def _open_cursor(self, name: str, durable: bool, initial: Position) -> ManagedCursor:
        return ManagedCursor(
            name,
            self.ledger,
            self.cursor_store if durable else None,
            durable=durable,
            initial_position=initial,
            config=self.cursor_config,
            persister=self.service.cursor_persister,
        )

    def _add_subscription(self, name: str, cursor: ManagedCursor, *, durable: bool) -> Subscription:
        sub = Subscription(
            self, name, cursor, durable=durable, config=self.config, scheduler=self.scheduler
        )
        sub.dispatch_throttle = self.service.rate_limits.dispatch_throttle(
            self.name, name, lambda: self.rates_in.rates(self.msg_in_counter, self.bytes_in_counter)
        )
        self.subscriptions[name] = sub
        return sub

    # --- producers -----------------------------------------------------------------------
    def _load_topic_epoch(self) -> int | None:
        raw = self.service.storage.metadata.get(topic_epoch_key(self.name))
        return int(raw) if raw is not None else None

    def _save_topic_epoch(self, epoch: int) -> None:
        # Kept across restarts, as Pulsar keeps it in the managed ledger's properties.
        self.service.storage.metadata.put(topic_epoch_key(self.name), str(epoch).encode())

    def add_producer(
        self, producer: Producer, on_wait_done: WaitCallback | None = None
    ) -> Admission:
        """Register ``producer`` (names are unique per topic) under its access mode; a
        WaitForExclusive one may be queued (see ``ProducerRegistry.add``)."""
        if self.closed:
            raise BrokerError(ServerError.ServiceNotReady, f"Topic {self.name} is being closed")
        limits.check_producers(self.service.policies, self.name, len(self.producers))
        self.backlog_quota.check_producer()
        disk = self.service.storage.disk
        if not disk.writable():
            # Retryable for the clients: they try again with a growing back-off.
            raise BrokerError(
                ServerError.PersistenceError,
                f"Topic {self.name}: the broker's data directory is full"
                f" ({disk.usage * 100:.1f}% used): no new entries until space is freed",
            )
        if self.ledger.backing_off:
            raise BrokerError(
                ServerError.PersistenceError,
                f"Topic {self.name}: a write to its ledger failed; retrying after a back-off",
            )
        return self.producers.add(producer, on_wait_done)

    def _producer_name_added(self, producer_name: str) -> None:
        """A producer with this name is registered (added, or admitted after waiting)."""
        if self.dedup is not None:
            self.dedup.producer_added(producer_name)

    def _producer_name_removed(self, producer_name: str) -> None:
        """The producer with this name left (closed, or fenced out)."""
        if self.dedup is not None:
            self.dedup.producer_removed(producer_name)

    def remove_producer(self, producer: Producer) -> None:
        """Forget ``producer`` (the registry tells deduplication)."""
        self.producers.remove(producer)

    def purge_inactive_producers(self) -> None:
        """Forget the deduplication state of producer names idle too long (Pulsar's
        ``checkMessageDeduplicationInfo``)."""
        if self.dedup is not None and self._held is None:
            self.dedup.purge_inactive()

    # --- policies ------------------------------------------------------------------------
    def policy(self, key: str) -> Any:
        """A policy's value for this topic: topic over namespace over broker setting."""
        store = self.service.policies
        if store.generation != self._policy_generation:
            self._policy_cache.clear()
            self._policy_generation = store.generation
        cache = self._policy_cache
        if key not in cache:
            cache[key] = store.effective(self.name, key)
        return cache[key]

    def enabled_sub_types(self) -> frozenset[str]:
        """Subscription types this topic accepts (topic over namespace over broker)."""
        return self.service.policies.enabled_sub_types(self.name)

    def on_policies_changed(self) -> None:
        """A policy changed: apply it to this loaded topic, and let every dispatcher look
        again (e.g. a pause lifted). Retention and TTL are read where they are used."""
        self._apply_dedup_policy()
        self.replication.update()
        for sub in self.subscriptions.values():
            sub.apply_unacked_limits()  # kicks its dispatcher too

    def _apply_dedup_policy(self) -> None:
        """Switch deduplication on or off on the live topic, as Pulsar does without a reload.

        On: its state is recovered from the last snapshot and the entries after it while new
        sends wait (a send already handed to storage before this is not recorded if recovery
        read past it). Off: the state is snapshotted first, so switching it on again resumes
        from there. A change during recovery is applied once recovery is over.
        """
        if self.closed:
            return
        if self._held is not None:
            if self.ready is not None:
                self.ready.add_done_callback(lambda _: self._apply_dedup_policy())
            return
        enabled = bool(self.policy("deduplicationEnabled"))
        if enabled and self.dedup is None:
            self._enable_dedup()
        elif not enabled and self.dedup is not None:
            self.dedup.snapshot()
            self.dedup = None

    # --- deduplication -------------------------------------------------------------------
    def _enable_dedup(self) -> None:
        cfg = self.config
        self.dedup = Deduplication(
            self.name.full,
            self.ledger,
            self.service.storage.metadata,
            inactivity_timeout=cfg.brokerDeduplicationProducerInactivityTimeoutMinutes * 60.0,
            max_producers=cfg.brokerDeduplicationMaxNumberOfProducers,
        )
        for name in self.producers:
            self.dedup.producer_added(name)
        self._held = []
        self.ready = asyncio.ensure_future(self._recover_dedup())

    async def _recover_dedup(self) -> None:
        assert self.dedup is not None
        try:
            await self.dedup.recover()
        finally:
            held, self._held = self._held or [], None
            for args in held:
                self.publish(*args)

    def last_sequence_id(self, producer_name: str) -> int:
        """The last sequence id stored for ``producer_name`` (-1 without deduplication)."""
        return self.dedup.last_sequence_id(producer_name) if self.dedup is not None else -1

    def publish(
        self,
        producer: Producer,
        sequence_id: int,
        highest_sequence_id: int,
        data: bytes,
        on_done: PublishCallback,
        checksum: int | None = None,
    ) -> None:
        """Store one entry; ``on_done`` runs once it is durable (or failed). ``checksum``: the
        CRC32C of ``data`` when the SEND carried it (verified), so it is not computed again."""
        if self._held is not None:
            self._held.append((producer, sequence_id, highest_sequence_id, data, on_done))
            return
        meta = parse_entry_fields(data)
        if meta[5]:  # marker_type
            # Another cluster's replicator forwarding a marker: never deduplicated (markers
            # all carry sequence id 0, as Pulsar's), acted upon once stored.
            self.replicated_subscriptions.publish_marker(producer, data, on_done)
            return
        dedup = self.dedup
        if dedup is None:

            def stored(exc: BaseException | None) -> None:
                # Called by the journal once the entry is durable (or failed), in append order.
                if exc is None:
                    on_done(position, None)
                    return
                self._close_producer_on_write_failure(producer, exc)
                on_done(None, exc)

            try:
                position = self.ledger.append(data, stored, checksum)
            except StorageError as exc:
                self._refused(producer, exc, on_done)
                return
            self._count_in(producer, meta, position, len(data))
            return

        def answered(pos: Position | None, exc: BaseException | None) -> None:
            if exc is not None:
                self._close_producer_on_write_failure(producer, exc)
            on_done(pos, exc)

        try:
            # A remote cluster's replicator is deduplicated by the original producer's name.
            name = dedup_producer_name(producer.producer_name, data)
            at = dedup.publish(name, data, self.ledger.add_entry, answered)
        except StorageError as exc:
            # The send was only classified: nothing to undo.
            self._refused(producer, exc, on_done)
            return
        if at is not None:
            self._count_in(producer, meta, at, len(data))

    def _count_in(
        self, producer: Producer, meta: MetaFields, position: Position, size: int
    ) -> None:
        self.meta_cache.put_fields(position, meta)
        num_messages = meta[0]
        self.msg_in_counter += num_messages
        self.bytes_in_counter += size
        producer.msg_in_counter += num_messages
        producer.bytes_in_counter += size

    def _refused(self, producer: Producer, exc: StorageError, on_done: PublishCallback) -> None:
        """The ledger refused the entry (a full disk, or a ledger that cannot be created and is
        backing off): nothing was stored."""
        self._close_producer_on_write_failure(producer, exc)
        on_done(None, exc)

    def _close_producer_on_write_failure(self, producer: Producer, exc: BaseException) -> None:
        """Close ``producer`` (not its connection) when its sends cannot be stored.

        The official clients close the whole connection, consumers included, on a SEND_ERROR
        other than ChecksumError, then reconnect and resend at once: a retry storm on a full or
        failing disk. Closed, the producer reconnects with its client's growing back-off, its
        creation is refused (PersistenceError) while the disk is full or the ledger backs off
        after a failed write, and its pending sends are resent once writes work again, or fail
        with its send timeout. Sends already in flight for it get no answer: its client resends
        them. Receipts of earlier sends were written before.
        """
        if producer.closed:
            return
        why = "the data directory is full" if is_disk_full(exc) else f"a write failed: {exc}"
        log.warning("%s: closing producer %s: %s", self.name, producer.producer_name, why)
        self.remove_producer(producer)
        producer.transport.close_producer(producer)

    # --- consumers -----------------------------------------------------------------------
    def subscribe(
        self,
        consumer_factory: Callable[[Subscription], Consumer],
        *,
        subscription: str,
        sub_type: SubType,
        durable: bool,
        initial_position_earliest: bool,
        start_message_id: Position | None,
        rollback_to: Position | None = None,
        replicate_subscription_state: bool = False,
    ) -> Consumer:
        """Create or join ``subscription`` and attach a new consumer built by the factory.

        ``rollback_to``: where a new reader subscription starts instead, for a SUBSCRIBE with
        ``start_message_rollback_duration_sec`` (Pulsar resets the new cursor there before
        attaching the consumer)."""
        if self.closed:
            raise BrokerError(ServerError.ServiceNotReady, f"Topic {self.name} is being closed")
        check_enabled(self.name.full, sub_type, self.enabled_sub_types())
        if subscription.startswith(REPLICATOR_PREFIX):
            # The replicators' cursors bear these names (Pulsar refuses them too).
            raise BrokerError(
                ServerError.NotAllowedError,
                "Subscription with reserved subscription name attempted",
            )
        limits.check_subscribe(self.service.policies, self.name, self.subscriptions, subscription)
        sub = self.subscriptions.get(subscription)
        if sub is None:
            sub = self._create_subscription(
                subscription, durable, initial_position_earliest, start_message_id
            )
            if rollback_to is not None and not durable:
                sub.cursor.reset_cursor(rollback_to)
        consumer = attach_consumer(self, sub, consumer_factory(sub))
        if replicate_subscription_state:
            # As Pulsar: a subscribe only turns replication on, never off.
            self.replicated_subscriptions.set_replicated(sub, True)
        return consumer

    def _create_subscription(
        self,
        name: str,
        durable: bool,
        earliest: bool,
        start: Position | None,
    ) -> Subscription:
        if durable:
            initial = EARLIEST if earliest else LATEST
            cursor = self._open_cursor(name, True, initial)
            self.service.storage.metadata.put(self._sub_key(name), b"{}")
        else:
            parked = self._reset_cursors.pop(name, None)
            if parked is not None and not parked.closed:
                # The reader re-subscribing after a seek: its cursor is where the seek put it,
                # whatever start its SUBSCRIBE names (none after a seek by time).
                cursor = parked
            else:
                if start is None:
                    start = EARLIEST if earliest else LATEST
                cursor = self._open_cursor(name, False, start)
        return self._add_subscription(name, cursor, durable=durable)

    def park_reset_cursor(self, sub: Subscription) -> None:
        """A seek closed the last consumer of reader subscription ``sub``: drop the
        subscription but keep its cursor for the reader's re-subscribe (Pulsar's
        ``removeConsumer(consumer, isResetCursor)``). A cursor no reader takes back within
        ``RESET_CURSOR_KEEP_SECONDS`` is closed."""
        name = sub.name
        if self.subscriptions.get(name) is not sub:
            return
        del self.subscriptions[name]
        sub.closed = True
        if sub.dispatcher is not None:
            sub.dispatcher.close()
        cursor = sub.cursor
        old = self._reset_cursors.get(name)
        if old is not None and old is not cursor:
            old.close()
        self._reset_cursors[name] = cursor

        def expire() -> None:
            if self._reset_cursors.get(name) is cursor:
                del self._reset_cursors[name]
                cursor.close()

        self.scheduler.call_later(RESET_CURSOR_KEEP_SECONDS, expire)

    def remove_subscription(self, name: str) -> None:
        """Drop a subscription that lost its last consumer (readers) or was unsubscribed."""
        sub = self.subscriptions.pop(name, None)
        if sub is None:
            return
        sub.closed = True
        if sub.dispatcher is not None:
            sub.dispatcher.close()
        if sub.durable:
            self.service.storage.metadata.delete(self._sub_key(name))
            sub.cursor.delete()
        else:
            sub.cursor.close()
        if name == COMPACTION_SUBSCRIPTION:
            self.compactor.forget()

    def unsubscribe(self, name: str, consumer: Consumer | None = None) -> None:
        """Delete ``name``; refused while other consumers are attached."""
        unsubscribe(self, name, consumer)

    # --- entries -------------------------------------------------------------------------
    def entry_meta(self, entry: Entry) -> EntryMeta:
        """Parsed metadata of ``entry`` (cached)."""
        return self.meta_cache.get(entry.position, entry.data)

    def known_batch_size(self, pos: Position) -> int | None:
        """The batch size of ``pos`` if its metadata is cached."""
        return self.meta_cache.batch_size(pos)

    def record_out(self, messages: int, nbytes: int) -> None:
        """Account messages dispatched to consumers."""
        self.msg_out_counter += messages
        self.bytes_out_counter += nbytes

    def log_read_error(self, exc: BaseException) -> None:
        """A storage read failed; dispatchers back off and retry."""
        self._read_errors += 1
        log.error("read failed on %s: %r", self.name, exc)

    def on_subscription_progress(self) -> None:
        """A cursor's mark-delete moved (trimming happens on the next periodic pass)."""

    async def trim_consumed_ledgers(self) -> list[int]:
        """Delete closed ledgers every durable cursor has passed, as retention allows (see
        :meth:`TopicRetention.trim_consumed_ledgers`)."""
        return await self.retention.trim_consumed_ledgers()

    async def expire_messages(self) -> None:
        """Message TTL: entries older than ``message_ttl_in_seconds`` are acked on every durable
        subscription."""
        await self.retention.expire_messages()

    async def expire_older_than(self, seconds: int) -> None:
        """Ack, on every durable subscription, the entries published more than ``seconds``
        ago (message TTL, and the backlog quota's eviction by age)."""
        await self.retention.expire_older_than(seconds)

    def snapshot_dedup(self) -> None:
        """Snapshot the deduplication state, if enabled and recovered."""
        if self.dedup is not None and self._held is None:
            self.dedup.snapshot()

    def flush_cursors(self) -> None:
        """Persist changed ack state (rate limited by each cursor)."""
        for sub in self.subscriptions.values():
            if sub.durable and sub.cursor.is_dirty:
                sub.cursor.persist()
        self.replication.flush()

    async def last_message_id(self) -> tuple[Position, int]:
        """The last stored position and its last batch index (-1 when not a batch)."""
        lac = self.ledger.last_add_confirmed
        if lac.entry_id < 0:
            return lac, -1
        entry = await self.ledger.read_entry(lac)
        if entry is None:
            return lac, -1
        meta = self.entry_meta(entry)
        if meta.marker_type:
            # The last entry is a replicated-subscription marker, which no consumer gets: name
            # the last message before it, or a reader's hasMessageAvailable waits forever.
            return await last_dispatchable(self, lac)
        return lac, meta.num_messages - 1 if meta.num_messages > 1 else -1

    async def find_position_by_time(self, timestamp_ms: int) -> Position:
        """The first position whose publish time is at or after ``timestamp_ms``."""
        pos = await self.ledger.find_position(
            lambda e: self.entry_meta(e).publish_time >= timestamp_ms
        )
        if pos is None:
            return self.ledger.next_position(self.ledger.last_add_confirmed)
        return pos

    # --- stats ---------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """TopicStats with Pulsar's field names."""
        return topic_stats(self)

    def internal_stats(self) -> dict[str, Any]:
        """PersistentTopicInternalStats with Pulsar's field names."""
        return topic_internal_stats(self)

    # --- lifecycle -----------------------------------------------------------------------
    async def close(self) -> None:
        """Close producers, consumers and cursors (state persisted)."""
        self.closed = True
        self.producers.close_all()
        for sub in list(self.subscriptions.values()):
            sub.disconnect_all()
            if sub.dispatcher is not None:
                sub.dispatcher.close()
            sub.cursor.close()
        for cursor in self._reset_cursors.values():
            cursor.close()
        self._reset_cursors.clear()
        self.replicated_subscriptions.close()
        await self.replication.close()
        self.snapshot_dedup()
        await self.compactor.close()
        await self.ledger.close()
