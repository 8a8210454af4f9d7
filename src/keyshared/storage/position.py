"""Positions of entries in a managed ledger."""

from __future__ import annotations

from typing import NamedTuple


class Position(NamedTuple):
    """An entry's address: ``(ledger_id, entry_id)``.

    A NamedTuple rather than a dataclass: positions are compared and hashed on every dispatch
    and ack, and tuple comparison runs in C.
    """

    ledger_id: int
    entry_id: int

    def next(self) -> Position:
        """The position right after this one in the same ledger."""
        return Position(self.ledger_id, self.entry_id + 1)

    def __str__(self) -> str:
        return f"{self.ledger_id}:{self.entry_id}"


# Pulsar's "earliest" sentinel (-1:-1) sorts before every real position.
EARLIEST = Position(-1, -1)
# Pulsar's "latest" sentinel (Long.MAX_VALUE:Long.MAX_VALUE) sorts after every real position.
LATEST = Position(2**63 - 1, 2**63 - 1)
