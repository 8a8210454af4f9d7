"""Key_Shared hashing: sticky key bytes to a non-negative hash, and the hash to a selector slot.

Pulsar hashes with MurmurHash3 x86_32, seed 0, masked to a non-negative Java int
(``Murmur3_32Hash.makeHash``), then maps the hash into the selector's slot range with
``StickyKeyConsumerSelectorUtils.makeStickyKeyHash``, where slot 0 is reserved for "not set".
"""

from __future__ import annotations

import mmh3

DEFAULT_RANGE_SIZE = 65536
"""Size of the hash-range space of Key_Shared selectors (``2 << 15``)."""

STICKY_KEY_HASH_NOT_SET = 0
"""Slot value meaning "no hash computed"; real slots are never 0."""

CONSISTENT_HASHING_RANGE = (1, DEFAULT_RANGE_SIZE - 1)
"""Slot range of the consistent-hashing selector (PIP-379 dispatcher): 1..65535."""

HASH_RANGE_SELECTOR_RANGE = (0, DEFAULT_RANGE_SIZE - 1)
"""Slot range of the auto-split and sticky (exclusive) hash-range selectors: 0..65535."""

CLASSIC_CONSISTENT_HASHING_RANGE = (1, 2**31 - 2)
"""Slot range of consistent hashing inside the classic dispatcher."""


def murmur3_32(key: bytes) -> int:
    """MurmurHash3 x86_32 of ``key`` with seed 0, as an unsigned 32-bit value."""
    result: int = mmh3.hash(key, 0, signed=False)
    return result


def sticky_key_hash(key: bytes) -> int:
    """Pulsar's hash of a sticky key: Murmur3 x86_32 (seed 0) ``& 0x7FFFFFFF``."""
    result: int = mmh3.hash(key, 0, signed=False)
    return result & 0x7FFFFFFF


def slot_of_hash(key_hash: int, start: int, end: int) -> int:
    """Map a sticky key hash into the inclusive slot range ``[start, end]``; 0 becomes 1."""
    slot = key_hash % (end - start + 1) + start
    return 1 if slot == STICKY_KEY_HASH_NOT_SET else slot


def range_slot(key: bytes) -> int:
    """Slot of ``key`` for the auto-split / sticky hash-range selectors: ``hash % 65536`` (0→1)."""
    slot = sticky_key_hash(key) % DEFAULT_RANGE_SIZE
    return 1 if slot == STICKY_KEY_HASH_NOT_SET else slot


def consistent_slot(key: bytes) -> int:
    """Slot of ``key`` for the consistent-hashing selector: ``hash % 65535 + 1``."""
    return sticky_key_hash(key) % (DEFAULT_RANGE_SIZE - 1) + 1


def classic_consistent_slot(key: bytes) -> int:
    """Slot of ``key`` for consistent hashing inside the classic dispatcher."""
    start, end = CLASSIC_CONSISTENT_HASHING_RANGE
    return slot_of_hash(sticky_key_hash(key), start, end)
