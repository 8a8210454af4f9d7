"""A consumer attached to a subscription: permits, pending acks, counters."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Protocol

from keyshared.broker.rates import RateMeter
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.subscription import Subscription


class SubType(IntEnum):
    """Subscription types, with the wire values of ``CommandSubscribe.SubType``."""

    Exclusive = 0
    Shared = 1
    Failover = 2
    Key_Shared = 3


@dataclass(slots=True)
class OutboundMessage:
    """An entry on its way to one consumer."""

    entry: Entry
    redelivery_count: int
    ack_set: list[int] | None


class ConsumerTransport(Protocol):
    """What the broker needs from the connection a consumer lives on."""

    def send_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        """Write MESSAGE frames for ``messages``."""

    def close_consumer(self, consumer: Consumer) -> None:
        """Tell the client the broker closed this consumer (it will re-subscribe)."""

    def active_consumer_change(self, consumer: Consumer, is_active: bool) -> None:
        """Tell a Failover consumer whether it is the active one."""

    def is_writable(self) -> bool:
        """False while the connection's write buffer is above its high-water mark."""

    @property
    def address(self) -> str:
        """The client's address, for stats."""

    @property
    def client_version(self) -> str:
        """The client's version string, for stats."""


@dataclass(slots=True)
class KeySharedMeta:
    """What a Key_Shared consumer asked for in SUBSCRIBE."""

    mode: str = "AUTO_SPLIT"  # or "STICKY"
    ranges: list[tuple[int, int]] = field(default_factory=list)
    allow_out_of_order_delivery: bool = False


@dataclass(slots=True)
class PendingAck:
    """An entry sent to a consumer and not yet acked by it."""

    batch_size: int
    key_hash: int
    # Batch indexes acked one by one so far (batch-index acks), already released from unacked.
    acked_indexes: int = 0


class Consumer:
    """One consumer session (a ``(connection, consumer_id)`` pair) on a subscription."""

    def __init__(
        self,
        *,
        consumer_id: int,
        consumer_name: str,
        subscription: Subscription,
        sub_type: SubType,
        transport: ConsumerTransport,
        priority_level: int = 0,
        metadata: dict[str, str] | None = None,
        key_shared_meta: KeySharedMeta | None = None,
        max_unacked_messages: int = 0,
        track_pending_acks: bool = False,
        read_compacted: bool = False,
    ) -> None:
        self.consumer_id = consumer_id
        self.consumer_name = consumer_name
        self.subscription = subscription
        self.sub_type = sub_type
        self.transport = transport
        self.priority_level = priority_level
        self.metadata = metadata or {}
        self.key_shared_meta = key_shared_meta
        self.max_unacked_messages = max_unacked_messages
        # Reads the compacted view up to the compaction horizon (Exclusive/Failover only).
        self.read_compacted = read_compacted
        # Only Shared and Key_Shared track which entries each consumer holds (as Pulsar does).
        self.pending_acks: dict[Position, PendingAck] | None = {} if track_pending_acks else None
        self.available_permits = 0
        self.unacked_messages = 0
        self.blocked_on_unacked = False
        self.permits_while_blocked = 0
        self.avg_messages_per_entry = 1.0
        self.connected_since = time.time()
        self.closed = False
        # counters for stats
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.msg_redeliver_counter = 0
        self.msg_ack_counter = 0
        self.rates = RateMeter(4)
        self.last_acked_timestamp = 0
        self.last_consumed_timestamp = 0
        self.last_consumed_flow_timestamp = 0

    def __repr__(self) -> str:
        return f"Consumer({self.consumer_name!r}, id={self.consumer_id})"

    # --- permits ------------------------------------------------------------------------
    def add_permits(self, n: int) -> int:
        """Account a FLOW of ``n`` permits; returns how many the dispatcher may use now."""
        self.last_consumed_flow_timestamp = int(time.time() * 1000)
        if self.blocked_on_unacked:
            self.permits_while_blocked += n
            return 0
        self.available_permits += n
        return n

    def dispatch_permits(self) -> int:
        """Entries the dispatcher may send to this consumer now (Pulsar's getAvailablePermits)."""
        if self.closed or self.blocked_on_unacked or not self.transport.is_writable():
            return 0
        permits = self.available_permits
        if permits <= 0:
            return 0
        if self.max_unacked_messages > 0:
            room = self.max_unacked_messages - self.unacked_messages
            if room <= 0:
                return 0
            return min(permits, math.ceil(room / max(self.avg_messages_per_entry, 1.0)))
        return permits

    # --- sending ------------------------------------------------------------------------
    def record_sent(self, entries: int, messages: int, acked_indexes: int, nbytes: int) -> None:
        """Account entries written to this consumer."""
        self.available_permits -= messages - acked_indexes
        if self.pending_acks is not None:
            # Only Shared and Key_Shared count unacked messages per consumer, as in Pulsar.
            self.unacked_messages += messages - acked_indexes
        if entries:
            self.avg_messages_per_entry = 0.9 * self.avg_messages_per_entry + 0.1 * (
                messages / entries
            )
        self.msg_out_counter += messages - acked_indexes
        self.bytes_out_counter += nbytes
        self.last_consumed_timestamp = int(time.time() * 1000)
        if 0 < self.max_unacked_messages <= self.unacked_messages:
            self.blocked_on_unacked = True

    def record_acked(self, messages: int) -> int:
        """Account ``messages`` acked; returns permits released by unblocking (0 if none)."""
        self.msg_ack_counter += messages
        self.last_acked_timestamp = int(time.time() * 1000)
        return self.release_unacked(messages)

    def release_unacked(self, messages: int) -> int:
        """``messages`` are no longer held (acked or taken back for redelivery).

        Returns the permits released if this unblocks a consumer that hit
        maxUnackedMessagesPerConsumer (Pulsar unblocks at half the limit), else 0.
        """
        self.unacked_messages = max(0, self.unacked_messages - messages)
        return self._maybe_unblock()

    def set_max_unacked(self, limit: int) -> int:
        """A new ``maxUnackedMessagesPerConsumer`` (a policy changed); returns the permits
        released if this unblocks the consumer, else 0.

        A limit the consumer is already at blocks it at once (Pulsar waits for the next send;
        the stats then said "not blocked" while nothing was sent to it)."""
        self.max_unacked_messages = limit
        if not self.blocked_on_unacked and 0 < limit <= self.unacked_messages:
            self.blocked_on_unacked = True
        return self._maybe_unblock()

    def _maybe_unblock(self) -> int:
        limit = self.max_unacked_messages
        if self.blocked_on_unacked and (limit <= 0 or self.unacked_messages <= limit // 2):
            self.blocked_on_unacked = False
            released = self.permits_while_blocked
            self.permits_while_blocked = 0
            self.available_permits += released
            return max(released, 1)
        return 0
