"""A set of positions stored as disjoint, coalesced ranges: a cursor's individually acked entries.

Layout: per ledger, one sorted ``list[int]`` of *boundaries* ``[s0, t0, s1, t1, ...]`` where each
pair is a closed-open range of entry ids ``[s, t)``, and every boundary is strictly greater than
the one before (so touching ranges are always merged). An entry ``e`` is in the set iff
``bisect_right(bounds, e)`` is odd. Lookups are a bisect (O(log n)); an add replaces a slice of
the list, which is a memmove of pointers: O(1) amortized at the tail, where acks land, and a few
microseconds in the middle of ten thousand ranges. A flat list of ints costs ~72 bytes a range,
a fraction of what a tree of range objects would.

The public API speaks in *closed* ranges of positions: ``(first, last)``, both in the set, both
in the same ledger. Ranges never span ledgers: ``(L, last)`` and ``(L+1, 0)`` may be adjacent
in a managed ledger, but only the ledger knows where a ledger ends, so the set keeps them as two
ranges. The cursor, which has the ledger, steps over ledger ends with ``next_position``.

Binary form (``to_bytes``), varints as in ``cursor_codec``::

    ledger count, then per ledger:
        ledger id minus the previous ledger id (the first: the id itself),
        byte length of the ledger's block, then the block:
            range count k, first boundary, then the 2k-1 deltas between consecutive boundaries

Every delta is at least 1, so a hole or a run of fewer than 128 entries costs one byte. Each
ledger's block is cached until the ledger's ranges change, so persisting a large set re-encodes
only the ledgers acked since the last persist; blocks read back seed the cache.
"""

from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator
from itertools import accumulate, chain, islice
from operator import sub

from keyshared.storage.cursor_codec import (
    CursorCodecError,
    decode_uvarints,
    encode_uvarints,
    read_uvarint,
    write_uvarint,
)
from keyshared.storage.position import Position

_NO_END = 1 << 63
_SMALL_BYTES = bytes(range(128))

Range = tuple[Position, Position]
"""A closed range ``(first, last)`` of positions in one ledger."""


class RangeSet:
    """Disjoint, coalesced ranges of positions (see the module docstring)."""

    __slots__ = ("_bounds", "_count", "_encoded", "_ids", "_nranges")

    def __init__(self, ranges: Iterable[Range] = ()) -> None:
        self._ids: list[int] = []
        self._bounds: dict[int, list[int]] = {}
        # Encoded form of each whole ledger's ranges, dropped when the ledger changes: a
        # persist re-encodes only the ledgers acked since the last one.
        self._encoded: dict[int, bytes] = {}
        self._nranges = 0
        self._count = 0
        for first, last in ranges:
            self.add_range(first, last)

    # --- size ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Number of ranges (Pulsar's ``individuallyDeletedMessages.size()``)."""
        return self._nranges

    def __bool__(self) -> bool:
        return self._nranges > 0

    @property
    def count(self) -> int:
        """Number of positions in the set."""
        return self._count

    # --- updates ---------------------------------------------------------------------------

    def add(self, pos: Position) -> int:
        """Add one position; returns 1 if it was not in the set, else 0."""
        lid, e = pos
        if e < 0 or lid < 0:
            raise ValueError(f"not an entry position: {pos}")
        b = self._bounds.get(lid)
        if b is None:
            insort(self._ids, lid)
            self._bounds[lid] = [e, e + 1]
            self._nranges += 1
            self._count += 1
            return 1
        i = bisect_right(b, e)
        if i & 1:
            return 0
        self._encoded.pop(lid, None)
        # e is outside every range; b[i-1] (if any) is the end of the range before it and
        # b[i] (if any) the start of the range after it.
        touches_left = i > 0 and b[i - 1] == e
        touches_right = i < len(b) and b[i] == e + 1
        if touches_left and touches_right:
            del b[i - 1 : i + 1]
            self._nranges -= 1
        elif touches_left:
            b[i - 1] = e + 1
        elif touches_right:
            b[i] = e
        else:
            b[i:i] = (e, e + 1)
            self._nranges += 1
        self._count += 1
        return 1

    def add_range(self, first: Position, last: Position) -> int:
        """Add the closed range ``[first, last]`` (one ledger); returns how many were new."""
        lid = first.ledger_id
        if last.ledger_id != lid:
            raise ValueError(f"range {first}..{last} spans ledgers")
        s = first.entry_id
        t = last.entry_id + 1
        if s < 0 or lid < 0:
            raise ValueError(f"not an entry position: {first}")
        if t <= s:
            return 0
        b = self._bounds.get(lid)
        if b is None:
            insort(self._ids, lid)
            self._bounds[lid] = [s, t]
            self._nranges += 1
            self._count += t - s
            return t - s
        self._encoded.pop(lid, None)
        lo = bisect_left(b, s)
        hi = bisect_right(b, t)
        # The old ranges that overlap or touch [s, t) are the pairs in b[a:z].
        a = lo - (lo & 1)
        z = hi + (hi & 1)
        new_s = s if a == lo else b[a]
        new_t = t if z == hi else b[z - 1]
        old = b[a:z]
        covered = sum(old[1::2]) - sum(old[0::2])
        b[a:z] = (new_s, new_t)
        self._nranges += 1 - len(old) // 2
        added = (new_t - new_s) - covered
        self._count += added
        return added

    def remove_up_to(self, pos: Position) -> int:
        """Drop every position ``<= pos`` (the mark-delete moved); returns how many went."""
        ids = self._ids
        if not ids or ids[0] > pos.ledger_id:
            return 0
        removed = 0
        cut = bisect_left(ids, pos.ledger_id)
        for lid in ids[:cut]:
            b = self._bounds.pop(lid)
            self._encoded.pop(lid, None)
            removed += sum(b[1::2]) - sum(b[0::2])
            self._nranges -= len(b) // 2
        del ids[:cut]
        if ids and ids[0] == pos.ledger_id:
            b = self._bounds[pos.ledger_id]
            self._encoded.pop(pos.ledger_id, None)
            c = pos.entry_id + 1  # keep entries >= c
            j = bisect_right(b, c)
            if j & 1:
                # c falls inside the range starting at b[j-1]: cut that range at c.
                gone = b[: j - 1]
                removed += sum(gone[1::2]) - sum(gone[0::2]) + (c - b[j - 1])
                del b[: j - 1]
                b[0] = c
                self._nranges -= len(gone) // 2
            else:
                gone = b[:j]
                removed += sum(gone[1::2]) - sum(gone[0::2])
                del b[:j]
                self._nranges -= len(gone) // 2
            if not b:
                del self._bounds[pos.ledger_id]
                del ids[0]
        self._count -= removed
        return removed

    def clear(self) -> None:
        """Remove everything."""
        self._ids.clear()
        self._bounds.clear()
        self._encoded.clear()
        self._nranges = 0
        self._count = 0

    # --- queries ---------------------------------------------------------------------------

    def __contains__(self, pos: object) -> bool:
        if not isinstance(pos, tuple):
            return False
        b = self._bounds.get(pos[0])
        return b is not None and bool(bisect_right(b, pos[1]) & 1)

    def contains(self, pos: Position) -> bool:
        """Whether ``pos`` is in the set."""
        b = self._bounds.get(pos.ledger_id)
        return b is not None and bool(bisect_right(b, pos.entry_id) & 1)

    def range_containing(self, pos: Position) -> Range | None:
        """The range ``pos`` is in, or None."""
        lid = pos.ledger_id
        b = self._bounds.get(lid)
        if b is None:
            return None
        i = bisect_right(b, pos.entry_id)
        if not i & 1:
            return None
        return Position(lid, b[i - 1]), Position(lid, b[i] - 1)

    def next_range(self, pos: Position) -> Range | None:
        """The first range that starts after ``pos``, or None."""
        ids = self._ids
        k = bisect_left(ids, pos.ledger_id)
        if k < len(ids) and ids[k] == pos.ledger_id:
            b = self._bounds[pos.ledger_id]
            i = bisect_right(b, pos.entry_id)
            i += i & 1  # inside a range (odd): the next start is after its end
            if i < len(b):
                return Position(pos.ledger_id, b[i]), Position(pos.ledger_id, b[i + 1] - 1)
            k += 1
        if k < len(ids):
            lid = ids[k]
            b = self._bounds[lid]
            return Position(lid, b[0]), Position(lid, b[1] - 1)
        return None

    def first_range(self) -> Range | None:
        """The lowest range, or None when empty."""
        if not self._ids:
            return None
        lid = self._ids[0]
        b = self._bounds[lid]
        return Position(lid, b[0]), Position(lid, b[1] - 1)

    def last_range(self) -> Range | None:
        """The highest range, or None when empty."""
        if not self._ids:
            return None
        lid = self._ids[-1]
        b = self._bounds[lid]
        return Position(lid, b[-2]), Position(lid, b[-1] - 1)

    def first_n(self, n: int) -> list[Range]:
        """The first ``n`` ranges in position order."""
        return list(islice(self, max(n, 0)))

    def __iter__(self) -> Iterator[Range]:
        """Ranges in position order, as closed ``(first, last)`` pairs."""
        for lid in self._ids:
            b = self._bounds[lid]
            for i in range(0, len(b), 2):
                yield Position(lid, b[i]), Position(lid, b[i + 1] - 1)

    def positions(self) -> Iterator[Position]:
        """Every position, in order (for tests and small sets)."""
        for first, last in self:
            for e in range(first.entry_id, last.entry_id + 1):
                yield Position(first.ledger_id, e)

    def cardinality(self, first: Position, last: Position) -> int:
        """How many positions of the set lie in the closed span ``[first, last]``."""
        if last < first or not self._ids:
            return 0
        ids = self._ids
        total = 0
        for k in range(bisect_left(ids, first.ledger_id), bisect_right(ids, last.ledger_id)):
            lid = ids[k]
            b = self._bounds[lid]
            lo = first.entry_id if lid == first.ledger_id else -1
            hi = last.entry_id + 1 if lid == last.ledger_id else _NO_END
            total += _measure(b, lo, hi)
        return total

    # --- comparisons, copies ---------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RangeSet):
            return NotImplemented
        return self._ids == other._ids and self._bounds == other._bounds

    __hash__ = None  # type: ignore[assignment]

    def copy(self) -> RangeSet:
        """An independent copy."""
        new = RangeSet()
        new._ids = list(self._ids)
        new._bounds = {lid: list(b) for lid, b in self._bounds.items()}
        new._encoded = dict(self._encoded)
        new._nranges = self._nranges
        new._count = self._count
        return new

    def __repr__(self) -> str:
        shown = ", ".join(f"[{a}..{b}]" for a, b in islice(self, 8))
        more = ", ..." if self._nranges > 8 else ""
        return f"RangeSet({shown}{more})"

    def to_pulsar_string(self, max_ranges: int | None = None) -> str:
        """Pulsar's ``individuallyDeletedMessages`` form: open-closed ``[(3:4..3:5], ...]``."""
        it: Iterable[Range] = self if max_ranges is None else islice(self, max_ranges)
        parts = [f"({a.ledger_id}:{a.entry_id - 1}..{b.ledger_id}:{b.entry_id}]" for a, b in it]
        return "[" + ", ".join(parts) + "]"

    # --- binary form -----------------------------------------------------------------------

    def to_bytes(self, max_ranges: int | None = None) -> bytes:
        """The compact binary form of the first ``max_ranges`` ranges (all when None)."""
        left = self._nranges if max_ranges is None else max(0, min(max_ranges, self._nranges))
        head = bytearray()
        parts: list[bytes] = []
        nledgers = 0
        prev = 0
        for lid in self._ids:
            if left == 0:
                break
            b = self._bounds[lid]
            k = min(len(b) // 2, left)
            left -= k
            nledgers += 1
            if 2 * k == len(b):
                block = self._encoded.get(lid)
                if block is None:
                    block = self._encoded[lid] = _encode_ledger(b, k)
            else:
                block = _encode_ledger(b, k)
            write_uvarint(head, lid - prev)
            write_uvarint(head, len(block))
            parts.append(bytes(head))
            parts.append(block)
            head.clear()
            prev = lid
        write_uvarint(head, nledgers)
        return b"".join((bytes(head), *parts))

    @classmethod
    def from_bytes(cls, data: bytes) -> RangeSet:
        """Inverse of :meth:`to_bytes`; raises ``CursorCodecError`` on corrupt input."""
        rs = cls()
        if not data:
            return rs
        view = memoryview(data)
        nledgers, off = read_uvarint(view, 0)
        lid = 0
        for n in range(nledgers):
            delta, off = read_uvarint(view, off)
            size, off = read_uvarint(view, off)
            if n > 0 and delta <= 0:
                raise CursorCodecError("range set ledgers not increasing")
            if off + size > len(data):
                raise CursorCodecError("truncated range set")
            lid += delta
            block = bytes(view[off : off + size])
            off += size
            b = _decode_ledger(block)
            rs._ids.append(lid)
            rs._bounds[lid] = b
            rs._encoded[lid] = block
            rs._nranges += len(b) // 2
            rs._count += sum(b[1::2]) - sum(b[0::2])
        if off != len(data):
            raise CursorCodecError("trailing data in range set")
        return rs


def _encode_ledger(b: list[int], k: int) -> bytes:
    """Varints of one ledger's first ``k`` ranges: k, first boundary, then the deltas."""
    stop = 2 * k
    small = _small_deltas(b, stop)
    if small is not None:
        head = bytearray()
        write_uvarint(head, k)
        write_uvarint(head, b[0])
        return bytes(head) + small
    # Consecutive differences, computed in C: b[1]-b[0], b[2]-b[1], ...
    deltas = map(sub, islice(b, 1, stop), islice(b, 0, stop - 1))
    return encode_uvarints(chain((k, b[0]), deltas))


def _small_deltas(b: list[int], stop: int) -> bytes | None:
    """The deltas between ``b[:stop]``'s consecutive boundaries as one byte each (which is
    their varint form), when every one is below 128; else None.

    Holes and short runs make most deltas small, and this path never creates a Python int
    per delta: the boundaries are packed as fixed-width fields of one big integer ``A``; then
    ``(A >> width) - A`` holds ``b[i+1] - b[i]`` in field ``i`` (every such difference is
    positive, so no borrow crosses a field; only the top field goes negative).
    """
    if stop < 64:
        return None
    width = 4 if b[stop - 1] < 1 << 31 else 8
    raw = struct.pack(f"<{stop}{'i' if width == 4 else 'q'}", *islice(b, stop))
    packed = int.from_bytes(raw, "little")
    fields = ((packed >> (8 * width)) - packed).to_bytes(width * stop, "little", signed=True)
    end = width * (stop - 1)
    low = fields[0:end:width]
    # Small: every low byte is below 128, and no other byte of the fields is set.
    set_bytes = end - fields.count(0, 0, end)
    if low.translate(None, _SMALL_BYTES) or set_bytes != len(low) - low.count(0):
        return None
    return low


def _decode_ledger(block: bytes) -> list[int]:
    """Inverse of :func:`_encode_ledger` for a whole ledger: the boundary list."""
    k, off = read_uvarint(block, 0)
    first, off = read_uvarint(block, off)
    rest = block[off:]
    if k >= 1 and len(rest) == 2 * k - 1 and not rest.translate(None, _SMALL_BYTES):
        # Every delta is one byte: sum them up in C without a varint decoder.
        if rest.count(0):
            raise CursorCodecError("range set boundaries not increasing")
        return list(accumulate(rest, initial=first))
    values = decode_uvarints(block)
    if len(values) < 3 or len(values) != 2 * values[0] + 1:
        raise CursorCodecError("corrupt range set block")
    if min(islice(values, 2, None)) < 1:
        raise CursorCodecError("range set boundaries not increasing")
    return list(accumulate(islice(values, 1, None)))


def _measure(b: list[int], lo: int, hi: int) -> int:
    """Entries of the ranges in ``b`` within ``[lo, hi)``; O(ranges inside the window)."""
    i = bisect_right(b, lo)
    j = bisect_left(b, hi)
    # b[i:j] are the boundaries strictly inside the window. An odd i means lo falls inside a
    # range (b[i] is its end), an odd j that hi cuts the range starting at b[j-1].
    mid = b[i:j]
    ends, starts = (mid[0::2], mid[1::2]) if i & 1 else (mid[1::2], mid[0::2])
    total = sum(ends) - sum(starts) - (lo if i & 1 else 0)
    if j & 1:
        total += hi
    return total
