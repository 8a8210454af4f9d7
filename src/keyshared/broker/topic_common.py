"""What persistent and non-persistent topics share: the producer registry, attaching and
unsubscribing consumers, and the stats of one producer or consumer.

Small pieces each topic holds or calls (``broker.topic``, ``broker.nonpersistent_topic``); the
topics themselves stay separate classes, as Pulsar's PersistentTopic and NonPersistentTopic are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from keyshared.broker.errors import BrokerError, ServerError
from keyshared.broker.producer_access import AccessMode, Admission, ProducerAccess, WaitCallback

if TYPE_CHECKING:
    from keyshared.broker.consumer import Consumer
    from keyshared.broker.topic import Producer


class ProducerRegistry(Mapping[str, "Producer"]):
    """A topic's producers by name: a name is held by one live producer at a time; access
    modes and the topic epoch as ``access`` rules them."""

    __slots__ = ("_by_name", "_on_added", "_on_removed", "access")

    def __init__(
        self,
        access: ProducerAccess | None = None,
        *,
        on_added: Callable[[str], None] | None = None,
        on_removed: Callable[[str], None] | None = None,
    ) -> None:
        self._by_name: dict[str, Producer] = {}
        self.access = access if access is not None else ProducerAccess()
        # Told of each name registered / unregistered (deduplication's connected names),
        # including the producers fenced out or admitted after waiting.
        self._on_added = on_added
        self._on_removed = on_removed

    def __getitem__(self, name: str) -> Producer:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def add(self, producer: Producer, on_wait_done: WaitCallback | None = None) -> Admission:
        """Register ``producer`` under its access mode, or queue it (WaitForExclusive: it is
        registered when admitted, and ``on_wait_done`` told). ProducerBusy while a live one
        has its name (unless the new one fences it out); ProducerBusy / ProducerFenced as the
        access modes refuse it."""
        existing = self._by_name.get(producer.producer_name)
        if (
            existing is not None
            and not existing.closed
            and producer.access_mode is not AccessMode.ExclusiveWithFencing
        ):
            raise BrokerError(
                ServerError.ProducerBusy,
                f"Producer with name '{producer.producer_name}' is already connected to topic",
            )
        admission = self.access.admit(
            producer, list(self._by_name.values()), self._fence, on_wait_done or _ignore_wait
        )
        if not admission.queued:
            producer.topic_epoch = admission.topic_epoch
            self._register(producer)
        return admission

    def _register(self, producer: Producer) -> None:
        self._by_name[producer.producer_name] = producer
        if self._on_added is not None:
            self._on_added(producer.producer_name)

    def _fence(self, producer: Producer) -> None:
        """Pushed out by an ExclusiveWithFencing producer: its client is told (it reconnects
        with its old topic epoch and is refused as fenced)."""
        producer.transport.close_producer(producer)
        self.remove(producer)

    def remove(self, producer: Producer) -> None:
        """Close ``producer`` and forget it (unless its name went to a newer one); a producer
        waiting for exclusive access may take the topic now."""
        self._remove(producer, notify=True)

    def _remove(self, producer: Producer, *, notify: bool) -> None:
        producer.closed = True
        if self._by_name.get(producer.producer_name) is producer:
            del self._by_name[producer.producer_name]
            if notify and self._on_removed is not None:
                self._on_removed(producer.producer_name)
        promoted = self.access.release(producer, self._by_name.values())
        if promoted is not None:
            self._register(promoted)

    def close_all(self) -> None:
        """Tell every producer's client the broker closed it (it reconnects), and forget it."""
        for p in self.access.take_waiting():
            p.closed = True
            p.transport.close_producer(p)
        for p in list(self._by_name.values()):
            p.transport.close_producer(p)
            # The topic is closing: nothing to tell (deduplication snapshots as it stands).
            self._remove(p, notify=False)


def _ignore_wait(epoch: int | None, error: BrokerError | None) -> None:
    """No one to tell: a caller that cannot queue never passes WaitForExclusive."""


# --- subscriptions ---------------------------------------------------------------------------
class _Subscription(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def durable(self) -> bool: ...

    @property
    def consumers(self) -> list[Consumer]: ...

    def add_consumer(self, consumer: Consumer) -> None: ...

    def remove_consumer(self, consumer: Consumer) -> None: ...


class _Topic(Protocol):
    @property
    def subscriptions(self) -> Mapping[str, _Subscription]: ...

    def remove_subscription(self, name: str) -> None: ...


def attach_consumer(topic: _Topic, sub: _Subscription, consumer: Consumer) -> Consumer:
    """Attach ``consumer`` to ``sub``; when refused, a non-durable subscription left without
    consumers goes (a durable one stays, as Pulsar keeps it)."""
    try:
        sub.add_consumer(consumer)
    except BrokerError:
        drop_if_unused(topic, sub)
        raise
    return consumer


def drop_if_unused(topic: _Topic, sub: _Subscription) -> None:
    """A non-durable subscription (a reader's) goes with its last consumer."""
    if not sub.consumers and not sub.durable:
        topic.remove_subscription(sub.name)


def disconnect_all(sub: _Subscription) -> None:
    """Close every consumer of ``sub`` on its connection (the clients re-subscribe) and
    detach it."""
    for c in list(sub.consumers):
        c.transport.close_consumer(c)
        sub.remove_consumer(c)


def unsubscribe(topic: _Topic, name: str, consumer: Consumer | None) -> None:
    """Delete subscription ``name`` (for ``consumer``, its own one, or an admin with None);
    refused while other consumers are attached."""
    sub = topic.subscriptions.get(name)
    if sub is None:
        raise BrokerError(ServerError.SubscriptionNotFound, f"Subscription {name} not found")
    if [c for c in sub.consumers if c is not consumer]:
        raise BrokerError(
            ServerError.UnknownError,
            f"Subscription {name} has active consumers: unsubscribe refused",
        )
    if consumer is not None:
        sub.remove_consumer(consumer)
    topic.remove_subscription(name)


# --- stats -----------------------------------------------------------------------------------
def iso_time(ts: float) -> str:
    """A UNIX time as Pulsar's stats write it (``2024-01-02T03:04:05.678Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def producer_stats(p: Producer) -> dict[str, Any]:
    """PublisherStats with Pulsar's field names."""
    rate_in, throughput_in = p.rates.rates(p.msg_in_counter, p.bytes_in_counter)
    return {
        "accessMode": p.access_mode.name,
        "msgRateIn": rate_in,
        "msgThroughputIn": throughput_in,
        "averageMsgSize": p.bytes_in_counter / p.msg_in_counter if p.msg_in_counter else 0.0,
        "chunkedMessageRate": 0.0,
        "producerId": p.producer_id,
        "supportsPartialProducer": False,
        "producerName": p.producer_name,
        "address": p.transport.address,
        "connectedSince": iso_time(p.connected_since),
        "clientVersion": p.transport.client_version,
        "metadata": dict(p.metadata),
        "msgInCounter": p.msg_in_counter,
        "bytesInCounter": p.bytes_in_counter,
    }


def consumer_stats(c: Consumer) -> dict[str, Any]:
    """ConsumerStats with Pulsar's field names, with what the subscription's dispatcher adds."""
    rate_out, throughput_out, rate_redeliver, rate_ack = c.rates.rates(
        c.msg_out_counter, c.bytes_out_counter, c.msg_redeliver_counter, c.msg_ack_counter
    )
    st: dict[str, Any] = {
        "msgRateOut": rate_out,
        "msgThroughputOut": throughput_out,
        "bytesOutCounter": c.bytes_out_counter,
        "msgOutCounter": c.msg_out_counter,
        "msgRateRedeliver": rate_redeliver,
        "messageAckRate": rate_ack,
        "chunkedMessageRate": 0.0,
        "consumerName": c.consumer_name,
        "availablePermits": c.available_permits,
        "unackedMessages": c.unacked_messages,
        "avgMessagesPerEntry": round(c.avg_messages_per_entry),
        "blockedConsumerOnUnackedMsgs": c.blocked_on_unacked,
        "lastAckedTimestamp": c.last_acked_timestamp,
        "lastConsumedTimestamp": c.last_consumed_timestamp,
        "lastConsumedFlowTimestamp": c.last_consumed_flow_timestamp,
        "metadata": dict(c.metadata),
        "address": c.transport.address,
        "connectedSince": iso_time(c.connected_since),
        "clientVersion": c.transport.client_version,
    }
    disp = c.subscription.dispatcher
    if disp is not None:
        st.update(disp.consumer_stats(c))
    return st
