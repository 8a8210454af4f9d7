"""Sticky key hashing against the vectors in research/pulsar-semantics.md §1.3-1.4."""

from __future__ import annotations

import pytest

from keyshared.protocol.hashing import (
    CLASSIC_CONSISTENT_HASHING_RANGE,
    DEFAULT_RANGE_SIZE,
    classic_consistent_slot,
    consistent_slot,
    murmur3_32,
    range_slot,
    slot_of_hash,
    sticky_key_hash,
)

# key, murmur3 u32, pulsar hash, consistent-hashing slot, auto-split/sticky slot
VECTORS = [
    (b"Order-3459134", 3112179635, 964695987, 20788, 6067),
    (b"NONE_KEY", 2652225187, 504741539, 56505, 48803),
    (b"key-1", 2561742240, 414258592, 11858, 5536),
    (b"0", 3530670207, 1383186559, 4850, 49279),
    (b"1", 2484513939, 337030291, 49322, 44179),
    (b"", 0, 0, 1, 1),
]


@pytest.mark.parametrize(("key", "murmur", "pulsar", "consistent", "ranged"), VECTORS)
def test_research_vectors(
    key: bytes, murmur: int, pulsar: int, consistent: int, ranged: int
) -> None:
    assert murmur3_32(key) == murmur
    assert sticky_key_hash(key) == pulsar
    assert consistent_slot(key) == consistent
    assert range_slot(key) == ranged
    assert slot_of_hash(pulsar, 1, DEFAULT_RANGE_SIZE - 1) == consistent
    assert slot_of_hash(pulsar, 0, DEFAULT_RANGE_SIZE - 1) == ranged


def _reference_murmur3_32(data: bytes) -> int:
    """Textbook MurmurHash3 x86_32 with seed 0 (research §1.3), to cross-check mmh3."""
    c1, c2, h, n = 0xCC9E2D51, 0x1B873593, 0, len(data)
    for i in range(n // 4):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (k * c1) & 0xFFFFFFFF
        k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
        k = (k * c2) & 0xFFFFFFFF
        h ^= k
        h = ((h << 13) | (h >> 19)) & 0xFFFFFFFF
        h = (h * 5 + 0xE6546B64) & 0xFFFFFFFF
    k = 0
    for i, b in enumerate(data[(n // 4) * 4 :]):
        k ^= b << (8 * i)
    k = (k * c1) & 0xFFFFFFFF
    k = ((k << 15) | (k >> 17)) & 0xFFFFFFFF
    k = (k * c2) & 0xFFFFFFFF
    h ^= k
    h ^= n
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


@pytest.mark.parametrize("length", range(0, 13))
def test_mmh3_matches_the_reference_for_every_tail_length(length: int) -> None:
    key = bytes((i * 37 + 11) & 0xFF for i in range(length))
    assert murmur3_32(key) == _reference_murmur3_32(key)
    assert sticky_key_hash(key) == _reference_murmur3_32(key) & 0x7FFFFFFF


def test_slot_zero_is_reserved() -> None:
    assert slot_of_hash(65536 * 3, 0, 65535) == 1
    assert slot_of_hash(0, 0, 65535) == 1
    assert slot_of_hash(65535, 0, 65535) == 65535
    assert slot_of_hash(65534, 1, 65535) == 65535
    assert slot_of_hash(65535, 1, 65535) == 1
    start, end = CLASSIC_CONSISTENT_HASHING_RANGE
    assert start <= classic_consistent_slot(b"key-1") <= end
    assert classic_consistent_slot(b"key-1") == 414258592 % (end - start + 1) + start
