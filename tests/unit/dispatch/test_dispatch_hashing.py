"""Sticky-key hashing: Pulsar's Murmur3 and each selector's slot formula (research §1.3-1.4)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ks_dispatch_helpers import FakeConsumer, reference_murmur3_32, reference_pulsar_hash

from keyshared.broker.dispatch.selectors import (
    ConsistentHashingStickyKeyConsumerSelector,
    HashRangeAutoSplitStickyKeyConsumerSelector,
    HashRangeExclusiveStickyKeyConsumerSelector,
    consistent_hashing_slot,
    hash_range_slot,
    make_sticky_key_hash,
    pulsar_hash,
)

# key, murmur3 u32, pulsar_hash, consistent slot, autosplit/sticky slot (research §1.4)
VECTORS = [
    (b"Order-3459134", 3112179635, 964695987, 20788, 6067),
    (b"NONE_KEY", 2652225187, 504741539, 56505, 48803),
    (b"key-1", 2561742240, 414258592, 11858, 5536),
    (b"0", 3530670207, 1383186559, 4850, 49279),
    (b"1", 2484513939, 337030291, 49322, 44179),
    (b"", 0, 0, 1, 1),
]


@pytest.mark.parametrize(("key", "murmur", "phash", "consistent", "ranged"), VECTORS)
def test_research_vectors(
    key: bytes, murmur: int, phash: int, consistent: int, ranged: int
) -> None:
    assert reference_murmur3_32(key) == murmur
    assert pulsar_hash(key) == phash
    assert consistent_hashing_slot(key) == consistent
    assert hash_range_slot(key) == ranged
    assert (
        ConsistentHashingStickyKeyConsumerSelector[FakeConsumer]().sticky_key_hash(key)
        == consistent
    )
    assert (
        HashRangeAutoSplitStickyKeyConsumerSelector[FakeConsumer]().sticky_key_hash(key) == ranged
    )
    assert (
        HashRangeExclusiveStickyKeyConsumerSelector[FakeConsumer]().sticky_key_hash(key) == ranged
    )


def test_docs_example_order_key() -> None:
    # Pulsar docs: hash("Order-3459134") lands in slot 6067 of the 65536 hash ranges.
    assert hash_range_slot(b"Order-3459134") == 6067


@settings(max_examples=300, deadline=None, print_blob=True)
@given(st.binary(max_size=64))
def test_mmh3_matches_reference_implementation(key: bytes) -> None:
    assert pulsar_hash(key) == reference_pulsar_hash(key)
    slot = consistent_hashing_slot(key)
    assert 1 <= slot <= 65535
    assert slot == reference_pulsar_hash(key) % 65535 + 1
    assert slot == make_sticky_key_hash(key, 1, 65535)
    ranged = hash_range_slot(key)
    assert 1 <= ranged <= 65535
    assert ranged == (reference_pulsar_hash(key) % 65536 or 1)
    assert ranged == make_sticky_key_hash(key, 0, 65535)


def test_zero_is_never_a_slot() -> None:
    # b"" hashes to 0; 0 means "not set" to the dispatcher, so it folds to 1.
    assert make_sticky_key_hash(b"", 0, 65535) == 1
    assert make_sticky_key_hash(b"", 1, 65535) == 1
