"""Types shared by the Key_Shared selectors: the consumer shape, ranges, the assignment error."""

from __future__ import annotations

from typing import Protocol, TypeVar

HashRange = tuple[int, int]
"""An inclusive range of sticky key hashes ``(start, end)``, as Pulsar's ``Range``."""


class NamedConsumer(Protocol):
    """What a selector needs of a consumer: a name (hashed onto the ring) and identity.

    Selectors compare consumers by identity and use them as dict keys, so the consumer class must
    keep object identity semantics for ``==``/``hash`` (plain classes and ``@dataclass(eq=False)``
    do); two consumers with the same name are two different consumers.
    """

    @property
    def consumer_name(self) -> str:
        """The name the client gave the consumer (not unique)."""
        ...


C = TypeVar("C", bound=NamedConsumer)


class ConsumerAssignError(Exception):
    """A consumer cannot be given hash ranges (Pulsar's ``ConsumerAssignException``).

    ``conflicting_consumer`` is set when the refusal is a STICKY range conflict with a live
    consumer, so the caller can check that consumer's connection and retry (as Pulsar does with
    ``checkConnectionLiveness``).
    """

    def __init__(self, message: str, conflicting_consumer: object | None = None) -> None:
        super().__init__(message)
        self.conflicting_consumer = conflicting_consumer
