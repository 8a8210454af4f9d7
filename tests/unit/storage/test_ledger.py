"""The managed ledger: appends, reads across ledgers, positions, counting, seek, trim, close."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from crc32c import crc32c

import keyshared.storage.journal as journal_mod
import keyshared.storage.ledger_rollover as ledger_rollover
from keyshared.storage.config import StorageConfig
from keyshared.storage.entry import Entry
from keyshared.storage.errors import StorageError
from keyshared.storage.ledger import LedgerInfo, ManagedLedger
from keyshared.storage.position import EARLIEST, LATEST, Position
from keyshared.storage.segment import data_path
from keyshared.storage.store import Storage


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await fn()

    asyncio.run(main())


async def fill(ml: ManagedLedger, n: int, start: int = 0) -> list[Position]:
    added = [ml.add_entry(b"m%d" % i) for i in range(start, start + n)]
    await asyncio.gather(*(fut for _, fut in added))
    return [pos for pos, _ in added]


async def all_entries(ml: ManagedLedger) -> list[Entry]:
    return await ml.read_entries(EARLIEST, 10**9)


def storage(path: Path, **kw: int | bool) -> Storage:
    return Storage(path, StorageConfig(**kw))  # type: ignore[arg-type]


def test_round_trip_and_properties(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("public/default/t")
        first_ledger = ml.current_ledger_id
        assert ml.last_add_confirmed == Position(first_ledger, -1)
        assert ml.first_position is None
        assert ml.number_of_entries == 0
        assert await ml.read_entries(EARLIEST, 10) == []
        positions = await fill(ml, 10)
        assert positions == [Position(first_ledger, i) for i in range(10)]
        assert ml.last_add_confirmed == positions[-1]
        assert ml.last_position == positions[-1]
        assert ml.first_position == positions[0]
        assert ml.number_of_entries == 10
        assert ml.total_size == sum(len(b"m%d" % i) for i in range(10))
        entries = await all_entries(ml)
        assert [e.data for e in entries] == [b"m%d" % i for i in range(10)]
        assert [e.position for e in entries] == positions
        assert all(e.checksum == crc32c(e.data) for e in entries)
        assert [e.data for e in await ml.read_entries(positions[3], 2)] == [b"m3", b"m4"]
        assert await ml.read_entries(positions[-1].next(), 5) == []
        entry = await ml.read_entry(positions[4])
        assert entry is not None
        assert entry.data == b"m4"
        assert await ml.read_entry(Position(first_ledger, 10)) is None
        assert await ml.read_entry(Position(999, 0)) is None
        assert ml.ledgers == [LedgerInfo(first_ledger, 10, ml.total_size)]
        await st.close()

    run(main)


def test_positions_assigned_in_call_order_before_durability(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        p1, f1 = ml.add_entry(b"a")
        p2, f2 = ml.add_entry(b"b")
        assert p2 == p1.next()
        assert ml.last_position == p2
        assert not f1.done()
        await asyncio.gather(f1, f2)
        await st.close()

    run(main)


def test_entry_not_readable_before_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real = journal_mod._fdatasync

    def slow_sync(fd: int) -> None:
        gate.wait(5)
        real(fd)

    monkeypatch.setattr(journal_mod, "_fdatasync", slow_sync)

    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        lac = ml.last_add_confirmed
        pos, fut = ml.add_entry(b"pending")
        await asyncio.sleep(0.02)
        assert not fut.done()
        assert ml.last_add_confirmed == lac
        assert await ml.read_entries(EARLIEST, 10) == []
        assert await ml.read_entry(pos) is None
        assert ml.count_entries(EARLIEST, LATEST) == 0
        gate.set()
        await fut
        assert ml.last_add_confirmed == pos
        assert [e.data for e in await ml.read_entries(EARLIEST, 10)] == [b"pending"]
        await st.close()

    run(main)


def test_empty_entry_refused(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        with pytest.raises(ValueError):
            ml.add_entry(b"")
        await st.close()

    run(main)


def test_given_checksum_is_stored(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, cache_size_bytes=0).open()
        ml = st.open_managed_ledger("t")
        pos, fut = ml.add_entry(b"abc", crc32c(b"abc"))
        await fut
        entry = await ml.read_entry(pos)
        assert entry is not None
        assert entry.checksum == crc32c(b"abc")
        await st.close()

    run(main)


@pytest.mark.parametrize("cache", [0, 1 << 20])
def test_rollover_by_entries_and_reads_across_ledgers(tmp_path: Path, cache: int) -> None:
    async def main() -> None:
        st = storage(tmp_path, max_entries_per_ledger=10, cache_size_bytes=cache).open()
        ml = st.open_managed_ledger("t")
        positions = await fill(ml, 35)
        ids = sorted({p.ledger_id for p in positions})
        assert len(ids) == 4
        assert [info.entries for info in ml.ledgers] == [10, 10, 10, 5]
        assert [p.entry_id for p in positions] == [i % 10 for i in range(35)]
        entries = await all_entries(ml)
        assert [e.position for e in entries] == positions
        assert [e.data for e in entries] == [b"m%d" % i for i in range(35)]
        # Reads that start in the middle and cross two boundaries.
        chunk = await ml.read_entries(positions[8], 15)
        assert [e.position for e in chunk] == positions[8:23]
        # A start past the end of a closed ledger continues in the next one.
        past = await ml.read_entries(Position(ids[0], 10), 3)
        assert [e.position for e in past] == positions[10:13]
        # Reads in small steps following next_position visit every entry once.
        seen: list[Position] = []
        pos = ml.next_position(EARLIEST)
        while True:
            got = await ml.read_entries(pos, 3)
            if not got:
                break
            seen.extend(e.position for e in got)
            pos = ml.next_position(got[-1].position)
        assert seen == positions
        await st.close()

    run(main)


def test_rollover_by_size(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, max_size_per_ledger_mb=1).open()
        ml = st.open_managed_ledger("t")
        blob = b"z" * (300 * 1024)
        added = [ml.add_entry(blob) for _ in range(9)]
        await asyncio.gather(*(f for _, f in added))
        assert [info.entries for info in ml.ledgers] == [4, 4, 1]
        assert ml.total_size == 9 * len(blob)
        entries = await all_entries(ml)
        assert len(entries) == 9
        await st.close()

    run(main)


def test_max_bytes_limits_reads(tmp_path: Path) -> None:
    async def main() -> None:
        for cache in (0, 1 << 20):
            st = storage(tmp_path / str(cache), cache_size_bytes=cache).open()
            ml = st.open_managed_ledger("t")
            added = [ml.add_entry(bytes([65 + i]) * 100) for i in range(10)]
            await asyncio.gather(*(f for _, f in added))
            assert len(await ml.read_entries(EARLIEST, 10, max_bytes=250)) == 2
            assert len(await ml.read_entries(EARLIEST, 10, max_bytes=300)) == 3
            # At least one entry, however small the budget.
            assert len(await ml.read_entries(EARLIEST, 10, max_bytes=1)) == 1
            assert len(await ml.read_entries(EARLIEST, 4, max_bytes=10**6)) == 4
            await st.close()

    run(main)


def test_large_reads_go_through_the_thread_pool(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path, StorageConfig(cache_size_bytes=0, sync_read_max_bytes=1000)).open()
        ml = st.open_managed_ledger("t")
        added = [ml.add_entry(b"%06d" % i * 50) for i in range(200)]
        await asyncio.gather(*(f for _, f in added))
        main_thread = threading.get_ident()
        threads: set[int] = set()
        seg = st._ctx.segments  # type: ignore[union-attr]
        assert seg is not None
        from keyshared.storage import segment as segment_mod

        real = segment_mod.Segment.read_span

        def spy(self: segment_mod.Segment, *args: int) -> list[Entry]:
            threads.add(threading.get_ident())
            return real(self, *args)

        segment_mod.Segment.read_span = spy  # type: ignore[method-assign]
        try:
            big = await ml.read_entries(EARLIEST, 200)
            small = await ml.read_entries(EARLIEST, 2)
        finally:
            segment_mod.Segment.read_span = real  # type: ignore[method-assign]
        assert [e.data for e in big] == [b"%06d" % i * 50 for i in range(200)]
        assert len(small) == 2
        assert main_thread in threads
        assert len(threads) == 2
        await st.close()

    run(main)


def test_cache_eviction_falls_back_to_disk(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, cache_size_bytes=2000).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 100)
        assert st.cache.size <= 2000
        assert 0 < len(st.cache) < 100
        entries = await all_entries(ml)
        assert [e.data for e in entries] == [b"m%d" % i for i in range(100)]
        await st.close()

    run(main)


def test_next_and_previous_position(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, max_entries_per_ledger=3).open()
        ml = st.open_managed_ledger("t")
        positions = await fill(ml, 7)
        a, b, c = sorted({p.ledger_id for p in positions})
        assert ml.next_position(EARLIEST) == Position(a, 0)
        assert ml.next_position(Position(a, 0)) == Position(a, 1)
        assert ml.next_position(Position(a, 2)) == Position(b, 0)
        assert ml.next_position(Position(b, 2)) == Position(c, 0)
        # The current ledger grows: the next position is simply the next entry id.
        assert ml.next_position(Position(c, 0)) == Position(c, 1)
        assert ml.next_position(Position(c, 5)) == Position(c, 6)
        assert ml.next_position(Position(a, -1)) == Position(a, 0)
        assert ml.previous_position(Position(b, 0)) == Position(a, 2)
        assert ml.previous_position(Position(c, 0)) == Position(b, 2)
        assert ml.previous_position(Position(b, 2)) == Position(b, 1)
        assert ml.previous_position(Position(a, 0)) == Position(a, -1)
        assert ml.previous_position(ml.first_position) == Position(a, -1)  # type: ignore[arg-type]
        await st.close()

    run(main)


def test_count_entries(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, max_entries_per_ledger=4).open()
        ml = st.open_managed_ledger("t")
        positions = await fill(ml, 10)
        count = ml.count_entries
        assert count(EARLIEST, LATEST) == 10
        assert count(positions[0], positions[-1]) == 10
        assert count(positions[2], positions[2]) == 1
        assert count(positions[3], positions[4]) == 2  # across a boundary
        assert count(positions[1], positions[8]) == 8
        assert count(positions[5], positions[2]) == 0
        assert count(ml.next_position(ml.last_add_confirmed), LATEST) == 0
        lid = positions[0].ledger_id
        assert count(Position(lid, -1), Position(lid, 100)) == 4
        for i in range(10):
            for j in range(i, 10):
                assert count(positions[i], positions[j]) == j - i + 1
        await st.close()

    run(main)


def test_find_position(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, max_entries_per_ledger=7, cache_size_bytes=0).open()
        ml = st.open_managed_ledger("t")
        added = [ml.add_entry(b"%08d" % (i * 10)) for i in range(50)]
        await asyncio.gather(*(f for _, f in added))
        positions = [p for p, _ in added]

        def at_least(t: int) -> Callable[[Entry], bool]:
            return lambda e: int(e.data) >= t

        assert await ml.find_position(at_least(0)) == positions[0]
        assert await ml.find_position(at_least(1)) == positions[1]
        assert await ml.find_position(at_least(250)) == positions[25]
        assert await ml.find_position(at_least(251)) == positions[26]
        assert await ml.find_position(at_least(490)) == positions[49]
        assert await ml.find_position(at_least(491)) is None
        await st.close()

    run(main)


def test_find_position_in_empty_log(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        assert await ml.find_position(lambda e: True) is None
        await st.close()

    run(main)


def test_trim_deletes_whole_ledgers_before_position(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, max_entries_per_ledger=5).open()
        ml = st.open_managed_ledger("t")
        positions = await fill(ml, 23)
        ids = [info.ledger_id for info in ml.ledgers]
        assert len(ids) == 5
        size_before = ml.total_size
        assert ml.trim(positions[4]) == []  # entry 4 of ledger 0 is not before position 4
        assert ml.trim(positions[5]) == [ids[0]]
        assert not data_path(tmp_path / "ledgers", ids[0]).exists()
        assert ml.first_position == positions[5]
        assert ml.number_of_entries == 18
        assert ml.total_size == size_before - sum(len(b"m%d" % i) for i in range(5))
        assert ml.trim(positions[12]) == [ids[1]]
        # The current ledger is never trimmed, even if everything is before the position.
        assert ml.trim(LATEST) == [ids[2], ids[3]]
        assert [info.ledger_id for info in ml.ledgers] == [ids[4]]
        assert ml.number_of_entries == 3
        entries = await ml.read_entries(EARLIEST, 100)
        assert [e.position for e in entries] == positions[20:]
        # A position in a deleted ledger reads from the first surviving entry.
        entries = await ml.read_entries(positions[3], 100)
        assert [e.position for e in entries] == positions[20:]
        assert await ml.read_entry(positions[3]) is None
        assert ml.count_entries(EARLIEST, LATEST) == 3
        assert ml.next_position(positions[7]) == positions[20]
        await st.close()
        st = storage(tmp_path, max_entries_per_ledger=5).open()
        ml = st.open_managed_ledger("t")
        assert ml.ledgers[0].ledger_id == ids[4]
        assert [e.position for e in await all_entries(ml)] == positions[20:]
        await st.close()

    run(main)


def test_trim_waits_for_sealed_ledgers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    real = journal_mod._fdatasync
    monkeypatch.setattr(journal_mod, "_fdatasync", lambda fd: (gate.wait(5), real(fd)))

    async def main() -> None:
        st = storage(tmp_path, max_entries_per_ledger=2).open()
        ml = st.open_managed_ledger("t")
        added = [ml.add_entry(b"x") for _ in range(5)]
        # Nothing is durable: the full ledgers are sealed, not closed, and stay.
        assert ml.trim(LATEST) == []
        gate.set()
        await asyncio.gather(*(f for _, f in added))
        assert len(ml.trim(LATEST)) == 2
        await st.close()

    run(main)


def test_entries_listener_once_per_group(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        calls: list[Position] = []

        def listener() -> None:
            calls.append(ml.last_add_confirmed)

        ml.add_entries_listener(listener)
        await fill(ml, 200)
        assert 1 <= len(calls) <= st.journal.groups
        assert calls[-1] == ml.last_add_confirmed
        assert calls == sorted(calls)
        ml.remove_entries_listener(listener)
        ml.remove_entries_listener(listener)
        n = len(calls)
        await fill(ml, 5)
        assert len(calls) == n
        await st.close()

    run(main)


def test_listener_errors_do_not_break_appends(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")

        def bad() -> None:
            raise RuntimeError("boom")

        ml.add_entries_listener(bad)
        await fill(ml, 3)
        assert ml.number_of_entries == 3
        await st.close()

    run(main)


def test_write_failure_fails_appends_and_moves_to_a_new_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = journal_mod._pwritev
    fail = {"on": False}

    def flaky(fd: int, bufs: list[bytes], offset: int) -> int:
        if fail["on"]:
            raise OSError(5, "Input/output error")
        return real(fd, bufs, offset)

    monkeypatch.setattr(journal_mod, "_pwritev", flaky)

    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        good = await fill(ml, 3)
        first_ledger = ml.current_ledger_id
        fail["on"] = True
        _, fut = ml.add_entry(b"lost")
        with pytest.raises(StorageError):
            await fut
        fail["on"] = False
        # Fail-stop: the failed ledger takes nothing more, and no new ledger is made before
        # the back-off (a disk failing every write would otherwise burn a ledger a send).
        assert ml.backing_off
        with pytest.raises(StorageError, match="waiting for new ledger creation"):
            ml.add_entry(b"too soon")
        monkeypatch.setattr(ledger_rollover, "LEDGER_CREATION_BACKOFF_SECONDS", 0.0)
        assert not ml.backing_off
        assert ml.last_add_confirmed == good[-1]
        later = await fill(ml, 2, start=3)
        assert ml.current_ledger_id != first_ledger
        assert later[0] == Position(ml.current_ledger_id, 0)
        assert [e.position for e in await all_entries(ml)] == good + later
        assert ml.number_of_entries == 5
        assert ml.next_position(good[-1]) == later[0]
        await st.close()
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        assert [e.position for e in await all_entries(ml)] == good + later
        await st.close()

    run(main)


def test_close_waits_for_pending_appends(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        added = [ml.add_entry(b"p%d" % i) for i in range(100)]
        closing = ml.close()
        with pytest.raises(StorageError):
            ml.add_entry(b"late")
        with pytest.raises(StorageError):
            st.open_managed_ledger("t")  # still writing its last appends
        await closing
        assert all(f.done() and f.exception() is None for _, f in added)
        assert ml.is_closed
        with pytest.raises(StorageError):
            await ml.read_entries(EARLIEST, 1)
        ml2 = st.open_managed_ledger("t")
        assert ml2 is not ml
        assert [e.position for e in await all_entries(ml2)] == [p for p, _ in added]
        await st.close()

    run(main)


def test_close_without_awaiting(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        ml.add_entry(b"fire-and-forget")
        ml.close()
        await st.close()
        st = storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        assert [e.data for e in await all_entries(ml)] == [b"fire-and-forget"]
        await st.close()

    run(main)


def test_delete_removes_files_and_metadata(tmp_path: Path) -> None:
    async def main() -> None:
        st = storage(tmp_path, max_entries_per_ledger=2).open()
        ml = st.open_managed_ledger("t")
        other = st.open_managed_ledger("u")
        await fill(ml, 5)
        await fill(other, 1)
        await ml.delete()
        assert st.managed_ledger_names() == ["u"]
        remaining = sorted(p.name for p in (tmp_path / "ledgers").iterdir())
        uid = other.current_ledger_id
        assert remaining == [f"{uid}.idx", f"{uid}.log"]
        ml = st.open_managed_ledger("t")
        assert ml.number_of_entries == 0
        await st.close()

    run(main)


def test_concurrent_producers_share_few_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = journal_mod._fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(journal_mod, "_fdatasync", counting)

    async def main() -> None:
        st = storage(tmp_path).open()
        mls = [st.open_managed_ledger(f"t{i}") for i in range(4)]

        async def producer(ml: ManagedLedger) -> None:
            futs = []
            for i in range(250):
                futs.append(ml.add_entry(b"e%d" % i)[1])
                if i % 50 == 0:
                    await asyncio.sleep(0)
            await asyncio.gather(*futs)

        await asyncio.gather(*(producer(ml) for ml in mls))
        assert sum(ml.number_of_entries for ml in mls) == 1000
        # One sync per touched file per group: far fewer than one per append.
        assert len(calls) <= 4 * st.journal.groups
        assert len(calls) < 200
        await st.close()

    run(main)


def open_fds() -> int:
    import os

    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("cache", [0, 1 << 20])
def test_idle_writable_ledgers_park_their_files(tmp_path: Path, cache: int) -> None:
    """Beyond max_open_writable_segments, the least recently used idle open ledgers close their
    files and reopen them on the next append or read; nothing is lost, across rollovers,
    deletes and a reopen of the storage."""

    async def main() -> None:
        st = storage(
            tmp_path,
            max_open_writable_segments=3,
            max_entries_per_ledger=7,
            cache_size_bytes=cache,
        ).open()
        before = open_fds()
        mls = [st.open_managed_ledger(f"public/default/t{i}") for i in range(12)]
        # 12 open ledgers, 3 of them with their two files open.
        assert open_fds() - before == 6
        written: list[list[Position]] = [[] for _ in mls]
        for rnd in range(4):
            for i, ml in enumerate(mls):
                written[i] += await fill(ml, 3, start=rnd * 3)
                assert open_fds() - before <= 6 + 2 * 12  # read pool: closed ledgers
        pool = st._ctx.writable  # type: ignore[union-attr]
        assert pool.parks > 0 and pool.unparks > 0 and len(pool) <= 3
        for i, ml in enumerate(mls):
            got = await all_entries(ml)
            assert [e.position for e in got] == written[i]
            assert [e.data for e in got] == [b"m%d" % k for k in range(12)]
        # A parked ledger deleted, another closed while parked.
        await mls[0].delete()
        mls[1].close()
        await st.close()
        st = storage(tmp_path, max_open_writable_segments=3, max_entries_per_ledger=7).open()
        for i in range(1, 12):
            ml = st.open_managed_ledger(f"public/default/t{i}")
            got = await all_entries(ml)
            assert [e.data for e in got] == [b"m%d" % k for k in range(12)]
        await st.close()

    run(main)
