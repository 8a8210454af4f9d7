"""Sticky-key hashing for the Key_Shared selectors, in the names the selectors use.

One implementation serves the whole broker: this module only names, for the selectors, what
``keyshared.protocol.hashing`` computes (Pulsar's Murmur3 hash and its slot formulas).
"""

from __future__ import annotations

from keyshared.protocol.hashing import (
    DEFAULT_RANGE_SIZE,
    STICKY_KEY_HASH_NOT_SET,
    slot_of_hash,
)
from keyshared.protocol.hashing import consistent_slot as consistent_hashing_slot
from keyshared.protocol.hashing import sticky_key_hash as pulsar_hash

__all__ = [
    "CONSISTENT_HASHING_RANGE_END",
    "DEFAULT_RANGE_SIZE",
    "STICKY_KEY_HASH_NOT_SET",
    "consistent_hashing_slot",
    "hash_range_slot",
    "make_sticky_key_hash",
    "pulsar_hash",
]

CONSISTENT_HASHING_RANGE_END = DEFAULT_RANGE_SIZE - 1
"""The consistent-hashing ring covers slots ``[1, 65535]`` (PIP-379)."""


def make_sticky_key_hash(key: bytes, range_start: int, range_end: int) -> int:
    """Pulsar's ``StickyKeyConsumerSelectorUtils.makeStickyKeyHash`` over ``[start, end]``."""
    return slot_of_hash(pulsar_hash(key), range_start, range_end)


def hash_range_slot(key: bytes, range_size: int = DEFAULT_RANGE_SIZE) -> int:
    """Slot used by the auto-split and sticky selectors: ``pulsar_hash % range_size``, 0 -> 1."""
    return pulsar_hash(key) % range_size or 1
