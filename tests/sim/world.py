"""The real subscription, dispatcher and cursor, wired to fakes of what lies around them.

* :class:`SimTopic` stands in for ``PersistentTopic`` with just what ``Subscription`` and the
  dispatchers use; entry metadata is parsed by the real ``EntryMetaCache`` from real payload
  sections, so the sticky-key resolution and hashing are the broker's own.
* :class:`SimTransport` is a consumer's connection: what the broker sends is handed straight to
  the simulator's oracle.
* :func:`payload` builds stored entries as producers send them: metadataSize + MessageMetadata
  (+ a batch body), keyed by ``partition_key`` or ``ordering_key``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from keyshared.broker.consumer import Consumer, OutboundMessage
from keyshared.broker.entry_meta import EntryMeta, EntryMetaCache, parse_entry_meta
from keyshared.config import BrokerConfig
from keyshared.protocol import encode_batch, encode_payload_section, pb
from keyshared.storage.entry import Entry
from keyshared.storage.position import Position


class InjectedReadError(OSError):
    """A storage read failure the simulator injected on purpose."""


@dataclass(frozen=True, slots=True)
class SimTopicName:
    """The part of ``TopicName`` the broker reads here."""

    full: str = "persistent://public/default/sim"
    partition_index: int = -1

    def __str__(self) -> str:
        return self.full


class SimTopic:
    """What a subscription needs from its topic, and nothing else."""

    def __init__(self, config: BrokerConfig) -> None:
        self.name = SimTopicName()
        self.config = config
        self.meta_cache = EntryMetaCache()
        self.msg_out_counter = 0
        self.bytes_out_counter = 0
        self.read_errors: list[BaseException] = []
        self.progress_calls = 0
        self.removed_subscriptions: list[str] = []

    def policy(self, key: str) -> Any:
        """A topic policy: here always the broker setting of the same name."""
        return getattr(self.config, key)

    def entry_meta(self, entry: Entry) -> EntryMeta:
        """Parsed (and cached) metadata of ``entry``."""
        return self.meta_cache.get(entry.position, entry.data)

    def known_batch_size(self, pos: Position) -> int | None:
        """The batch size of ``pos`` if its metadata was parsed already."""
        return self.meta_cache.batch_size(pos)

    def record_out(self, messages: int, nbytes: int) -> None:
        """Dispatch accounting."""
        self.msg_out_counter += messages
        self.bytes_out_counter += nbytes

    def log_read_error(self, exc: BaseException) -> None:
        """A read failed; the simulator checks it was one it injected."""
        self.read_errors.append(exc)

    def on_subscription_progress(self) -> None:
        """The mark-delete position moved."""
        self.progress_calls += 1

    def remove_subscription(self, name: str) -> None:
        """Only non-durable subscriptions are removed; the simulation's is durable."""
        self.removed_subscriptions.append(name)

    def consumer_stats(self, consumer: Consumer) -> dict[str, Any]:
        """Enough for ``Subscription.stats()`` to run."""
        return {"consumerName": consumer.consumer_name}


class SimTransport:
    """A consumer's connection, handing everything the broker sends to callbacks."""

    def __init__(
        self,
        on_messages: Callable[[Consumer, Sequence[OutboundMessage]], None],
        on_close: Callable[[Consumer], None],
    ) -> None:
        self._on_messages = on_messages
        self._on_close = on_close
        self.writable = True

    def send_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        """MESSAGE frames: straight to the client model."""
        self._on_messages(consumer, messages)

    def close_consumer(self, consumer: Consumer) -> None:
        """The broker closed the consumer (seek / reset-cursor)."""
        self._on_close(consumer)

    def active_consumer_change(self, consumer: Consumer, is_active: bool) -> None:
        """Failover only; never called for Key_Shared."""

    def is_writable(self) -> bool:
        """False while the simulated write buffer is full."""
        return self.writable

    @property
    def address(self) -> str:
        """For stats."""
        return "sim:0"

    @property
    def client_version(self) -> str:
        """For stats."""
        return "sim"


@lru_cache(maxsize=4096)
def payload(key: str, num_messages: int, ordering_key: bool) -> bytes:
    """A stored entry for ``key``: one message, or a batch of ``num_messages`` with the key.

    Entries of one key and size share their bytes: the simulator tells entries apart by
    position, as the broker does.
    """
    md = pb.MessageMetadata(producer_name="sim", sequence_id=0, publish_time=1)
    if ordering_key:
        md.ordering_key = key.encode()
    else:
        md.partition_key = key
    if num_messages == 1:
        return encode_payload_section(md, b"v")
    md.num_messages_in_batch = num_messages
    singles = []
    for i in range(num_messages):
        single = pb.SingleMessageMetadata(payload_size=0)
        if ordering_key:
            single.ordering_key = key.encode()
        else:
            single.partition_key = key
        singles.append((single, str(i).encode()))
    return encode_payload_section(md, encode_batch(singles))


@lru_cache(maxsize=4096)
def payload_meta(key: str, num_messages: int, ordering_key: bool) -> EntryMeta:
    """:func:`payload`'s metadata, parsed by the broker's own parser."""
    return parse_entry_meta(payload(key, num_messages, ordering_key))
