"""The storage: a data directory holding ledger files and the metadata database.

Layout::

    <data_dir>/LOCK              flock'ed while a Storage has the directory open
    <data_dir>/metadata.sqlite   the MetadataStore (plus its -wal and -shm files)
    <data_dir>/ledgers/<id>.log  one segment file per ledger
    <data_dir>/ledgers/<id>.idx  its offset index

``open()`` does only cheap work (directory, lock, SQLite, the journal thread) so the broker can
listen right away; a managed ledger's files are opened when it is opened, and closed ledgers'
files only when read.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import resource
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from keyshared.storage.cache import EntryCache
from keyshared.storage.config import StorageConfig
from keyshared.storage.disk import DiskMonitor
from keyshared.storage.errors import StorageError
from keyshared.storage.fsutil import fsync_directory, make_durable_dirs
from keyshared.storage.journal import Journal
from keyshared.storage.ledger import (
    METADATA_PREFIX,
    LedgerContext,
    ManagedLedger,
    delete_stored,
)
from keyshared.storage.metadata import MetadataStore
from keyshared.storage.segment import SegmentPool, WritableSegments

__all__ = ["Storage", "StorageConfig"]

log = logging.getLogger(__name__)

NEXT_LEDGER_ID_KEY = "storage/next-ledger-id"
FIRST_LEDGER_ID = 1


class Storage:
    """Managed ledgers, their journal and cache, and the metadata store of one data directory."""

    def __init__(self, data_dir: Path | str, config: StorageConfig | None = None) -> None:
        self._dir = Path(data_dir)
        self._config = config if config is not None else StorageConfig()
        self._ledger_dir = self._dir / "ledgers"
        self._metadata: MetadataStore | None = None
        self._journal: Journal | None = None
        self._ctx: LedgerContext | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock_fd = -1
        self._next_ledger_id = FIRST_LEDGER_ID
        self._mls: dict[str, ManagedLedger] = {}
        # Closed but still waiting for their last appends.
        self._closing_mls: dict[str, ManagedLedger] = {}
        self._closing = False
        self._disk: DiskMonitor | None = None
        self._disk_timer: asyncio.TimerHandle | None = None

    # --- life cycle ------------------------------------------------------------------------

    def open(self, loop: asyncio.AbstractEventLoop | None = None) -> Storage:
        """Open the data directory (creating it); appends complete on ``loop``, by default the
        running loop. Fast: no ledger file is touched here."""
        if self._ctx is not None:
            raise StorageError("storage is already open")
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                raise StorageError("Storage.open() needs a running loop or loop=") from None
        sync = self._config.journal_sync_data
        make_durable_dirs(self._ledger_dir, sync=sync)
        self._lock_fd = _lock_directory(self._dir)
        try:
            _raise_open_files_limit()
            self._metadata = MetadataStore(self._dir / "metadata.sqlite", durable=sync)
            if sync:
                # The names of the metadata database (SQLite syncs its WAL's own entry) and LOCK.
                fsync_directory(self._dir)
            raw = self._metadata.get(NEXT_LEDGER_ID_KEY)
            self._next_ledger_id = int(raw) if raw else FIRST_LEDGER_ID
            self._journal = Journal(loop, sync_data=self._config.journal_sync_data)
            self._disk = DiskMonitor(self._dir, self._config.disk)
            self._disk.check()
            if not self._disk.read_only:
                self._disk.ensure_ballast()
            self._metadata.on_full = self._disk.note_full
            self._journal.on_full = self._disk.note_full
            self._journal.start()
        except BaseException:
            if self._metadata is not None:
                self._metadata.close()
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise
        self._executor = ThreadPoolExecutor(
            max_workers=max(1, self._config.read_threads), thread_name_prefix="keyshared-read"
        )
        self._ctx = LedgerContext(
            directory=self._ledger_dir,
            config=self._config,
            metadata=self._metadata,
            journal=self._journal,
            cache=EntryCache(self._config.cache_size_bytes),
            segments=SegmentPool(self._config.max_open_segments),
            writable=WritableSegments(
                self._config.max_open_writable_segments or _default_max_open_writable()
            ),
            read_executor=self._executor,
            disk=self._disk,
            allocate_ledger_id=self._allocate_ledger_id,
            on_closing=self._on_ml_closing,
            on_closed=self._on_ml_closed,
        )
        self._schedule_disk_check(loop)
        return self

    async def close(self) -> None:
        """Close every managed ledger (waiting for their appends), drain and stop the journal,
        close files and the metadata store."""
        ctx = self._ctx
        if ctx is None or self._closing:
            return
        self._closing = True
        if self._disk_timer is not None:
            self._disk_timer.cancel()
            self._disk_timer = None
        try:
            for ml in list(self._mls.values()):
                ml.close()
            results = await asyncio.gather(
                *(ml.close() for ml in list(self._closing_mls.values())), return_exceptions=True
            )
            for result in results:
                if isinstance(result, BaseException):
                    log.error("closing a managed ledger failed: %s", result)
            await ctx.journal.close()
            ctx.segments.close_all()
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            ctx.metadata.close()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            self._ctx = None
            self._closing = False

    # --- accessors -------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        """The data directory."""
        return self._dir

    @property
    def config(self) -> StorageConfig:
        """The settings."""
        return self._config

    @property
    def metadata(self) -> MetadataStore:
        """The metadata store."""
        return self._context().metadata

    @property
    def journal(self) -> Journal:
        """The group-commit writer (its counters are useful in stats)."""
        return self._context().journal

    @property
    def cache(self) -> EntryCache:
        """The entry cache shared by all managed ledgers."""
        return self._context().cache

    @property
    def disk(self) -> DiskMonitor:
        """The data directory's usage and whether it takes new entries."""
        return self._context().disk

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop appends complete on."""
        return self._context().journal.loop

    @property
    def is_open(self) -> bool:
        """Whether :meth:`open` succeeded and :meth:`close` has not run."""
        return self._ctx is not None

    # --- managed ledgers -------------------------------------------------------------------

    def open_managed_ledger(self, name: str) -> ManagedLedger:
        """The managed ledger ``name``, opened (and created if missing); the same object while
        it stays open. Opening recovers its last ledger and starts a new one."""
        ctx = self._context()
        if self._closing:
            raise StorageError("storage is closing")
        ml = self._mls.get(name)
        if ml is None:
            if name in self._closing_mls:
                raise StorageError(f"managed ledger {name} is still closing; retry")
            ml = ManagedLedger.open(name, ctx)
            self._mls[name] = ml
        return ml

    def get_managed_ledger(self, name: str) -> ManagedLedger | None:
        """The managed ledger ``name`` if it is open."""
        return self._mls.get(name)

    def managed_ledger_names(self) -> list[str]:
        """Names of every managed ledger in the store, open or not."""
        n = len(METADATA_PREFIX)
        return [key[n:] for key in self._context().metadata.list_keys(METADATA_PREFIX)]

    async def delete_managed_ledger(self, name: str) -> None:
        """Delete the managed ledger ``name`` (files and metadata), opening it first if needed."""
        ctx = self._context()
        ml = self._mls.get(name)
        if ml is not None:
            await ml.delete()
            return
        closing = self._closing_mls.get(name)
        if closing is not None:
            await closing.close()
        delete_stored(name, ctx)

    # --- internals -------------------------------------------------------------------------

    def _context(self) -> LedgerContext:
        if self._ctx is None:
            raise StorageError("storage is not open")
        return self._ctx

    def _schedule_disk_check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._disk_timer = loop.call_later(self._config.disk.check_interval, self._disk_check, loop)

    def _disk_check(self, loop: asyncio.AbstractEventLoop) -> None:
        ctx = self._ctx
        if ctx is None or self._closing:
            return
        ctx.disk.check()
        self._schedule_disk_check(loop)

    def _allocate_ledger_id(self) -> tuple[int, tuple[str, bytes]]:
        ledger_id = self._next_ledger_id
        self._next_ledger_id += 1
        return ledger_id, (NEXT_LEDGER_ID_KEY, str(self._next_ledger_id).encode())

    def _on_ml_closing(self, ml: ManagedLedger) -> None:
        if self._mls.get(ml.name) is ml:
            del self._mls[ml.name]
            self._closing_mls[ml.name] = ml

    def _on_ml_closed(self, ml: ManagedLedger) -> None:
        if self._closing_mls.get(ml.name) is ml:
            del self._closing_mls[ml.name]


def _lock_directory(directory: Path) -> int:
    fd = os.open(directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StorageError(f"{directory} is in use by another process") from None
    return fd


def _default_max_open_writable() -> int:
    """An eighth of the open-files limit: each open ledger holds two files."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ValueError, OSError):
        return 128
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(16, soft // 8)


def _raise_open_files_limit() -> None:
    # Each open ledger keeps a file or two open; the default soft limit (often 1024) is low.
    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
