"""Entry positions and the arithmetic the source plans with.

A position is ``(ledger_id, entry_id)``. Offsets name the *last entry included* (an inclusive
end, as StreamNative's connector does), so a range is ``(start, end]``; ``BEFORE_ALL`` is the
start of a partition that has been read from the beginning. An end may be *virtual*: a position
no entry has (``(7, 120)`` in a ledger of 100 entries). The broker and the reader handle such
bounds: a read stops at the first entry beyond it, and the next range starts after it. Every entry of a batch entry is included or
excluded together, so counts are in entries.

With the ledger list from the admin ``internalStats`` (``ledgerId``, ``entries`` per ledger) the
arithmetic is exact; without it, the source falls back to bounds inside one ledger
(:func:`advance` with ``ledgers=None``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Pos = tuple[int, int]
"""``(ledger_id, entry_id)``."""

BEFORE_ALL: Pos = (-1, -1)
"""The position before the first entry of any partition."""

_RANGE_RE = re.compile(r"\((-?\d+):(-?\d+)\.\.(-?\d+):(-?\d+)\]")


@dataclass(frozen=True, slots=True)
class LedgerInfo:
    """One ledger of a topic partition: its id and how many entries it holds."""

    ledger_id: int
    entries: int


def parse_pos(text: str) -> Pos:
    """``"12:345"`` (or ``"12:345:-1"``, batch index ignored) to ``(12, 345)``."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"not a position: {text!r} (expected LEDGER:ENTRY)")
    return int(parts[0]), int(parts[1])


def format_pos(pos: Pos) -> str:
    """``(12, 345)`` to ``"12:345"``."""
    return f"{pos[0]}:{pos[1]}"


def ledgers_from_internal_stats(stats: dict[str, object]) -> list[LedgerInfo]:
    """The ``ledgers`` list of an admin ``internalStats`` answer, in ledger order."""
    raw = stats.get("ledgers") or []
    assert isinstance(raw, list)
    out = [LedgerInfo(int(li["ledgerId"]), int(li["entries"])) for li in raw]
    out.sort(key=lambda li: li.ledger_id)
    return out


def last_entry(ledgers: Sequence[LedgerInfo]) -> Pos:
    """The last entry present, or ``BEFORE_ALL`` when there is none."""
    for li in reversed(ledgers):
        if li.entries > 0:
            return li.ledger_id, li.entries - 1
    return BEFORE_ALL


def first_entry(ledgers: Sequence[LedgerInfo]) -> Pos | None:
    """The first entry still stored, or None when the partition holds no entry."""
    for li in ledgers:
        if li.entries > 0:
            return li.ledger_id, 0
    return None


def next_entry(ledgers: Sequence[LedgerInfo], start: Pos) -> Pos | None:
    """The first stored entry after ``start``, or None."""
    for li in ledgers:
        if li.entries <= 0 or li.ledger_id < start[0]:
            continue
        if li.ledger_id == start[0]:
            if start[1] + 1 < li.entries:
                return li.ledger_id, max(start[1] + 1, 0)
            continue
        return li.ledger_id, 0
    return None


def count_between(ledgers: Sequence[LedgerInfo], start: Pos, end: Pos) -> int:
    """How many stored entries lie in ``(start, end]``."""
    if end <= start:
        return 0
    n = 0
    for li in ledgers:
        lo = max(start[1] + 1, 0) if li.ledger_id == start[0] else 0
        hi = min(end[1], li.entries - 1) if li.ledger_id == end[0] else li.entries - 1
        if li.ledger_id < start[0] or li.ledger_id > end[0] or hi < lo:
            continue
        n += hi - lo + 1
    return n


def advance(ledgers: Sequence[LedgerInfo] | None, start: Pos, n: int, latest: Pos) -> Pos:
    """The end of a range of at most ``n`` entries after ``start``, never beyond ``latest``.

    Without a ledger list the cap holds only when ``start`` and ``latest`` share a ledger (the
    count is then plain subtraction); otherwise the whole ``(start, latest]`` is returned,
    because the entries left in ``start``'s ledger are unknown.
    """
    if n <= 0 or latest <= start:
        return start
    if ledgers is None:
        if start[0] == latest[0]:
            return min((start[0], start[1] + n), latest)
        return latest
    left = n
    for i, li in enumerate(ledgers):
        if li.ledger_id < start[0] or li.entries <= 0:
            continue
        lo = start[1] + 1 if li.ledger_id == start[0] else 0
        avail = li.entries - lo
        if avail <= 0:
            continue
        if avail >= left:
            end = min((li.ledger_id, lo + left - 1), latest)
            return _past_ledger_end(ledgers, i, end, latest)
        left -= avail
    return latest


def _past_ledger_end(ledgers: Sequence[LedgerInfo], i: int, end: Pos, latest: Pos) -> Pos:
    """``(next ledger, -1)`` for an end on the last entry of a ledger that a non-empty ledger
    follows: the same entries, but a restart that finds the ledger deleted can tell nothing
    after the end was lost with it."""
    li = ledgers[i]
    if end != (li.ledger_id, li.entries - 1):
        return end
    for nxt in ledgers[i + 1 :]:
        if nxt.entries > 0:
            return (nxt.ledger_id, -1) if (nxt.ledger_id, 0) <= latest else end
    return end


def split_range(ledgers: Sequence[LedgerInfo], start: Pos, end: Pos, pieces: int) -> list[Pos]:
    """Cut ``(start, end]`` into at most ``pieces`` consecutive ranges of near-equal entry counts;
    returns their ends (the last one is ``end``)."""
    total = count_between(ledgers, start, end)
    if pieces <= 1 or total <= 1:
        return [end]
    pieces = min(pieces, total)
    ends: list[Pos] = []
    cur = start
    done = 0
    for i in range(1, pieces):
        target = total * i // pieces
        cur = advance(ledgers, cur, target - done, end)
        done = target
        ends.append(cur)
    ends.append(end)
    return ends


def parse_acked_ranges(text: str) -> list[tuple[Pos, Pos]]:
    """Pulsar's ``individuallyDeletedMessages`` (``"[(3:4..3:7], (3:9..3:10]]"``): the
    open-closed ranges of individually acknowledged entries."""
    return [((int(a), int(b)), (int(c), int(d))) for a, b, c, d in _RANGE_RE.findall(text or "")]


class AckedRanges:
    """Fast membership over a sorted list of open-closed ``(lo, hi]`` position ranges."""

    __slots__ = ("_i", "_ranges")

    def __init__(self, ranges: Iterable[tuple[Pos, Pos]]) -> None:
        self._ranges = sorted(ranges)
        self._i = 0

    def __bool__(self) -> bool:
        return bool(self._ranges)

    def contains(self, pos: Pos) -> bool:
        """Whether ``pos`` is acknowledged; calls must come in ascending position order."""
        ranges = self._ranges
        i = self._i
        while i < len(ranges) and ranges[i][1] < pos:
            i += 1
        self._i = i
        return i < len(ranges) and ranges[i][0] < pos <= ranges[i][1]
