"""Sticky-key hashing for the Key_Shared selectors: Pulsar's Murmur3 hash and its slot formulas.

A private copy of what ``keyshared.protocol.hashing`` provides, kept here so the selectors do not
depend on a module still being written; the two must stay identical (the unit tests pin both to
the same vectors).
"""

from __future__ import annotations

import mmh3

_murmur3 = mmh3.hash  # bound once: this runs for every dispatched entry

STICKY_KEY_HASH_NOT_SET = 0
"""Pulsar reserves sticky hash 0 for "not computed"; no slot formula ever yields it."""

DEFAULT_RANGE_SIZE = 65536
"""Pulsar's ``StickyKeyConsumerSelector.DEFAULT_RANGE_SIZE`` (``2 << 15``)."""

CONSISTENT_HASHING_RANGE_END = DEFAULT_RANGE_SIZE - 1
"""The consistent-hashing ring covers slots ``[1, 65535]`` (PIP-379)."""


def pulsar_hash(key: bytes) -> int:
    """Pulsar's ``Murmur3_32Hash.makeHash``: MurmurHash3 x86_32, seed 0, masked to 31 bits."""
    value: int = _murmur3(key, 0, False)
    return value & 0x7FFFFFFF


def make_sticky_key_hash(key: bytes, range_start: int, range_end: int) -> int:
    """Pulsar's ``StickyKeyConsumerSelectorUtils.makeStickyKeyHash`` over ``[start, end]``.

    The result is never 0: 0 means "not set" to the dispatcher, so it is folded onto 1.
    """
    value = pulsar_hash(key) % (range_end - range_start + 1) + range_start
    return 1 if value == STICKY_KEY_HASH_NOT_SET else value


def consistent_hashing_slot(key: bytes) -> int:
    """Slot used by the consistent-hashing selector: ``pulsar_hash % 65535 + 1`` (1..65535)."""
    value: int = _murmur3(key, 0, False)
    return (value & 0x7FFFFFFF) % CONSISTENT_HASHING_RANGE_END + 1


def hash_range_slot(key: bytes, range_size: int = DEFAULT_RANGE_SIZE) -> int:
    """Slot used by the auto-split and sticky selectors: ``pulsar_hash % 65536``, 0 folded to 1."""
    value: int = (_murmur3(key, 0, False) & 0x7FFFFFFF) % range_size
    return value or 1
