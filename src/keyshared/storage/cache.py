"""The entry cache: recent entries kept in memory, shared by all managed ledgers of a storage.

Each ledger owns a *bucket* (``dict[entry_id, Entry]``); the cache keeps a global FIFO of
``(bucket, entry_id)`` so the oldest entries, whichever ledger they belong to, are evicted first
when the byte budget is exceeded. Entries enter at append time (the bytes the producer sent, no
copy) and are served only once durable (the ledger checks). Disk reads do not enter the cache:
a catch-up reader would otherwise push out the tail that live readers need.
"""

from __future__ import annotations

from collections import deque

from keyshared.storage.entry import Entry

# Rough per-entry bookkeeping cost (Entry, Position, dict slot, deque slot), so a cache of tiny
# entries is bounded by memory rather than by payload bytes alone.
ENTRY_OVERHEAD = 128

Bucket = dict[int, Entry]


class EntryCache:
    """A byte-bounded, oldest-first cache of entries keyed per ledger."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._size = 0
        self._order: deque[tuple[Bucket, int]] = deque()
        # Order slots whose entry was already dropped; compacted when they dominate.
        self._stale = 0

    @property
    def enabled(self) -> bool:
        """False when the budget is zero: nothing is cached."""
        return self._max > 0

    @property
    def size(self) -> int:
        """Bytes accounted to cached entries (payload plus overhead)."""
        return self._size

    @property
    def max_bytes(self) -> int:
        """The byte budget."""
        return self._max

    def __len__(self) -> int:
        return len(self._order) - self._stale

    def insert(self, bucket: Bucket, entry_id: int, entry: Entry) -> None:
        """Cache ``entry`` under ``bucket[entry_id]``, evicting the oldest entries as needed."""
        if self._max <= 0:
            return
        bucket[entry_id] = entry
        self._order.append((bucket, entry_id))
        self._size += len(entry.data) + ENTRY_OVERHEAD
        if self._size > self._max:
            self._evict()

    def drop(self, bucket: Bucket, from_entry: int = 0) -> None:
        """Remove the bucket's entries with id >= ``from_entry`` (a trimmed or failed ledger)."""
        if not bucket:
            return
        doomed = [eid for eid in bucket if eid >= from_entry]
        for eid in doomed:
            entry = bucket.pop(eid)
            self._size -= len(entry.data) + ENTRY_OVERHEAD
        self._stale += len(doomed)
        if self._stale > 1024 and self._stale * 2 > len(self._order):
            self._compact()

    def _evict(self) -> None:
        order = self._order
        while self._size > self._max and order:
            bucket, eid = order.popleft()
            entry = bucket.pop(eid, None)
            if entry is None:
                self._stale -= 1
            else:
                self._size -= len(entry.data) + ENTRY_OVERHEAD

    def _compact(self) -> None:
        self._order = deque(item for item in self._order if item[1] in item[0])
        self._stale = 0
