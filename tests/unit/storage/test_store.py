"""The Storage: restart and recovery, new ledger per open, directory lock, deletion, open time."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from keyshared.storage.config import StorageConfig
from keyshared.storage.errors import StorageError
from keyshared.storage.ledger import ManagedLedger
from keyshared.storage.position import EARLIEST, Position
from keyshared.storage.segment import HEADER, data_path, index_path
from keyshared.storage.store import NEXT_LEDGER_ID_KEY, Storage


def run(fn: Callable[[], Awaitable[None]]) -> None:
    async def main() -> None:
        await fn()

    asyncio.run(main())


async def fill(ml: ManagedLedger, n: int, tag: bytes = b"m") -> list[Position]:
    added = [ml.add_entry(tag + b"%d" % i) for i in range(n)]
    await asyncio.gather(*(fut for _, fut in added))
    return [pos for pos, _ in added]


async def contents(ml: ManagedLedger) -> list[tuple[Position, bytes]]:
    return [(e.position, e.data) for e in await ml.read_entries(EARLIEST, 10**9)]


async def crash(st: Storage) -> None:
    """Drop a storage as a crash would: no managed ledger is closed, nothing is recorded.

    (The journal is drained so no write lands after the reopen; the SIGKILL test covers a
    crash mid-write.)"""
    ctx = st._ctx
    assert ctx is not None
    await ctx.journal.close()
    ctx.segments.close_all()
    ctx.metadata.close()
    os.close(st._lock_fd)
    st._ctx = None


def test_open_is_fast_and_lazy(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path).open()
        for i in range(20):
            await fill(st.open_managed_ledger(f"t{i}"), 3)
        await st.close()
        start = time.perf_counter()
        st = Storage(tmp_path).open()
        elapsed = time.perf_counter() - start
        assert elapsed < 0.5
        assert len(st.managed_ledger_names()) == 20
        # No ledger file is open until a managed ledger is.
        assert len(st._ctx.segments) == 0  # type: ignore[union-attr]
        await st.close()

    run(main)


def test_open_needs_a_loop(tmp_path: Path) -> None:
    with pytest.raises(StorageError):
        Storage(tmp_path).open()


def test_restart_keeps_entries_and_opens_a_new_ledger(tmp_path: Path) -> None:
    async def main() -> None:
        config = StorageConfig(max_entries_per_ledger=4)
        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 10)
        before = await contents(ml)
        lac = ml.last_add_confirmed
        last_ledger = ml.current_ledger_id
        await st.close()

        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        assert await contents(ml) == before
        assert ml.last_add_confirmed == lac
        assert ml.current_ledger_id > last_ledger
        new_ledger = ml.current_ledger_id
        after = await fill(ml, 2, b"n")
        assert after == [Position(new_ledger, 0), Position(new_ledger, 1)]
        assert ml.next_position(lac) == after[0]
        await st.close()

        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        assert [p for p, _ in await contents(ml)] == [p for p, _ in before] + after
        assert ml.current_ledger_id > new_ledger
        await st.close()

    run(main)


def test_ledger_ids_are_storage_wide_and_never_reused(tmp_path: Path) -> None:
    async def main() -> None:
        seen: list[int] = []
        for _ in range(3):
            st = Storage(tmp_path).open()
            for name in ("a", "b"):
                ml = st.open_managed_ledger(name)
                seen.append(ml.current_ledger_id)
                await fill(ml, 1)
            await st.close()
        assert seen == sorted(seen)
        assert len(set(seen)) == len(seen)

    run(main)


def test_empty_ledgers_are_not_kept_across_restarts(tmp_path: Path) -> None:
    async def main() -> None:
        for _ in range(3):
            st = Storage(tmp_path).open()
            ml = st.open_managed_ledger("t")
            await st.close()
        st = Storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        assert len(ml.ledgers) == 1
        assert ml.first_position is None
        assert sorted(os.listdir(tmp_path / "ledgers")) == sorted(
            [f"{ml.current_ledger_id}.log", f"{ml.current_ledger_id}.idx"]
        )
        await st.close()

    run(main)


def test_recovery_after_crash_without_close(tmp_path: Path) -> None:
    async def main() -> None:
        config = StorageConfig(max_entries_per_ledger=7)
        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 20)
        before = await contents(ml)
        await crash(st)

        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        assert await contents(ml) == before
        assert ml.number_of_entries == 20
        await st.close()

    run(main)


def test_recovery_truncates_torn_tail_of_last_ledger(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 10)
        before = await contents(ml)
        ledger = ml.current_ledger_id
        await crash(st)
        path = data_path(tmp_path / "ledgers", ledger)
        good_size = path.stat().st_size
        with open(path, "ab") as f:
            f.write(HEADER.pack(50, 1234) + b"half a rec")  # a torn append

        st = Storage(tmp_path).open()
        ml = st.open_managed_ledger("t")
        assert await contents(ml) == before
        assert path.stat().st_size == good_size
        assert ml.next_position(before[-1][0]) == Position(ml.current_ledger_id, 0)
        await st.close()

    run(main)


def test_recovery_without_index_files(tmp_path: Path) -> None:
    async def main() -> None:
        config = StorageConfig(max_entries_per_ledger=5, cache_size_bytes=0)
        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 12)
        before = await contents(ml)
        ids = [info.ledger_id for info in ml.ledgers]
        await crash(st)
        for ledger_id in ids:
            index_path(tmp_path / "ledgers", ledger_id).unlink()

        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        assert await contents(ml) == before
        await st.close()

    run(main)


def test_closed_ledger_with_extra_records_is_cut_to_its_count(tmp_path: Path) -> None:
    """Records past a closed ledger's recorded count were never confirmed: they go."""

    async def main() -> None:
        config = StorageConfig(cache_size_bytes=0)
        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 3)
        before = await contents(ml)
        ledger = ml.current_ledger_id
        await st.close()
        path = data_path(tmp_path / "ledgers", ledger)
        with open(path, "ab") as f:
            from crc32c import crc32c

            f.write(HEADER.pack(5, crc32c(b"ghost")) + b"ghost")

        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        assert await contents(ml) == before
        assert ml.count_entries(EARLIEST, ml.last_add_confirmed) == 3
        await st.close()

    run(main)


def test_directory_is_locked(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path).open()
        with pytest.raises(StorageError):
            Storage(tmp_path).open()
        await st.close()
        st = Storage(tmp_path).open()
        await st.close()

    run(main)


def test_same_instance_while_open(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path).open()
        assert st.open_managed_ledger("t") is st.open_managed_ledger("t")
        assert st.get_managed_ledger("t") is st.open_managed_ledger("t")
        assert st.get_managed_ledger("nope") is None
        await st.close()
        assert not st.is_open
        with pytest.raises(StorageError):
            st.open_managed_ledger("t")

    run(main)


def test_names_and_delete(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path).open()
        for name in ("persistent://public/default/a", "b", "c"):
            await fill(st.open_managed_ledger(name), 2)
        assert st.managed_ledger_names() == ["b", "c", "persistent://public/default/a"]
        c_ledger = st.open_managed_ledger("c").current_ledger_id
        await st.delete_managed_ledger("b")
        await st.close()

        st = Storage(tmp_path).open()
        # Deleting a managed ledger that is not open does not open it.
        await st.delete_managed_ledger("c")
        await st.delete_managed_ledger("never-existed")
        assert st.managed_ledger_names() == ["persistent://public/default/a"]
        assert not data_path(tmp_path / "ledgers", c_ledger).exists()
        ml = st.open_managed_ledger("persistent://public/default/a")
        assert len(await contents(ml)) == 2
        await st.close()

    run(main)


def test_metadata_is_shared_and_counter_persisted(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path).open()
        st.metadata.put("topics/x", b"{}")
        ml = st.open_managed_ledger("t")
        current = ml.current_ledger_id
        assert int(st.metadata.get(NEXT_LEDGER_ID_KEY) or b"0") == current + 1
        await st.close()
        st = Storage(tmp_path).open()
        assert st.metadata.get("topics/x") == b"{}"
        assert st.loop is asyncio.get_running_loop()
        await st.close()

    run(main)


def test_journal_sync_data_off(tmp_path: Path) -> None:
    async def main() -> None:
        st = Storage(tmp_path, StorageConfig(journal_sync_data=False)).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 50)
        assert st.journal.syncs == 0
        await st.close()
        st = Storage(tmp_path).open()
        assert len(await contents(st.open_managed_ledger("t"))) == 50
        await st.close()

    run(main)


def test_many_ledgers_read_through_a_small_pool(tmp_path: Path) -> None:
    async def main() -> None:
        config = StorageConfig(max_entries_per_ledger=2, cache_size_bytes=0, max_open_segments=3)
        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        await fill(ml, 30)
        before = await contents(ml)
        await st.close()
        st = Storage(tmp_path, config).open()
        ml = st.open_managed_ledger("t")
        for _ in range(2):
            assert await contents(ml) == before
        assert len(st._ctx.segments) <= 3  # type: ignore[union-attr]
        await st.close()

    run(main)
