"""A producer session and what it needs from its connection (shared by persistent and
non-persistent topics)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from keyshared.broker.errors import ServerError
from keyshared.broker.producer_access import AccessMode
from keyshared.broker.rates import RateMeter
from keyshared.storage.position import Position

if TYPE_CHECKING:
    from keyshared.broker.nonpersistent_topic import NonPersistentTopic
    from keyshared.broker.topic import PersistentTopic

PublishCallback = Callable[[Position | None, BaseException | None], None]


class ProducerTransport(Protocol):
    """What the broker needs from the connection a producer lives on."""

    def send_receipt(
        self, producer: Producer, sequence_id: int, highest_sequence_id: int, position: Position
    ) -> None:
        """Confirm a stored message."""

    def send_error(
        self, producer: Producer, sequence_id: int, code: ServerError, message: str
    ) -> None:
        """Report a failed send."""

    def close_producer(self, producer: Producer) -> None:
        """Tell the client the broker closed this producer (it will reconnect)."""

    @property
    def address(self) -> str:
        """The client's address, for stats."""

    @property
    def client_version(self) -> str:
        """The client's version, for stats."""


@dataclass(slots=True)
class Producer:
    """A producer session on a topic."""

    producer_id: int
    producer_name: str
    topic: PersistentTopic | NonPersistentTopic
    transport: ProducerTransport
    user_provided_name: bool = False
    epoch: int = 0
    access_mode: AccessMode = AccessMode.Shared
    # The topic epoch the client presented (it reconnects with the one it was given), then
    # the one it was given in PRODUCER_SUCCESS.
    topic_epoch: int | None = None
    # False while queued for exclusive access (WaitForExclusive).
    ready: bool = True
    metadata: dict[str, str] = field(default_factory=dict)
    # The schema version it publishes with (8 bytes, as on the wire), None without a schema.
    schema_version: bytes | None = None
    connected_since: float = field(default_factory=time.time)
    msg_in_counter: int = 0
    bytes_in_counter: int = 0
    closed: bool = False
    rates: RateMeter = field(default_factory=RateMeter)
