"""What the non-persistent dispatcher tests share: a recording transport, consumers, metadata."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType
from keyshared.broker.entry_meta import EntryMeta
from keyshared.broker.nonpersistent_topic import MESSAGE_ID
from keyshared.protocol import sticky_key_hash
from keyshared.storage.entry import Entry


class FakeTransport:
    """Records what the dispatcher writes; writability can be switched off."""

    def __init__(self) -> None:
        self.sent: list[tuple[Consumer, bytes]] = []
        # The messages as written, for what the bytes do not show (redelivery count, ack set).
        self.outbound: list[OutboundMessage] = []
        self.active: list[tuple[str, bool]] = []
        self.writable = True

    def send_messages(self, consumer: Consumer, messages: Sequence[OutboundMessage]) -> None:
        self.sent += [(consumer, m.entry.data) for m in messages]
        self.outbound += messages

    def close_consumer(self, consumer: Consumer) -> None:
        pass

    def active_consumer_change(self, consumer: Consumer, is_active: bool) -> None:
        self.active.append((consumer.consumer_name, is_active))

    def is_writable(self) -> bool:
        return self.writable

    address = "/127.0.0.1:1"
    client_version = "test"


def consumer(
    name: str,
    permits: int,
    transport: FakeTransport,
    *,
    sub_type: SubType = SubType.Shared,
    priority: int = 0,
    mode: str | None = "AUTO_SPLIT",
    ranges: list[tuple[int, int]] | None = None,
) -> Consumer:
    """A consumer with ``permits``; a Key_Shared one has ``mode``'s settings (none if None)."""
    ksm = (
        KeySharedMeta(mode=mode, ranges=ranges or [])
        if sub_type is SubType.Key_Shared and mode is not None
        else None
    )
    c = Consumer(
        consumer_id=hash(name) & 0xFFFF,
        consumer_name=name,
        # The stats read the subscription's dispatcher; a bare consumer has none.
        subscription=SimpleNamespace(dispatcher=None),  # type: ignore[arg-type]
        sub_type=sub_type,
        transport=transport,
        priority_level=priority,
        key_shared_meta=ksm,
    )
    c.add_permits(permits)
    return c


def meta(key: str = "k", messages: int = 1) -> EntryMeta:
    """An entry's metadata: ``messages`` messages of ``key``."""
    return EntryMeta(messages, sticky_key_hash(key.encode()), 0, 0, 0)


ENTRY = Entry(MESSAGE_ID, b"x", 0)
