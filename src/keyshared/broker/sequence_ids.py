"""The sequence ids an entry carries, and a compact set of them.

A SEND's ``sequence_id`` is only its first message's; the ids of a batch's messages are in the
batch itself, each ``SingleMessageMetadata.sequence_id`` (which the official clients set).
Without ``highest_sequence_id`` (the C++ client never sets it) ``sequence_id + num_messages - 1``
is not the last one of a key-based batch, whose ids interleave with other keys' batches.
"""

from __future__ import annotations

import logging
import zlib
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from keyshared.protocol import decompress, split_payload
from keyshared.protocol import pulsar_api_pb2 as pb

log = logging.getLogger(__name__)

_U32 = 4
# Batches larger than this are tracked by the ids their metadata names (never by a guess).
_MAX_BATCH = 100_000
_MAX_BODY = 256 * 1024 * 1024


# --- what an entry holds ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendIds:
    """The sequence ids one entry (one SEND) carries.

    ``first`` is the sequence id the entry's metadata carries (the SEND's); ``ids`` are the
    sequence ids of its messages; ``complete`` is False when the entry's other messages could
    not be read (an encrypted batch), and then only the ids known are tracked. ``chunk`` is
    ``(chunk_id, num_chunks)`` for a chunk of a chunked message (whose sequence id is
    ``first``).
    """

    first: int
    ids: tuple[int, ...]
    complete: bool = True
    chunk: tuple[int, int] | None = None


def send_ids(data: bytes) -> SendIds:
    """Read the sequence ids of an entry (``metadataSize + MessageMetadata + payload``).

    Raises :class:`~keyshared.protocol.errors.MalformedFrame` only for unparseable metadata;
    a batch body that cannot be read yields the ids the metadata alone gives.
    """
    md, payload = split_payload(data)
    return ids_of(md, payload)


def ids_of(md: pb.MessageMetadata, payload: memoryview) -> SendIds:
    """:func:`send_ids` from an entry already split into metadata and payload."""
    seq = md.sequence_id
    if md.HasField("chunk_id") and md.num_chunks_from_msg > 1:
        return SendIds(seq, (seq,), True, (md.chunk_id, md.num_chunks_from_msg))
    n = md.num_messages_in_batch if md.HasField("num_messages_in_batch") else 1
    if n <= 1:
        return SendIds(seq, (seq,))
    highest = md.highest_sequence_id if md.HasField("highest_sequence_id") else None
    if n > _MAX_BATCH:
        return SendIds(seq, known_ids(seq, highest), False)
    # Even with highest - seq == n - 1 the body is read: ids a client repeats inside one batch
    # would make a range guessed from the two ends claim ids never sent.
    known = known_ids(seq, highest)
    if md.encryption_keys:
        return SendIds(seq, known, False)
    try:
        ids = _batch_sequence_ids(md, payload, n)
    except Exception as exc:  # a body the broker cannot read: track what the metadata says
        log.debug("cannot read the sequence ids of a batch: %s", exc)
        ids = None
    if ids is None:
        return SendIds(seq, known, False)
    return SendIds(seq, tuple(dict.fromkeys(ids)))


def known_ids(seq: int, highest: int | None) -> tuple[int, ...]:
    """The ids a batch's metadata alone names: its first and, if given, its highest."""
    return (seq,) if highest is None or highest == seq else (seq, highest)


def _batch_sequence_ids(
    md: pb.MessageMetadata, payload: memoryview, n: int
) -> tuple[int, ...] | None:
    """Each batch message's sequence id; None if the body does not hold ``n`` messages that
    all carry one (a hostile ``num_messages_in_batch`` costs no more than the body's size)."""
    if md.compression != pb.NONE and md.uncompressed_size > _MAX_BODY:
        return None
    if md.compression == pb.ZLIB:
        # Bounded: a hostile body must not inflate past what the metadata announces.
        raw = zlib.decompressobj().decompress(payload, md.uncompressed_size + 1)
        if len(raw) != md.uncompressed_size:
            return None
        body = memoryview(raw)
    else:
        body = memoryview(decompress(md, payload))
    end = len(body)
    if n > end // _U32:
        return None
    out: list[int] = []
    pos = 0
    single = pb.SingleMessageMetadata()
    for _ in range(n):
        if end - pos < _U32:
            return None
        size = int.from_bytes(body[pos : pos + _U32], "big")
        pos += _U32
        if size > end - pos:
            return None
        single.Clear()
        single.ParseFromString(bytes(body[pos : pos + size]))
        if not single.HasField("sequence_id") or single.payload_size < 0:
            return None
        out.append(single.sequence_id)
        pos += size + single.payload_size
    return tuple(out)


# --- a set of integers as ranges --------------------------------------------------------


class SequenceRanges:
    """Disjoint, coalesced ranges of sequence ids.

    A sorted flat list of boundaries ``[s0, t0, s1, t1, ...]``, each pair a closed-open range
    ``[s, t)``, every boundary strictly above the one before; ``i`` is in the set iff
    ``bisect_right(bounds, i)`` is odd.
    """

    __slots__ = ("bounds",)

    def __init__(self, bounds: Iterable[int] = ()) -> None:
        self.bounds: list[int] = list(bounds)

    def __contains__(self, i: int) -> bool:
        return bisect_right(self.bounds, i) & 1 == 1

    def __len__(self) -> int:
        """The number of ranges."""
        return len(self.bounds) // 2

    def add_run(self, first: int, last: int) -> None:
        """Add the ids ``first..last`` (inclusive)."""
        b = self.bounds
        lo, hi = first, last + 1
        if not b or b[-1] < lo:  # the common case: a new run above everything
            b += (lo, hi)
            return
        # Boundaries below lo end before it or start a range it extends (odd count: lo is
        # inside or right after a range); boundaries up to hi likewise for the end.
        i = bisect_left(b, lo)
        j = bisect_right(b, hi)
        new: list[int] = []
        if i & 1 == 0:
            new.append(lo)
        if j & 1 == 0:
            new.append(hi)
        b[i:j] = new

    def add(self, ids: Iterable[int]) -> None:
        """Add each of ``ids``."""
        run: list[int] = []
        for i in sorted(ids):
            if run and i == run[1] + 1:
                run[1] = i
                continue
            if run and i == run[1]:
                continue
            if run:
                self.add_run(run[0], run[1])
            run = [i, i]
        if run:
            self.add_run(run[0], run[1])

    def drop_lowest(self) -> int:
        """Forget the lowest range; returns the first id of the lowest range kept."""
        del self.bounds[:2]
        return self.bounds[0] if self.bounds else 0

    def highest(self) -> int | None:
        """The highest id in the set."""
        return self.bounds[-1] - 1 if self.bounds else None
