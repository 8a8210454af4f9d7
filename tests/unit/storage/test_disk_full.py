"""A full disk in the storage layer: the disk monitor's thresholds, SQLITE_FULL in the metadata
store, ENOSPC in the journal. The real thing (a full tmpfs, the official client) is in
tests/integration/test_disk_full.py; here each rule on its own, with the journal's syscall seam
and SQLite's own page limit."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import keyshared.storage.journal as journal_mod
from keyshared.storage.config import StorageConfig
from keyshared.storage.disk import BALLAST_NAME, DiskMonitor, DiskThresholds
from keyshared.storage.errors import DiskFullError, StorageError, is_disk_full
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.store import Storage


class FakeDisk:
    """statvfs of a 1,000-block file system whose used blocks the test sets."""

    def __init__(self) -> None:
        self.used = 0

    def __call__(self, path: Path) -> Any:
        return SimpleNamespace(f_blocks=1000, f_frsize=4096, f_bavail=1000 - self.used)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def monitor(tmp_path: Path, **kw: float) -> tuple[DiskMonitor, FakeDisk, Clock]:
    disk, clock = FakeDisk(), Clock()
    m = DiskMonitor(tmp_path, DiskThresholds(**kw), clock=clock, statvfs=disk)
    return m, disk, clock


def test_thresholds_warn_once_refuse_above_and_resume_below_the_low_water_mark(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m, disk, clock = monitor(tmp_path, usage=0.95, warn=0.90, lwm=0.80)
    disk.used = 500
    assert m.check() == 0.5 and m.writable()
    disk.used = 910
    m.check()
    m.check()
    assert m.writable()
    assert sum("diskUsageWarnThreshold" in r.message for r in caplog.records) == 1
    disk.used = 960
    m.check()
    assert m.read_only and not m.writable()
    # Below the threshold but above the low-water mark: still read-only (no flapping).
    disk.used = 900
    clock.now += 1
    assert not m.writable()
    disk.used = 790
    clock.now += 1
    assert m.writable()
    assert m.read_only_episodes == 1


def test_a_fast_writer_cannot_run_past_the_threshold_between_periodic_checks(
    tmp_path: Path,
) -> None:
    m, disk, _ = monitor(tmp_path, usage=0.95, warn=0.95, lwm=0.90)
    disk.used = 500
    m.check()
    # Writes are counted: usage is measured again once half the room left may be used.
    room = int((0.95 - 0.5) * 1000 * 4096)
    assert m.writable(room // 4)
    disk.used = 980
    assert not m.writable(room // 2)
    assert m.read_only


def test_enospc_blocks_for_a_growing_back_off_even_with_room(tmp_path: Path) -> None:
    m, disk, clock = monitor(tmp_path, usage=0.95, warn=0.95, lwm=0.90)
    disk.used = 100
    m.check()
    enospc = OSError(errno.ENOSPC, "No space left on device")
    m.note_full(enospc)
    assert m.read_only
    clock.now += 0.3
    assert not m.writable()  # within the first back-off (0.5 s)
    clock.now += 0.3
    assert m.writable()
    # Failing again right after: a longer back-off.
    m.note_full(enospc)
    clock.now += 0.6
    assert not m.writable()
    clock.now += 0.5
    assert m.writable()
    # More failures while read-only do not push the end of the back-off.
    m.note_full(enospc)
    for _ in range(5):
        clock.now += 0.5
        m.note_full(enospc)
    clock.now += 2.0
    assert m.writable()


def test_the_ballast_is_released_on_enospc_and_made_again_once_writable(tmp_path: Path) -> None:
    m, disk, clock = monitor(tmp_path)
    disk.used = 100
    m.check()
    m.ensure_ballast()
    ballast = tmp_path / BALLAST_NAME
    assert ballast.stat().st_size == 256 * 1024
    m.note_full(OSError(errno.ENOSPC, "full"))
    assert not ballast.exists()
    clock.now += 1
    assert m.writable()
    assert ballast.stat().st_size == 256 * 1024


def test_bad_thresholds_are_refused() -> None:
    with pytest.raises(ValueError, match="diskUsageLwmThreshold"):
        DiskThresholds(usage=0.9, lwm=0.95)
    with pytest.raises(ValueError, match="diskUsageThreshold"):
        DiskThresholds(usage=1.5)


def test_sqlite_full_rolls_back_and_leaves_the_store_usable(tmp_path: Path) -> None:
    store = MetadataStore(tmp_path / "m.sqlite")
    seen: list[StorageError] = []
    store.on_full = seen.append
    store.put("keep", b"1")
    # SQLite's own limit on the database's pages gives a real SQLITE_FULL.
    store._conn.execute("PRAGMA max_page_count = 8")
    with pytest.raises(DiskFullError):
        store.put_many({f"batch/{i}": os.urandom(2000) for i in range(100)}, deletes=["keep"])
    assert len(seen) == 1 and is_disk_full(seen[0])
    # All or nothing: "keep" is still there, none of the batch is, and the store works.
    assert store.get("keep") == b"1"
    assert store.list_keys("batch/") == []
    store.put_many({"small": b"2"})
    assert store.get("small") == b"2"
    store.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_enospc_fails_the_appends_refuses_more_and_close_does_not_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = journal_mod._pwritev
    full = threading.Event()

    def pwritev(fd: int, bufs: list[Any], offset: int) -> int:
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, bufs, offset)

    monkeypatch.setattr(journal_mod, "_pwritev", pwritev)

    async def main() -> None:
        storage = Storage(tmp_path / "data", StorageConfig()).open()
        ml = storage.open_managed_ledger("t")
        _, fut = ml.add_entry(b"stored")
        await fut
        first_ledger = ml.current_ledger_id
        full.set()
        # Several groups queued behind the failing one.
        futs = []
        for i in range(50):
            try:
                futs.append(ml.add_entry(b"x%d" % i)[1])
            except DiskFullError:
                break  # the first group already failed: refused from now on
            if i % 10 == 0:
                await asyncio.sleep(0)
        results = await asyncio.gather(*futs, return_exceptions=True)
        assert results and all(isinstance(r, DiskFullError) for r in results)
        assert storage.disk.read_only
        # Refused at once: no ledger is created (no id burnt) while the disk is full.
        for _ in range(20):
            with pytest.raises(DiskFullError):
                ml.add_entry(b"more")
        assert ml.current_ledger_id == -1
        assert [li.ledger_id for li in ml.ledgers] == [first_ledger]
        assert ml.number_of_entries == 1 and ml.pending_add_entries == 0
        await asyncio.wait_for(storage.close(), 5)

    run(main())
    full.clear()

    async def reopen() -> None:
        storage = Storage(tmp_path / "data", StorageConfig()).open()
        ml = storage.open_managed_ledger("t")
        # Only the confirmed entry survived; the next ledger id follows the last one used.
        entries = await ml.read_entries(ml.first_position or ml.last_add_confirmed, 100)
        assert [e.data for e in entries] == [b"stored"]
        assert ml.current_ledger_id == 2
        await storage.close()

    run(reopen())


def test_a_managed_ledger_opens_on_a_full_disk_and_serves_what_it_has(tmp_path: Path) -> None:
    async def write() -> None:
        storage = Storage(tmp_path / "data", StorageConfig()).open()
        ml = storage.open_managed_ledger("t")
        await asyncio.gather(*(ml.add_entry(b"e%d" % i)[1] for i in range(3)))
        await storage.close()

    run(write())
    # Thresholds below the file system's real usage: the storage opens read-only.
    full = StorageConfig(disk=DiskThresholds(usage=1e-6, warn=1e-6, lwm=1e-7))

    async def read() -> None:
        storage = Storage(tmp_path / "data", full).open()
        assert storage.disk.read_only
        ml = storage.open_managed_ledger("t")
        assert ml.current_ledger_id == -1
        start = ml.first_position
        assert start is not None
        assert [e.data for e in await ml.read_entries(start, 10)] == [b"e0", b"e1", b"e2"]
        with pytest.raises(DiskFullError):
            ml.add_entry(b"refused")
        await storage.close()

    run(read())

    async def resume() -> None:
        storage = Storage(tmp_path / "data", StorageConfig()).open()
        ml = storage.open_managed_ledger("t")
        await ml.add_entry(b"e3")[1]
        start = ml.first_position
        assert start is not None
        assert [e.data for e in await ml.read_entries(start, 10)] == [b"e0", b"e1", b"e2", b"e3"]
        await storage.close()

    run(resume())
