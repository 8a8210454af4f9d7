"""The entry cache: oldest-first eviction across ledgers, exact byte accounting, drops, and
nothing per entry left for the cyclic garbage collector to walk."""

from __future__ import annotations

import gc
import sys

from keyshared.storage.cache import ENTRY_OVERHEAD, Bucket, EntryCache


def _fill(cache: EntryCache, buckets: dict[int, Bucket], plan: list[tuple[int, int]]) -> None:
    for lid, eid in plan:
        cache.insert(buckets.setdefault(lid, {}), lid, eid, bytes([eid % 256]) * 10, eid)


def test_evicts_oldest_first_whichever_ledger() -> None:
    per = 10 + ENTRY_OVERHEAD
    cache = EntryCache(per * 4)
    buckets: dict[int, Bucket] = {}
    _fill(cache, buckets, [(1, 0), (2, 0), (1, 1), (2, 1), (1, 2), (2, 2)])
    assert len(cache) == 4 and cache.size == per * 4
    assert sorted(buckets[1]) == [1, 2] and sorted(buckets[2]) == [1, 2]
    assert buckets[1][2] == (bytes([2]) * 10, 2)


def test_drop_accounts_bytes_and_stale_slots_are_skipped() -> None:
    per = 10 + ENTRY_OVERHEAD
    cache = EntryCache(per * 3)
    buckets: dict[int, Bucket] = {}
    _fill(cache, buckets, [(1, 0), (1, 1), (1, 2)])
    cache.drop(buckets[1], 1, from_entry=1)  # a failed tail
    assert sorted(buckets[1]) == [0] and cache.size == per and len(cache) == 1
    _fill(cache, buckets, [(2, 0), (2, 1), (2, 2)])  # evicts 1:0, then skips the stale slots
    assert buckets[1] == {} and sorted(buckets[2]) == [0, 1, 2] and cache.size == per * 3
    cache.drop(buckets[2], 2)
    assert cache.size == 0 and len(cache) == 0


def test_compaction_keeps_the_live_order() -> None:
    per = 10 + ENTRY_OVERHEAD
    cache = EntryCache(per * 5000)
    buckets: dict[int, Bucket] = {}
    _fill(cache, buckets, [(lid, e) for e in range(1500) for lid in (1, 2)])
    _fill(cache, buckets, [(1, e) for e in range(1500, 2000)])
    cache.drop(buckets[1], 1)  # 2000 stale slots out of 3500: compacted
    assert len(cache) == 1500 and cache.size == per * 1500
    assert len(cache._order) == 1500
    _fill(cache, buckets, [(3, e) for e in range(4000)])  # evicts the oldest of ledger 2 first
    assert min(buckets[2]) == 500 and len(buckets[3]) == 4000


def test_cached_entries_are_not_tracked_by_the_collector() -> None:
    cache = EntryCache(1 << 20)
    buckets: dict[int, Bucket] = {}
    _fill(cache, buckets, [(7, e) for e in range(100)])
    gc.collect()
    assert not any(gc.is_tracked(v) for v in buckets[7].values())


def test_an_evicted_ledger_bucket_frees_its_table() -> None:
    """A dict does not shrink as entries are deleted: a ledger's bucket emptied by eviction
    kept a table sized for all its entries (2.6 MB for 50,000) as long as the ledger existed,
    about 50 bytes for every message ever stored."""
    cache = EntryCache(200 * (10 + ENTRY_OVERHEAD))
    old: dict[int, tuple[bytes, int]] = {}
    for i in range(5000):
        cache.insert(old, 1, i, b"x" * 10, 0)
    new: dict[int, tuple[bytes, int]] = {}
    for i in range(5000):
        cache.insert(new, 2, i, b"y" * 10, 0)
    assert not old
    assert sys.getsizeof(old) == sys.getsizeof({})
    dropped: dict[int, tuple[bytes, int]] = {}
    for i in range(100):
        cache.insert(dropped, 3, i, b"z" * 10, 0)
    cache.drop(dropped, 3)
    assert sys.getsizeof(dropped) == sys.getsizeof({})
