"""The group-commit writer: one background thread writes and syncs appends for every ledger.

Like BookKeeper's journal, the thread takes everything queued since its last round (a *group*),
writes each touched segment's records with ``pwritev`` (header and data as separate buffers, no
copy), appends their offsets to the segment's index, calls ``fdatasync`` once per touched file
(when ``sync_data`` is on), and then completes the whole group on the event loop with a single
``call_soon_threadsafe``. While one group syncs the next one accumulates, so the number of syncs
per second stays bounded by the disk's sync latency, not by the append rate.

Ordering: the queue is FIFO and there is one thread, so appends complete in submission order,
per segment and across segments (a ledger rolled over completes before its successor).

The syscalls are module-level names (``_pwritev``, ``_fdatasync``, ``_fsync``) so tests can
count or fail them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from array import array
from collections import deque
from collections.abc import Callable
from typing import TypeAlias, TypeVar

from keyshared.storage.errors import DiskFullError, StorageError, is_disk_full
from keyshared.storage.segment import HEADER, Segment, offsets_to_bytes

log = logging.getLogger(__name__)

_pwritev = os.pwritev
_pwrite = os.pwrite
_write = os.write
_fdatasync = os.fdatasync
_fsync = os.fsync

_IOV_MAX = 1024
_T = TypeVar("_T")

Done: TypeAlias = Callable[[BaseException | None], None]
"""Called on the loop once an append is durable (None) or failed (the error)."""

# (segment, offset, data, crc, done): a tuple is the cheapest record to build per append.
_Item: TypeAlias = tuple[Segment, int, bytes, int, Done]
_Groups: TypeAlias = dict[Segment, list[_Item]]


class Journal:
    """The writer thread shared by all ledgers of one storage."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, sync_data: bool = True) -> None:
        self._loop = loop
        self._sync = sync_data
        self._cond = threading.Condition(threading.Lock())
        # deque.append and popleft are atomic: submit takes the lock only to wake an idle writer.
        self._queue: deque[_Item] = deque()
        self._idle = False
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="keyshared-journal", daemon=True)
        self._exited: asyncio.Future[None] = loop.create_future()
        # Counters, written by the writer thread only; read them for stats and tests.
        self.groups = 0
        self.appends = 0
        self.syncs = 0
        # Called on the loop, before the owners hear of it, when a write fails for lack of
        # space (the storage's DiskMonitor turns read-only so nobody retries at once).
        self.on_full: Callable[[BaseException], None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop on which appends complete."""
        return self._loop

    @property
    def sync_data(self) -> bool:
        """Whether appends are fdatasync'ed before they complete."""
        return self._sync

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    def submit(self, segment: Segment, data: bytes, crc: int) -> asyncio.Future[None]:
        """Queue one record for ``segment``; call on the loop.

        Reserves the record's offset now (so the entry id is ``segment.count - 1`` on return).
        The future completes once the record is written, and synced under the policy, or fails
        with :class:`StorageError`.
        """
        fut: asyncio.Future[None] = self._loop.create_future()
        self.submit_callback(segment, data, crc, functools.partial(resolve_future, fut))
        return fut

    def submit_callback(self, segment: Segment, data: bytes, crc: int, done: Done) -> None:
        """As :meth:`submit`, but ``done`` is called instead of a future being resolved.

        ``done`` runs on the loop inside the group's completion, in submission order, right
        after the segment's owner heard of it: no future, no callback handle per append (the
        publish path's hand-off, ``bench/results/profiles/publish-before.md``). An exception
        it raises is logged and does not keep the appends after it from completing.
        """
        if self._closing:
            raise StorageError("journal is closed")
        offset = segment.reserve(len(data))
        segment.users += 1
        self._queue.append((segment, offset, data, crc, done))
        # The writer sets _idle (under the lock) before its last look at the queue, so either it
        # sees this item or we see _idle and wake it.
        if self._idle:
            with self._cond:
                self._cond.notify()

    async def close(self) -> None:
        """Write and complete everything queued, then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.ident is None:  # never started
            return
        await self._exited
        self._thread.join()

    # --- writer thread ---------------------------------------------------------------------

    def _run(self) -> None:
        queue = self._queue
        try:
            while True:
                if not queue:
                    with self._cond:
                        self._idle = True
                        while not queue and not self._closing:
                            self._cond.wait()
                        self._idle = False
                n = len(queue)
                if n:
                    self._process([queue.popleft() for _ in range(n)])
                elif self._closing:
                    break
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                self._loop.call_soon_threadsafe(_set_done, self._exited)

    def _process(self, batch: list[_Item]) -> None:
        groups: _Groups = {}
        for item in batch:
            items = groups.get(item[0])
            if items is None:
                groups[item[0]] = [item]
            else:
                items.append(item)
        failures: dict[Segment, BaseException] = {}
        for seg, items in groups.items():
            if seg.failed is not None:
                failures[seg] = seg.failed
                continue
            try:
                _write_records(seg, items)
            except Exception as exc:  # OSError mostly; anything else must not kill the thread
                log.error("ledger %d: write failed: %s", seg.ledger_id, exc)
                seg.failed = exc
                failures[seg] = exc
                if is_disk_full(exc):
                    # Cut the records of this group that did fit: none will be confirmed, and
                    # a restart that scans the file must not find them (their producers resend).
                    with contextlib.suppress(OSError):
                        os.ftruncate(seg.fd, items[0][1])
        if self._sync:
            # New files' names: one sync of their directory covers every file created before it
            # (all segments of a storage share one), not one each: 10,000 new topics' first
            # messages were 10,000 directory syncs, each opening the directory.
            synced_dirs: set[object] = set()
            for seg in groups:
                if seg in failures or not seg.needs_dir_sync:
                    continue
                if seg.directory in synced_dirs:
                    seg.needs_dir_sync = False
                    continue
                try:
                    _sync_directory(seg)
                    synced_dirs.add(seg.directory)
                except Exception as exc:
                    log.error("ledger %d: sync failed: %s", seg.ledger_id, exc)
                    seg.failed = exc
                    failures[seg] = exc
            for seg in groups:
                if seg in failures:
                    continue
                try:
                    _fdatasync(seg.fd)
                    self.syncs += 1
                except Exception as exc:
                    log.error("ledger %d: sync failed: %s", seg.ledger_id, exc)
                    seg.failed = exc
                    failures[seg] = exc
        self.groups += 1
        self.appends += len(batch)
        try:
            self._loop.call_soon_threadsafe(_complete, groups, failures, self.on_full)
        except RuntimeError:
            log.error("journal: event loop closed, %d appends left unconfirmed", len(batch))


def _set_done(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _write_records(seg: Segment, items: list[_Item]) -> None:
    pack = HEADER.pack
    bufs: list[bytes | memoryview] = []
    add = bufs.append
    for _, _, data, crc, _ in items:
        add(pack(len(data), crc))
        add(data)
    _pwritev_all(seg.fd, bufs, items[0][1])
    if seg.index_fd >= 0:
        index = array("Q", [item[1] for item in items])
        view = memoryview(offsets_to_bytes(index))
        while view:
            view = view[_write(seg.index_fd, view) :]


def _pwritev_all(fd: int, bufs: list[bytes | memoryview], offset: int) -> None:
    """Write all of ``bufs`` at ``offset``, in IOV_MAX-sized calls, resuming partial writes."""
    i = 0
    while i < len(bufs):
        chunk = bufs[i : i + _IOV_MAX]
        written = _pwritev(fd, chunk, offset)
        offset += written
        total = sum(map(len, chunk))
        if written == total:
            i += len(chunk)
            continue
        if written <= 0:
            raise OSError(f"pwritev wrote {written} of {total} bytes")
        # Partial write: drop the buffers written in full, cut the one written in part.
        k = 0
        while written >= len(chunk[k]):
            written -= len(chunk[k])
            k += 1
        rest: list[bytes | memoryview] = [memoryview(chunk[k])[written:]]
        bufs = rest + chunk[k + 1 :] + bufs[i + len(chunk) :]
        i = 0


def _sync_directory(seg: Segment) -> None:
    """Make a new segment's directory entry durable (once, before its first confirmation)."""
    dfd = os.open(seg.directory, os.O_RDONLY)
    try:
        _fsync(dfd)
    finally:
        os.close(dfd)
    seg.needs_dir_sync = False


def _complete(
    groups: _Groups,
    failures: dict[Segment, BaseException],
    on_full: Callable[[BaseException], None] | None = None,
) -> None:
    """On the loop: advance each segment, notify its owner once, then resolve the futures."""
    if on_full is not None:
        full = next((exc for exc in failures.values() if is_disk_full(exc)), None)
        if full is not None:
            _guarded(lambda exc, _: on_full(exc), full, 0)
    for seg, items in groups.items():
        n = len(items)
        exc = failures.get(seg)
        if exc is None:
            seg.durable += n
            if seg.on_durable is not None:
                _guarded(seg.on_durable, seg.durable, n)
            for item in items:
                try:
                    item[4](None)
                except Exception:
                    log.exception("append completion callback failed")
        else:
            cls = DiskFullError if is_disk_full(exc) else StorageError
            err = cls(f"append to ledger {seg.ledger_id} failed: {exc}")
            if seg.on_failed is not None:
                _guarded(seg.on_failed, err, n)
            for item in items:
                try:
                    item[4](err)
                except Exception:
                    log.exception("append completion callback failed")
        seg.release(n)


def resolve_future(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    """A ``Done`` for a future: completes it as the append did (unless already done)."""
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


def _guarded(cb: Callable[[_T, int], None], arg: _T, n: int) -> None:
    # An owner's bug must not leave producers' futures unresolved.
    try:
        cb(arg, n)
    except Exception:
        log.exception("storage completion callback failed")
