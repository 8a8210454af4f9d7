"""Batch-index ack sets in Java ``BitSet`` layout, as Pulsar puts them on the wire.

A batch entry holds ``batch_size`` messages. Its ack set is a bitset where a SET bit means the
message at that index is still UNacked; bit ``i`` lives in 64-bit word ``i // 64``, at bit
``i % 64``. Protobuf hands the words over as signed int64 (``repeated int64 ack_set``), so a
word with bit 63 set is negative. In memory we keep the whole bitset as one Python int: AND,
popcount and the zero test then run in C whatever the batch size.

Java's ``BitSet.toLongArray`` drops trailing zero words; :func:`to_words` does the same, so a
fully acked set is the empty list.
"""

from __future__ import annotations

from collections.abc import Sequence

_WORD = 64
_MASK = (1 << 64) - 1


def from_words(words: Sequence[int]) -> int:
    """The bitset of ``words`` (signed or unsigned int64 words, word 0 lowest)."""
    bits = 0
    for i, w in enumerate(words):
        if w:
            bits |= (w & _MASK) << (_WORD * i)
    return bits


def to_words(bits: int) -> list[int]:
    """``bits`` as signed int64 words, trailing zero words dropped (Java ``toLongArray``)."""
    if bits < 0:
        raise ValueError("a bitset is never negative")
    out: list[int] = []
    while bits:
        w = bits & _MASK
        out.append(w - (1 << 64) if w >> 63 else w)
        bits >>= _WORD
    return out


def full(batch_size: int) -> int:
    """The ack set of a batch none of whose messages is acked yet."""
    return (1 << batch_size) - 1 if batch_size > 0 else 0


def unacked_count(bits: int) -> int:
    """How many indexes are still unacked."""
    return bits.bit_count()


def intersect(current: int, ack_set: Sequence[int], batch_size: int = 0) -> int:
    """Apply an incoming ack set to ``current``: an index stays unacked only if both say so.

    With a positive ``batch_size``, bits at or past it (which no message has) are cleared.
    """
    bits = current & from_words(ack_set)
    if batch_size > 0:
        bits &= full(batch_size)
    return bits


def all_acked(bits: int) -> bool:
    """Whether no index is left unacked."""
    return bits == 0


def is_index_acked(bits: int, index: int) -> bool:
    """Whether message ``index`` of the batch is acked."""
    return not (bits >> index) & 1
