"""Non-persistent topics: ``non-persistent://tenant/ns/topic``, in memory only.

As Pulsar's ``NonPersistentTopic``: nothing is stored; a published message is confirmed at once
with the message id ``0:0`` (the id Pulsar returns for every non-persistent send) and handed to
each subscription's dispatcher right away, which sends it to a consumer with permits or drops it
(``dispatch.nonpersistent``). Subscriptions have no cursor and no backlog: acks, redelivery
requests and SEEK are accepted and do nothing (Pulsar's ``NonPersistentSubscription``); reading
the last message id is refused. A restart keeps nothing but partitioned-topic metadata.

A loaded topic is forgotten as soon as it has neither producers nor subscriptions (Pulsar waits
``brokerDeleteInactiveTopicsMaxInactiveDurationSeconds`` before its garbage collector does so).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from keyshared.broker import limits
from keyshared.broker.consumer import Consumer, SubType
from keyshared.broker.dispatch.nonpersistent import NonPersistentDispatcher, new_dispatcher
from keyshared.broker.entry_meta import parse_entry_meta
from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.producer_access import Admission, WaitCallback
from keyshared.broker.rates import RateMeter
from keyshared.broker.sub_types import check_enabled
from keyshared.broker.topic import Producer, PublishCallback
from keyshared.broker.topic_common import (
    ProducerRegistry,
    attach_consumer,
    consumer_stats,
    disconnect_all,
    drop_if_unused,
    producer_stats,
    unsubscribe,
)
from keyshared.broker.topic_name import TopicName, check_partition_index
from keyshared.crc import crc32c
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.service import BrokerService
    from keyshared.broker.subscription import AckItem, Subscription

log = logging.getLogger(__name__)

NON_PERSISTENT = "non-persistent"
MESSAGE_ID = Position(0, 0)
"""What Pulsar's NonPersistentTopic confirms every send with, and the id of every message."""


class NonPersistentSubscription:
    """Pulsar's NonPersistentSubscription: consumers and a dispatcher, nothing else.

    Consumers hold it as their ``subscription``; it answers the calls the connection makes on a
    subscription (remove_consumer, acknowledge, redeliver_unacknowledged, dispatcher, topic).
    """

    def __init__(self, topic: NonPersistentTopic, name: str, *, durable: bool) -> None:
        self.topic = topic
        self.name = name
        self.durable = durable
        self.sub_type: SubType | None = None
        self.dispatcher: NonPersistentDispatcher | None = None
        self.closed = False
        # Counters of consumers that left, so the subscription's totals never go back.
        self.msg_out_from_removed = 0
        self.bytes_out_from_removed = 0

    @property
    def consumers(self) -> list[Consumer]:
        """The attached consumers."""
        return self.dispatcher.consumers if self.dispatcher is not None else []

    def add_consumer(self, consumer: Consumer) -> None:
        """Attach ``consumer``: a new dispatcher when none has consumers and the type or
        Key_Shared mode differs; with consumers attached, another type is refused."""
        if consumer.read_compacted:
            raise BrokerError(
                ServerError.NotAllowedError, "readCompacted only valid on persistent topics"
            )
        if self.closed:
            raise BrokerError(ServerError.ServiceNotReady, "Subscription is being closed")
        disp = self.dispatcher
        if disp is not None and disp.consumers:
            if consumer.sub_type is not disp.sub_type:
                raise BrokerError(
                    ServerError.ConsumerBusy,
                    f"Subscription {self.name} is of type {disp.sub_type.name}, cannot attach a "
                    f"{consumer.sub_type.name} consumer",
                )
        elif disp is None or not disp.fits(consumer):
            if disp is not None:
                disp.close()
            disp = new_dispatcher(
                consumer.sub_type,
                consumer,
                partition_index=self.topic.name.partition_index,
                config=self.topic.service.config,
            )
            self.dispatcher = disp
        disp.add_consumer(consumer)
        self.sub_type = disp.sub_type

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; a non-durable subscription (a reader) goes with its last one."""
        if consumer.closed:
            return
        consumer.closed = True
        if self.dispatcher is not None and consumer in self.dispatcher.consumers:
            self.dispatcher.remove_consumer(consumer)
            self.msg_out_from_removed += consumer.msg_out_counter
            self.bytes_out_from_removed += consumer.bytes_out_counter
        drop_if_unused(self.topic, self)

    def disconnect_all(self) -> None:
        """Close every consumer (the clients reconnect)."""
        disconnect_all(self)

    def acknowledge(self, consumer: Consumer, cumulative: bool, items: Sequence[AckItem]) -> None:
        """Accepted and ignored: nothing is kept to acknowledge."""

    def redeliver_unacknowledged(
        self, consumer: Consumer, positions: Sequence[Position] | None
    ) -> None:
        """Accepted and ignored: what was sent is gone."""

    def kick_dispatch(self) -> None:
        """Nothing waits to be dispatched."""

    def stats(self) -> dict[str, Any]:
        """NonPersistentSubscriptionStats with Pulsar's field names."""
        consumers = [np_consumer_stats(c) for c in self.consumers]
        disp = self.dispatcher
        st: dict[str, Any] = {
            "msgRateOut": sum(c["msgRateOut"] for c in consumers),
            "msgThroughputOut": sum(c["msgThroughputOut"] for c in consumers),
            "bytesOutCounter": self.bytes_out_from_removed
            + sum(c["bytesOutCounter"] for c in consumers),
            "msgOutCounter": self.msg_out_from_removed + sum(c["msgOutCounter"] for c in consumers),
            "msgRateRedeliver": 0.0,
            "messageAckRate": 0.0,
            "msgBacklog": 0,
            "backlogSize": 0,
            "msgBacklogNoDelayed": 0,
            "blockedSubscriptionOnUnackedMsgs": False,
            "msgDelayed": 0,
            "unackedMessages": 0,
            "type": self.sub_type.name if self.sub_type is not None else "None",
            "msgDropRate": disp.msg_drop_rate() if disp is not None else 0.0,
            "lastExpireTimestamp": 0,
            "lastConsumedFlowTimestamp": max(
                (c.last_consumed_flow_timestamp for c in self.consumers), default=0
            ),
            "lastConsumedTimestamp": max(
                (c.last_consumed_timestamp for c in self.consumers), default=0
            ),
            "lastAckedTimestamp": 0,
            "lastMarkDeleteAdvancedTimestamp": 0,
            "consumers": consumers,
            "isDurable": self.durable,
            "isReplicated": False,
            "nonContiguousDeletedMessagesRanges": 0,
            "nonContiguousDeletedMessagesRangesSerializedSize": 0,
            "subscriptionProperties": {},
        }
        if disp is not None:
            st.update(disp.stats())
        return st


class NonPersistentTopic:
    """Pulsar's NonPersistentTopic: producers, subscriptions, counters; no storage."""

    def __init__(self, name: TopicName, service: BrokerService, registry: NonPersistentTopics):
        self.name = name
        self.service = service
        self._registry = registry
        self.producers = ProducerRegistry()
        self.subscriptions: dict[str, NonPersistentSubscription] = {}
        self.msg_in_counter = 0
        self.bytes_in_counter = 0
        self.entries_added = 0
        self.rates_in = RateMeter()
        self.msg_out_from_removed = 0
        self.bytes_out_from_removed = 0
        self.closed = False
        # Never waiting for anything (a persistent topic waits for deduplication state).
        self.ready: asyncio.Future[None] | None = None

    # --- producers ---------------------------------------------------------------------------
    def add_producer(
        self, producer: Producer, on_wait_done: WaitCallback | None = None
    ) -> Admission:
        """Register ``producer`` (names are unique per topic) under its access mode (the
        topic epoch lives in memory, as Pulsar's NonPersistentTopic keeps it)."""
        if self.closed:
            raise BrokerError(ServerError.ServiceNotReady, f"Topic {self.name} is being closed")
        limits.check_producers(self.service.policies, self.name, len(self.producers))
        return self.producers.add(producer, on_wait_done)

    def remove_producer(self, producer: Producer) -> None:
        """Forget ``producer``."""
        self.producers.remove(producer)
        self._forget_if_idle()

    def last_sequence_id(self, producer_name: str) -> int:
        """No deduplication on non-persistent topics."""
        return -1

    def publish(
        self,
        producer: Producer,
        sequence_id: int,
        highest_sequence_id: int,
        data: bytes,
        on_done: PublishCallback,
        checksum: int | None = None,
    ) -> None:
        """Confirm at once, then offer the entry to every subscription (Pulsar's order);
        ``checksum`` as in ``PersistentTopic.publish``."""
        if self.closed:
            raise BrokerError(ServerError.ServiceNotReady, f"Topic {self.name} is being closed")
        meta = parse_entry_meta(data)
        self.msg_in_counter += meta.num_messages
        self.bytes_in_counter += len(data)
        self.entries_added += 1
        producer.msg_in_counter += meta.num_messages
        producer.bytes_in_counter += len(data)
        on_done(MESSAGE_ID, None)
        if not self.subscriptions:
            return
        entry = Entry(MESSAGE_ID, data, crc32c(data) if checksum is None else checksum)
        for sub in list(self.subscriptions.values()):
            if sub.dispatcher is not None:
                sub.dispatcher.dispatch(entry, meta)

    # --- consumers ---------------------------------------------------------------------------
    def enabled_sub_types(self) -> frozenset[str]:
        """Subscription types this topic accepts (topic over namespace over broker setting)."""
        return self.service.policies.enabled_sub_types(self.name)

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
    ) -> Consumer:
        """Create or join ``subscription``: consumers always start at the next message (nothing
        is stored: ``start_message_id`` and ``rollback_to`` have nothing to name)."""
        if self.closed:
            raise BrokerError(ServerError.ServiceNotReady, f"Topic {self.name} is being closed")
        check_enabled(self.name.full, sub_type, self.enabled_sub_types())
        limits.check_subscribe(self.service.policies, self.name, self.subscriptions, subscription)
        sub = self.subscriptions.get(subscription)
        if sub is None:
            sub = NonPersistentSubscription(self, subscription, durable=durable)
            self.subscriptions[subscription] = sub
        # The consumer holds this subscription where a persistent one would be: the connection
        # uses only what both have, and asks the topic's domain before using a cursor.
        return attach_consumer(self, sub, consumer_factory(cast("Subscription", sub)))

    def remove_subscription(self, name: str) -> None:
        """Drop a subscription, keeping what it sent in the topic's totals."""
        sub = self.subscriptions.pop(name, None)
        if sub is None:
            return
        st = sub.stats()
        self.msg_out_from_removed += st["msgOutCounter"]
        self.bytes_out_from_removed += st["bytesOutCounter"]
        sub.closed = True
        if sub.dispatcher is not None:
            sub.dispatcher.close()
        self._forget_if_idle()

    def unsubscribe(self, name: str, consumer: Consumer | None = None) -> None:
        """Delete ``name``; refused while other consumers are attached."""
        unsubscribe(self, name, consumer)

    # --- lifecycle -----------------------------------------------------------------------------
    def _forget_if_idle(self) -> None:
        if not self.producers and not self.subscriptions:
            self._registry.forget(self)

    async def close(self) -> None:
        """Disconnect every producer and consumer and forget the topic."""
        self.closed = True
        self.producers.close_all()
        for sub in list(self.subscriptions.values()):
            sub.disconnect_all()
            self.remove_subscription(sub.name)
        self._registry.forget(self)

    # --- stats ---------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """NonPersistentTopicStats with Pulsar's field names."""
        publishers = [np_producer_stats(p) for p in self.producers.values()]
        subs = {name: s.stats() for name, s in self.subscriptions.items()}
        rate_in, throughput_in = self.rates_in.rates(self.msg_in_counter, self.bytes_in_counter)
        return {
            "msgRateIn": rate_in,
            "msgThroughputIn": throughput_in,
            "msgRateOut": sum(s["msgRateOut"] for s in subs.values()),
            "msgThroughputOut": sum(s["msgThroughputOut"] for s in subs.values()),
            "bytesInCounter": self.bytes_in_counter,
            "msgInCounter": self.msg_in_counter,
            "bytesOutCounter": self.bytes_out_from_removed
            + sum(s["bytesOutCounter"] for s in subs.values()),
            "msgOutCounter": self.msg_out_from_removed
            + sum(s["msgOutCounter"] for s in subs.values()),
            "averageMsgSize": self.bytes_in_counter / self.msg_in_counter
            if self.msg_in_counter
            else 0.0,
            "msgChunkPublished": False,
            "storageSize": 0,
            "backlogSize": 0,
            "publishRateLimitedTimes": self.service.rate_limits.publish_limited_times(self.name),
            "offloadedStorageSize": 0,
            "waitingPublishers": self.producers.access.waiting_count,
            "topicEpoch": self.producers.access.topic_epoch,
            "publishers": publishers,
            "subscriptions": subs,
            "replication": {},
            "deduplicationStatus": "Disabled",
            # NonPersistentTopicStats: what the subscriptions (and publishers) dropped.
            "msgDropRate": sum(s["msgDropRate"] for s in subs.values())
            + sum(p["msgDropRate"] for p in publishers),
            "nonContiguousDeletedMessagesRanges": 0,
            "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        }

    def internal_stats(self) -> dict[str, Any]:
        """What Pulsar's NonPersistentTopic.getInternalStats fills: the entries added and an
        empty cursor entry per subscription."""
        return {
            "entriesAddedCounter": self.entries_added,
            "numberOfEntries": 0,
            "totalSize": 0,
            "ledgers": [],
            "cursors": {name: {} for name in sorted(self.subscriptions)},
        }


class NonPersistentTopics:
    """The loaded non-persistent topics of a broker."""

    def __init__(self, service: BrokerService) -> None:
        self.service = service
        self.topics: dict[str, NonPersistentTopic] = {}

    def get(self, name: TopicName, *, create: bool) -> NonPersistentTopic:
        """The loaded topic ``name``, created on first use if allowed."""
        topic = self.topics.get(name.full)
        if topic is not None:
            return topic
        service = self.service
        if name.partition_index >= 0:
            check_partition_index(name, service.partitions_of(name.partitioned_base))
        if service.partitions_of(name) > 0:
            raise BrokerError(
                ServerError.NotAllowedError, f"{name} is a partitioned topic: use its partitions"
            )
        base = name.partitioned_base
        is_partition = 0 <= name.partition_index < service.partitions_of(base)
        if not is_partition and not (create and service.config.allowAutoTopicCreation):
            raise BrokerError(ServerError.TopicNotFound, f"Topic {name} does not exist")
        if not service.namespace_exists(name.namespace_name):
            raise BrokerError(
                ServerError.TopicNotFound, f"Namespace {name.namespace_name} does not exist"
            )
        topic = NonPersistentTopic(name, service, self)
        self.topics[name.full] = topic
        return topic

    def loaded(self, name: TopicName) -> NonPersistentTopic | None:
        """The topic if it is loaded."""
        return self.topics.get(name.full)

    def forget(self, topic: NonPersistentTopic) -> None:
        """Unload ``topic`` (idle, closed or deleted)."""
        if self.topics.get(topic.name.full) is topic:
            del self.topics[topic.name.full]

    def names(self, namespace: str) -> list[str]:
        """Loaded topics (and partitions) of ``tenant/namespace``, sorted."""
        prefix = f"{NON_PERSISTENT}://{namespace}/"
        return sorted(n for n in self.topics if n.startswith(prefix))

    def list_partitioned(self, namespace: str) -> list[str]:
        """Partitioned non-persistent topics of ``tenant/namespace`` (their metadata)."""
        from keyshared.broker.service import PARTITIONS_PREFIX

        prefix = f"{PARTITIONS_PREFIX}{NON_PERSISTENT}://{namespace}/"
        keys = self.service.storage.metadata.list_keys(prefix)
        return sorted(k[len(PARTITIONS_PREFIX) :] for k in keys)

    async def close(self) -> None:
        """Close every topic (broker shutdown)."""
        for topic in list(self.topics.values()):
            await topic.close()


def np_producer_stats(p: Producer) -> dict[str, Any]:
    """NonPersistentPublisherStats: PublisherStats and ``msgDropRate``, always 0 here (Pulsar
    drops a publisher's messages only past maxConcurrentNonPersistentMessagePerConnection, a
    limit this broker does not have)."""
    return {**producer_stats(p), "msgDropRate": 0.0}


_NOTHING_ACKED: dict[str, Any] = {
    "msgRateRedeliver": 0.0,
    "messageAckRate": 0.0,
    "unackedMessages": 0,
    "blockedConsumerOnUnackedMsgs": False,
    "lastAckedTimestamp": 0,
}


def np_consumer_stats(c: Consumer) -> dict[str, Any]:
    """ConsumerStats of a non-persistent consumer: nothing is acked, redelivered or held."""
    return consumer_stats(c) | _NOTHING_ACKED
