"""The entry cache: recent entries kept in memory, shared by all managed ledgers of a storage.

Each ledger owns a *bucket* (``dict[entry_id, (data, crc)]``); the cache keeps a global FIFO of
``ledger_id << 40 | entry_id`` (ledger ids are unique in a storage) so the oldest entries,
whichever ledger they belong to, are evicted first when the byte budget is exceeded. Entries enter at
append time (the bytes the producer sent, no copy) and are served only once durable (the ledger
checks). Disk reads do not enter the cache: a catch-up reader would otherwise push out the tail
that live readers need.

Everything the cache keeps per entry is an int or a plain tuple of bytes and an int, which CPython's
cyclic garbage collector does not track (the tuple after one collection). Objects of a class (a dataclass, even a
NamedTuple subclass) stay tracked, and a cache of a few hundred thousand small entries then made
every full collection walk them all: 40-100 ms pauses every few seconds under load, and about a
fifth of the broker's CPU. The ledger builds the ``Entry`` it returns from the tuple.
"""

from __future__ import annotations

from collections import deque

# What an entry costs besides its payload bytes, so that the budget bounds memory (RSS), not
# payload alone: measured with tracemalloc (bench/bench_memory.py), 212 bytes of bookkeeping (the
# (data, crc) tuple, the crc and order-key ints, the bucket's dict slot, the deque slot) plus the
# bytes object's own 33-byte header and allocator rounding. It was 128, which let a cache of
# 100-byte entries take 1.45 times its budget (370 MB of RSS for the default 256 MB).
ENTRY_OVERHEAD = 256

# Order keys pack (ledger id, entry id) into one int: ints are not tracked by the collector.
_SHIFT = 40
_MASK = (1 << _SHIFT) - 1

Cached = tuple[bytes, int]
"""A cached entry: its bytes and their CRC32C."""

Bucket = dict[int, Cached]


class EntryCache:
    """A byte-bounded, oldest-first cache of entries keyed per ledger."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._size = 0
        self._order: deque[int] = deque()
        # Ledger id -> its bucket, for every bucket that holds entries.
        self._buckets: dict[int, Bucket] = {}
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

    def insert(self, bucket: Bucket, ledger_id: int, entry_id: int, data: bytes, crc: int) -> None:
        """Cache an entry as ``bucket[entry_id]``, evicting the oldest entries as needed."""
        if self._max <= 0:
            return
        bucket[entry_id] = (data, crc)
        self._buckets[ledger_id] = bucket
        self._order.append(ledger_id << _SHIFT | entry_id)
        self._size += len(data) + ENTRY_OVERHEAD
        if self._size > self._max:
            self._evict()

    def drop(self, bucket: Bucket, ledger_id: int, from_entry: int = 0) -> None:
        """Remove the bucket's entries with id >= ``from_entry`` (a trimmed or failed ledger)."""
        if not bucket:
            return
        doomed = [eid for eid in bucket if eid >= from_entry]
        for eid in doomed:
            data, _ = bucket.pop(eid)
            self._size -= len(data) + ENTRY_OVERHEAD
        self._stale += len(doomed)
        if not bucket:
            bucket.clear()  # frees its table (see _evict)
            if self._buckets.get(ledger_id) is bucket:
                del self._buckets[ledger_id]
        if self._stale > 1024 and self._stale * 2 > len(self._order):
            self._compact()

    def _evict(self) -> None:
        order = self._order
        buckets = self._buckets
        while self._size > self._max and order:
            key = order.popleft()
            lid, eid = key >> _SHIFT, key & _MASK
            bucket = buckets.get(lid)
            cached = bucket.pop(eid, None) if bucket is not None else None
            if cached is None or bucket is None:
                self._stale -= 1
                continue
            self._size -= len(cached[0]) + ENTRY_OVERHEAD
            if not bucket:
                # clear() frees the emptied dict's table; a dict never shrinks on deletions, and
                # the ledger keeps its bucket: 2.6 MB for each ledger of 50,000 entries, for good.
                bucket.clear()
                del buckets[lid]

    def _compact(self) -> None:
        buckets = self._buckets
        self._order = deque(
            key
            for key in self._order
            if (b := buckets.get(key >> _SHIFT)) is not None and key & _MASK in b
        )
        self._stale = 0
