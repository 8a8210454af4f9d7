"""Errors raised by the storage layer."""

from __future__ import annotations

import errno


class StorageError(Exception):
    """A storage operation failed: an I/O error, a corrupt record, or a closed ledger or store.

    Appends that fail complete their future with this error; the broker turns it into a
    ``PersistenceError`` for the producer.
    """


class DiskFullError(StorageError):
    """The data directory has no room: a write failed with ``ENOSPC``/``EDQUOT`` (or SQLite's
    ``SQLITE_FULL``), or its usage is above ``diskUsageThreshold``. Publishes are refused until
    usage falls below ``diskUsageLwmThreshold``; reads, acks and deletions go on."""


_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the disk is full."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DiskFullError):
            return True
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        seen = seen.__cause__
    return False
