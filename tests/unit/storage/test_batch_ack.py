"""Batch-index ack sets in Java BitSet layout."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keyshared.storage import batch_ack


def test_client_observed_ack_set() -> None:
    # research/pulsar-protocol.md 5.4: acking index 1 of a 3-message batch sends ack_set=[5].
    bits = batch_ack.intersect(batch_ack.full(3), [0b101], 3)
    assert bits == 0b101
    assert batch_ack.to_words(bits) == [5]
    assert batch_ack.is_index_acked(bits, 1)
    assert not batch_ack.is_index_acked(bits, 0)
    assert batch_ack.unacked_count(bits) == 2


def test_word_layout_and_sign() -> None:
    # Index 63 is the sign bit of word 0; index 64 is bit 0 of word 1.
    bits = (1 << 63) | (1 << 64)
    words = batch_ack.to_words(bits)
    assert words == [-(1 << 63), 1]
    assert batch_ack.from_words(words) == bits
    # Unsigned words (as some encoders give them) decode the same.
    assert batch_ack.from_words([1 << 63, 1]) == bits


def test_fully_acked_is_empty_and_trailing_zero_words_dropped() -> None:
    assert batch_ack.to_words(0) == []
    assert batch_ack.all_acked(batch_ack.from_words([]))
    assert batch_ack.to_words(batch_ack.from_words([3, 0, 0])) == [3]


def test_intersection_masks_indexes_past_the_batch() -> None:
    assert batch_ack.intersect(-1, [0xFF], 4) == 0xF
    assert batch_ack.full(0) == 0
    assert batch_ack.full(130).bit_count() == 130


@given(st.lists(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1), max_size=5))
def test_words_round_trip(words: list[int]) -> None:
    while words and words[-1] == 0:
        words = words[:-1]
    assert batch_ack.to_words(batch_ack.from_words(words)) == words


@given(
    st.integers(min_value=1, max_value=200),
    st.lists(st.sets(st.integers(min_value=0, max_value=199)), max_size=6),
)
def test_successive_acks_are_an_intersection(size: int, acks: list[set[int]]) -> None:
    bits = batch_ack.full(size)
    acked: set[int] = set()
    for chunk in acks:
        chunk = {i for i in chunk if i < size}
        acked |= chunk
        # The client sends the set of indexes it still has unacked.
        still = batch_ack.full(size) & ~sum(1 << i for i in acked)
        bits = batch_ack.intersect(bits, batch_ack.to_words(still), size)
    assert {i for i in range(size) if batch_ack.is_index_acked(bits, i)} == acked
    assert batch_ack.all_acked(bits) == (len(acked) == size)
