"""The group-commit journal: batching, fsync counts, ordering, failures, completion on the loop."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from crc32c import crc32c

import keyshared.storage.journal as journal_mod
from keyshared.storage.errors import StorageError
from keyshared.storage.journal import Journal
from keyshared.storage.segment import Segment


def run(coro_fn: Callable[[], object]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


class SyncCounter:
    """Counts fdatasync calls; optionally holds the writer inside one so appends pile up."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate: threading.Event | None = None

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.gate is not None:
            self.gate.wait(5)
        os.fdatasync(fd)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> SyncCounter:
    counter = SyncCounter()
    monkeypatch.setattr(journal_mod, "_fdatasync", counter)
    return counter


def test_many_concurrent_appends_few_syncs(tmp_path: Path, syncs: SyncCounter) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        journal = Journal(loop, sync_data=True)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        # Hold the writer in its first sync so the rest of the appends form one group.
        syncs.gate = threading.Event()
        first = journal.submit(seg, b"first", crc32c(b"first"))
        while syncs.calls == 0:
            await asyncio.sleep(0.001)
        futs = [journal.submit(seg, b"x%d" % i, crc32c(b"x%d" % i)) for i in range(2000)]
        syncs.gate.set()
        await first
        await asyncio.gather(*futs)
        await journal.close()
        assert syncs.calls == 2
        assert journal.groups == 2
        assert journal.appends == 2001
        seg.close()
        reopened = Segment.open(tmp_path, 1)
        assert reopened.count == 2001
        assert [e.data for e in reopened.read(1, 4)] == [b"x0", b"x1", b"x2"]
        reopened.close()

    run(main)


def test_one_sync_per_touched_file_per_group(tmp_path: Path, syncs: SyncCounter) -> None:
    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=True)
        journal.start()
        segs = [Segment.create(tmp_path, i) for i in range(3)]
        syncs.gate = threading.Event()
        first = journal.submit(segs[0], b"a", crc32c(b"a"))
        while syncs.calls == 0:
            await asyncio.sleep(0.001)
        futs = [journal.submit(segs[i % 3], b"b", crc32c(b"b")) for i in range(300)]
        syncs.gate.set()
        await asyncio.gather(first, *futs)
        await journal.close()
        assert syncs.calls == 1 + 3
        for seg in segs:
            seg.close()

    run(main)


def test_no_sync_when_sync_data_off(tmp_path: Path, syncs: SyncCounter) -> None:
    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=False)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        await asyncio.gather(*(journal.submit(seg, b"z", crc32c(b"z")) for _ in range(100)))
        await journal.close()
        assert syncs.calls == 0
        seg.close()

    run(main)


def test_new_file_directory_is_synced_once(
    tmp_path: Path, syncs: SyncCounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    dir_syncs: list[int] = []

    def fake_fsync(fd: int) -> None:
        dir_syncs.append(fd)
        os.fsync(fd)

    monkeypatch.setattr(journal_mod, "_fsync", fake_fsync)

    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=True)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        for _ in range(3):
            await journal.submit(seg, b"q", crc32c(b"q"))
        await journal.close()
        seg.close()

    run(main)
    assert len(dir_syncs) == 1


def test_completions_in_submission_order_one_callback_per_group(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        journal = Journal(loop, sync_data=True)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        done: list[int] = []
        notified: list[tuple[int, int]] = []
        seg.on_durable = lambda durable, n: notified.append((durable, n))
        futs = []
        for i in range(500):
            fut = journal.submit(seg, b"%d" % i, crc32c(b"%d" % i))
            fut.add_done_callback(lambda _f, i=i: done.append(i))
            futs.append(fut)
            if i % 50 == 0:
                await asyncio.sleep(0)
        await asyncio.gather(*futs)
        await asyncio.sleep(0)
        await journal.close()
        assert done == list(range(500))
        assert sum(n for _, n in notified) == 500
        assert [d for d, _ in notified] == sorted(d for d, _ in notified)
        assert notified[-1][0] == 500
        assert len(notified) == journal.groups
        assert seg.durable == 500
        seg.close()

    run(main)


def test_completions_run_on_the_loop_thread(tmp_path: Path) -> None:
    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=False)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        threads: list[int] = []
        seg.on_durable = lambda _d, _n: threads.append(threading.get_ident())
        await journal.submit(seg, b"a", crc32c(b"a"))
        await journal.close()
        assert threads == [threading.get_ident()]
        seg.close()

    run(main)


def test_write_error_fails_that_segment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = journal_mod._pwritev
    bad: set[int] = set()

    def flaky(fd: int, bufs: list[bytes], offset: int) -> int:
        if fd in bad:
            raise OSError(28, "No space left on device")
        return real(fd, bufs, offset)

    monkeypatch.setattr(journal_mod, "_pwritev", flaky)

    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=True)
        journal.start()
        good, broken = Segment.create(tmp_path, 1), Segment.create(tmp_path, 2)
        failures: list[tuple[StorageError, int]] = []
        broken.on_failed = lambda err, n: failures.append((err, n))
        await journal.submit(broken, b"ok", crc32c(b"ok"))
        bad.add(broken.fd)
        f1 = journal.submit(broken, b"lost", crc32c(b"lost"))
        f2 = journal.submit(good, b"fine", crc32c(b"fine"))
        with pytest.raises(StorageError):
            await f1
        await f2
        # Later writes to a failed segment fail without touching the file.
        bad.clear()
        with pytest.raises(StorageError):
            await journal.submit(broken, b"after", crc32c(b"after"))
        await journal.close()
        assert broken.durable == 1
        assert good.durable == 1
        assert sum(n for _, n in failures) == 2
        assert broken.users == 0
        good.close()
        broken.close()

    run(main)


def test_partial_writes_are_resumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = journal_mod._pwritev

    def short(fd: int, bufs: list[bytes], offset: int) -> int:
        # Write at most 5 bytes per call.
        first = bytes(bufs[0])[:5]
        return real(fd, [first], offset)

    monkeypatch.setattr(journal_mod, "_pwritev", short)

    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=False)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        datas = [b"abcdefghijk" * (i + 1) for i in range(5)]
        await asyncio.gather(*(journal.submit(seg, d, crc32c(d)) for d in datas))
        await journal.close()
        seg.close()
        reopened = Segment.open(tmp_path, 1)
        assert [e.data for e in reopened.read(0, 5)] == datas
        reopened.close()

    run(main)


def test_more_records_than_iov_max(tmp_path: Path, syncs: SyncCounter) -> None:
    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=True)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        syncs.gate = threading.Event()
        first = journal.submit(seg, b"0", crc32c(b"0"))
        while syncs.calls == 0:
            await asyncio.sleep(0.001)
        futs = [journal.submit(seg, b"r%d" % i, crc32c(b"r%d" % i)) for i in range(3000)]
        syncs.gate.set()
        await asyncio.gather(first, *futs)
        await journal.close()
        seg.close()
        reopened = Segment.open(tmp_path, 1)
        assert reopened.count == 3001
        assert reopened.read(3000, 3001)[0].data == b"r2999"
        reopened.close()

    run(main)


def test_submit_after_close_raises(tmp_path: Path) -> None:
    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=False)
        journal.start()
        await journal.close()
        seg = Segment.create(tmp_path, 1)
        with pytest.raises(StorageError):
            journal.submit(seg, b"x", crc32c(b"x"))
        seg.close()

    run(main)


def test_close_drains_queued_appends(tmp_path: Path) -> None:
    async def main() -> None:
        journal = Journal(asyncio.get_running_loop(), sync_data=True)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        futs = [journal.submit(seg, b"d", crc32c(b"d")) for _ in range(200)]
        await journal.close()
        assert all(f.done() and f.exception() is None for f in futs)
        seg.close()

    run(main)


def test_callbacks_run_in_order_after_the_sync_and_one_raising_stops_none(
    tmp_path: Path, syncs: SyncCounter
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        journal = Journal(loop, sync_data=True)
        journal.start()
        seg = Segment.create(tmp_path, 1)
        seen: list[tuple[int, int, BaseException | None]] = []
        done = loop.create_future()

        def callback(i: int) -> Callable[[BaseException | None], None]:
            def call(exc: BaseException | None) -> None:
                seen.append((i, syncs.calls, exc))
                if i == 3:
                    raise RuntimeError("a bug in one owner")
                if i == 9:
                    done.set_result(None)

            return call

        for i in range(10):
            journal.submit_callback(seg, b"e%d" % i, crc32c(b"e%d" % i), callback(i))
        await asyncio.wait_for(done, 5)
        await journal.close()
        assert [i for i, _, _ in seen] == list(range(10))
        # Every callback ran after at least one sync, and none was told of a failure.
        assert all(calls >= 1 and exc is None for _, calls, exc in seen)
        assert seg.durable == 10

    run(main)
