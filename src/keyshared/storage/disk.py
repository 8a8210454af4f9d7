"""Disk usage of the data directory: a warning as it fills, and no new writes once it is full.

As BookKeeper's ``LedgerDirsMonitor``: usage (used / total bytes of the file system holding the
data directory) is checked every ``diskCheckInterval``. At ``diskUsageWarnThreshold`` a warning
is logged (once per crossing, so a full disk does not grow the log); at ``diskUsageThreshold``
the storage turns *read-only* for publishes, and turns writable again only once usage falls
below ``diskUsageLwmThreshold`` (the low-water mark keeps it from flapping). Reads, acks,
cursor updates and ledger deletions go on while read-only: the headroom left above the
threshold is what lets consumers keep acking and retention free space.

A *ballast* file (``<data>/ballast``, as CockroachDB's emergency ballast) holds back 1 % of the
file system (at least 256 KiB, at most 64 MiB) while there is room. When a write fails with
``ENOSPC`` it is deleted, so that the metadata store can still record acks and the deletion of
consumed ledgers (which is what frees space) on a disk that was filled to the last byte; it is
made again once the disk is writable.

A write that fails with ``ENOSPC`` (another process filled the disk, or the threshold is set
to 1.0) turns the storage read-only at once, whatever the measured usage, for a back-off that
doubles with each new failure (up to 10 s, Pulsar's ``WaitTimeAfterLedgerCreationFailureMs``)
and then until usage is below the low-water mark, so a full disk costs one failed write per
back-off rather than one per publish.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Pulsar's ManagedLedgerImpl.WaitTimeAfterLedgerCreationFailureMs, as the longest back-off.
MAX_BACKOFF_SECONDS = 10.0
FIRST_BACKOFF_SECONDS = 0.5
# While read-only, a publish re-measures at most this often (statvfs costs a few microseconds,
# but a refused publish must stay cheap), so space freed is noticed within this.
READ_ONLY_RECHECK_SECONDS = 0.2
# Bytes appended between two measurements at least (a statvfs per 64 KiB is nothing).
MIN_RECHECK_BYTES = 64 * 1024
BALLAST_NAME = "ballast"
BALLAST_FRACTION = 0.01
BALLAST_MIN_BYTES = 256 * 1024
BALLAST_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class DiskThresholds:
    """BookKeeper's disk settings, as fractions of the file system (0..1]."""

    # diskUsageThreshold (0.95): above it, no new entries are written.
    usage: float = 0.95
    # diskUsageWarnThreshold (0.95): above it, a warning is logged.
    warn: float = 0.95
    # diskUsageLwmThreshold (0.90): read-only ends once usage is below it.
    lwm: float = 0.90
    # diskCheckInterval (10000 ms), in seconds here.
    check_interval: float = 10.0

    def __post_init__(self) -> None:
        for name, value in (
            ("diskUsageThreshold", self.usage),
            ("diskUsageWarnThreshold", self.warn),
        ):
            if not 0.0 < value <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if not 0.0 < self.lwm <= self.usage:
            raise ValueError(
                f"diskUsageLwmThreshold ({self.lwm}) must be in (0, diskUsageThreshold"
                f" ({self.usage})]"
            )
        if self.check_interval <= 0:
            raise ValueError(f"diskCheckInterval must be positive, got {self.check_interval}")


class DiskMonitor:
    """Tracks the data directory's usage and whether new entries may be written."""

    def __init__(
        self,
        path: Path,
        thresholds: DiskThresholds | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        statvfs: Callable[[Path], Any] = os.statvfs,
    ) -> None:
        self._path = path
        self._ballast = path / BALLAST_NAME
        self.thresholds = thresholds if thresholds is not None else DiskThresholds()
        self._clock = clock
        self._statvfs = statvfs
        self.usage = 0.0
        self.total_bytes = 0
        self.free_bytes = 0
        self.read_only = False
        self._warned = False
        self._last_check = float("-inf")
        self._written = 0
        self._recheck_bytes = 0
        self._blocked_until = float("-inf")
        self._backoff = FIRST_BACKOFF_SECONDS
        self._last_full = float("-inf")
        # Counters for stats and tests.
        self.full_errors = 0
        self.read_only_episodes = 0
        self.refused_writes = 0

    @property
    def path(self) -> Path:
        """The directory measured."""
        return self._path

    def writable(self, nbytes: int = 0) -> bool:
        """Whether a new entry of ``nbytes`` may be written now; cheap while writable.

        Besides the periodic check, usage is measured again whenever half of the room left
        below ``diskUsageThreshold`` (at the last check) may have been written since, so a fast
        publisher cannot run past the threshold between two checks.
        """
        if not self.read_only:
            self._written += nbytes
            if self._written < self._recheck_bytes:
                return True
            self.check()
            return not self.read_only
        if self._clock() - self._last_check >= READ_ONLY_RECHECK_SECONDS:
            self.check()
        return not self.read_only

    def refuse(self) -> None:
        """Count a write refused because the disk is full."""
        self.refused_writes += 1

    def check(self) -> float:
        """Measure usage now and apply the thresholds; returns the usage (0..1)."""
        now = self._clock()
        self._last_check = now
        try:
            st = self._statvfs(self._path)
        except OSError as exc:
            log.warning("cannot measure disk usage of %s: %s", self._path, exc)
            return self.usage
        total = st.f_blocks * st.f_frsize
        free = st.f_bavail * st.f_frsize
        self.total_bytes, self.free_bytes = total, free
        self.usage = usage = (total - free) / total if total > 0 else 0.0
        t = self.thresholds
        self._written = 0
        self._recheck_bytes = max(int((t.usage - usage) * total / 2), MIN_RECHECK_BYTES)
        if usage >= t.warn and not self._warned:
            self._warned = True
            log.warning(
                "disk usage of %s is %.1f%% (%d bytes free), above diskUsageWarnThreshold %.0f%%",
                self._path,
                usage * 100,
                free,
                t.warn * 100,
            )
        elif usage < t.warn and self._warned:
            self._warned = False
            log.info("disk usage of %s is back to %.1f%%", self._path, usage * 100)
        if not self.read_only and usage >= t.usage:
            self._enter_read_only(
                f"usage {usage * 100:.1f}% is above diskUsageThreshold {t.usage * 100:.0f}%"
            )
        elif self.read_only and usage < t.lwm and now >= self._blocked_until:
            self.read_only = False
            self.ensure_ballast()
            log.warning(
                "disk usage of %s is %.1f%%, below diskUsageLwmThreshold %.0f%%:"
                " accepting new entries again (%d refused while full)",
                self._path,
                usage * 100,
                t.lwm * 100,
                self.refused_writes,
            )
        return usage

    def note_full(self, exc: BaseException) -> None:
        """A write failed for lack of space: stop writing for a back-off, then until usage is
        below the low-water mark."""
        self.full_errors += 1
        if self.read_only:
            # More of the same (the writes already queued, a cursor's flush): the back-off runs
            # from the first failure, so space freed is used as soon as it is there. The disk
            # may have filled past the threshold's headroom (another process writing to it):
            # the ballast goes, for the metadata's sake.
            self._release_ballast()
            return
        now = self._clock()
        # A failure soon after the last episode ended (space that was not really there, or
        # inodes rather than bytes) lengthens the back-off.
        if now - self._last_full < MAX_BACKOFF_SECONDS * 2:
            self._backoff = min(self._backoff * 2, MAX_BACKOFF_SECONDS)
        else:
            self._backoff = FIRST_BACKOFF_SECONDS
        self._last_full = now
        self._blocked_until = now + self._backoff
        self._enter_read_only(f"a write failed: {exc}")
        self._release_ballast()
        self.check()

    @property
    def ballast_bytes(self) -> int:
        """The size of the ballast file now (0 when released or never made)."""
        try:
            return self._ballast.stat().st_size
        except OSError:
            return 0

    def ensure_ballast(self) -> None:
        """Make the ballast file if it is missing and the disk has room for it (and more)."""
        if self.ballast_bytes:
            return
        total = self.total_bytes
        size = min(max(int(total * BALLAST_FRACTION), BALLAST_MIN_BYTES), BALLAST_MAX_BYTES)
        # Only with plenty to spare: the ballast must not be what fills the disk.
        if total <= 0 or self.free_bytes < 4 * size:
            return
        try:
            fd = os.open(self._ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            log.warning("cannot create %s: %s", self._ballast, exc)
            return
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError:
                # Not every file system allocates (some FUSE ones): write the zeros.
                chunk = bytes(min(size, 1024 * 1024))
                left = size
                while left > 0:
                    left -= os.write(fd, chunk[: min(left, len(chunk))])
            os.fsync(fd)
        except OSError as exc:
            log.warning("cannot fill %s: %s", self._ballast, exc)
            os.close(fd)
            self._ballast.unlink(missing_ok=True)
            return
        os.close(fd)

    def _release_ballast(self) -> None:
        size = self.ballast_bytes
        if size:
            self._ballast.unlink(missing_ok=True)
            log.warning("released the %d-byte ballast so metadata can still be written", size)

    def _enter_read_only(self, why: str) -> None:
        self.read_only = True
        self.read_only_episodes += 1
        log.error(
            "data directory %s is full (%s): refusing new entries until disk usage is below"
            " diskUsageLwmThreshold %.0f%%",
            self._path,
            why,
            self.thresholds.lwm * 100,
        )

    def stats(self) -> dict[str, Any]:
        """Usage figures for the stats and metrics."""
        return {
            "path": str(self._path),
            "usage": self.usage,
            "totalBytes": self.total_bytes,
            "freeBytes": self.free_bytes,
            "readOnly": self.read_only,
            "fullErrors": self.full_errors,
            "readOnlyEpisodes": self.read_only_episodes,
            "refusedWrites": self.refused_writes,
            "ballastBytes": self.ballast_bytes,
        }
