"""One ledger's append-only file: record format, offset index, reads and crash recovery.

File ``<ledger_id>.log`` is a sequence of records, each an 8-byte header followed by the entry's
bytes. The header is two little-endian u32: the data length, then the CRC32C of the data. Entry
ids in a ledger are dense (0..n-1), so an in-memory ``array('Q')`` of record offsets finds an
entry without a scan.

The sidecar ``<ledger_id>.idx`` (8-byte magic, then one little-endian u64 record offset per entry)
is appended by the journal after each write and never synced: it may lag the data or be torn. A
ledger closed cleanly (its entry count recorded once its data was synced) trusts the index up to
its last offset once the record there is verified, and scans only the rest; a ledger that was
not closed cleanly has every record verified, since a power cut can leave a good record after a
torn one. A torn or corrupt tail (short record, bad CRC, zero length) is cut off.

Zero-length entries are not allowed: a header of zeros is what a crash can leave in a file's
tail, so a zero length always marks the end of the log.

Threading: offsets and ``end`` are touched only on the event loop (``reserve`` runs at append
time, so positions and offsets are known before the write). The journal thread only writes bytes
at offsets it was given; executor reads receive a precomputed span. ``users`` (loop only) keeps
the file open while writes or reads are in flight.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import struct
import sys
from array import array
from collections import OrderedDict
from collections.abc import Callable
from itertools import islice, repeat
from pathlib import Path

from keyshared.crc import crc32c
from keyshared.storage.entry import Entry
from keyshared.storage.errors import StorageError
from keyshared.storage.position import Position

log = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
HEADER_SIZE = HEADER.size
INDEX_MAGIC = b"KSIDX\x00\x00\x01"
_SCAN_CHUNK = 8 << 20
_LITTLE = sys.byteorder == "little"

DurableCallback = Callable[[int, int], None]
FailedCallback = Callable[[StorageError, int], None]


def data_path(directory: Path, ledger_id: int) -> Path:
    """The record file of a ledger."""
    return directory / f"{ledger_id}.log"


def index_path(directory: Path, ledger_id: int) -> Path:
    """The offset-index sidecar of a ledger."""
    return directory / f"{ledger_id}.idx"


def offsets_to_bytes(offsets: array[int]) -> bytes:
    """Offsets encoded as the index file stores them (little-endian u64)."""
    if not _LITTLE:
        offsets = array("Q", offsets)
        offsets.byteswap()
    return offsets.tobytes()


class Segment:
    """The file of one ledger, its offsets, and its in-flight bookkeeping."""

    __slots__ = (
        "_closing",
        "_index_writable",
        "directory",
        "durable",
        "end",
        "failed",
        "fd",
        "index_fd",
        "ledger_id",
        "needs_dir_sync",
        "offsets",
        "on_durable",
        "on_failed",
        "parked",
        "users",
    )

    def __init__(
        self,
        directory: Path,
        ledger_id: int,
        fd: int,
        index_fd: int,
        offsets: array[int],
        end: int,
    ) -> None:
        self.directory = directory
        self.ledger_id = ledger_id
        self.fd = fd
        # -1 for a read-only (recovered) segment: only new ledgers are written.
        self.index_fd = index_fd
        self.offsets = offsets
        # Offset right after the last reserved record.
        self.end = end
        # Entries whose write (and sync, under the policy) has completed; updated on the loop.
        self.durable = len(offsets)
        # Set by the journal thread on an I/O error; every later write to this segment fails.
        self.failed: BaseException | None = None
        self.needs_dir_sync = index_fd >= 0
        self.users = 0
        self._closing = False
        # A writable segment whose files are closed while it is idle (``park``), to bound open
        # files; reopened on its next use (``unpark``). See WritableSegments.
        self.parked = False
        self._index_writable = False
        # Called on the loop once per group commit with (durable count, entries just completed).
        self.on_durable: DurableCallback | None = None
        # Called on the loop when writes failed, with (error, number of entries that failed).
        self.on_failed: FailedCallback | None = None

    # --- creation and recovery -------------------------------------------------------------

    @classmethod
    def create(cls, directory: Path, ledger_id: int) -> Segment:
        """A new, empty, writable segment. An existing file of that id is discarded."""
        fd = os.open(data_path(directory, ledger_id), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            ifd = os.open(
                index_path(directory, ledger_id),
                os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND,
                0o644,
            )
        except OSError:
            os.close(fd)
            raise
        try:
            os.write(ifd, INDEX_MAGIC)
        except OSError:
            os.close(fd)
            os.close(ifd)
            raise
        return cls(directory, ledger_id, fd, ifd, array("Q"), 0)

    @classmethod
    def open(
        cls,
        directory: Path,
        ledger_id: int,
        *,
        expected_entries: int | None = None,
        sync: bool = True,
    ) -> Segment:
        """Open an existing segment read-only, recovering it.

        Trusts the index as far as it is verified, scans the rest, truncates a torn tail (and
        anything beyond ``expected_entries`` when that is given: entries a closed ledger never
        confirmed), and brings the index up to date. A missing file is an empty segment.
        """
        path = data_path(directory, ledger_id)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            return cls._recover(directory, ledger_id, fd, expected_entries, sync)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _recover(
        cls, directory: Path, ledger_id: int, fd: int, expected: int | None, sync: bool
    ) -> Segment:
        size = os.fstat(fd).st_size
        ipath = index_path(directory, ledger_id)
        if expected is None:
            # Not closed cleanly: a power cut may have let any subset of the unsynced pages
            # reach the disk (an index ahead of its data, a good last record after a torn one),
            # so no record is taken on trust: every one is verified and the log ends at the
            # first bad one. Nothing after it was confirmed, since a sync covers the whole file.
            offsets: array[int] = array("Q")
            trusted_end = 0
        else:
            offsets, trusted_end = _load_index(ipath, fd, size, expected)
        indexed = len(offsets)
        end = _scan(fd, trusted_end, size, offsets, expected)
        if end < size:
            log.warning(
                "ledger %d: truncating %d bytes of torn or unconfirmed tail at offset %d",
                ledger_id,
                size - end,
                end,
            )
            try:
                os.ftruncate(fd, end)
                if sync:
                    os.fsync(fd)
            except OSError as exc:
                # The records found stay what they are; a failing disk must not also stop the
                # reads of what it holds. The next open cuts the tail again.
                log.warning("ledger %d: cannot cut its tail: %s", ledger_id, exc)
        if indexed < len(offsets) or _index_length(ipath) != len(INDEX_MAGIC) + 8 * len(offsets):
            _rewrite_index(ipath, offsets, indexed)
        return cls(directory, ledger_id, fd, -1, offsets, end)

    # --- loop-side bookkeeping -------------------------------------------------------------

    @property
    def count(self) -> int:
        """Records reserved in this segment (written or not)."""
        return len(self.offsets)

    def reserve(self, length: int) -> int:
        """Reserve the next record for ``length`` data bytes and return its offset."""
        offset = self.end
        self.offsets.append(offset)
        self.end = offset + HEADER_SIZE + length
        return offset

    def bound(self, entry_id: int) -> int:
        """Offset of record ``entry_id``, or the end offset when ``entry_id == count``."""
        offsets = self.offsets
        return offsets[entry_id] if entry_id < len(offsets) else self.end

    def data_size(self, first: int, stop: int) -> int:
        """Data bytes (headers excluded) of entries ``[first, stop)``."""
        if stop <= first:
            return 0
        return self.bound(stop) - self.offsets[first] - HEADER_SIZE * (stop - first)

    def fit(self, first: int, stop: int, budget: int) -> int:
        """The largest ``k`` in ``(first, stop]`` whose entries ``[first, k)`` fit ``budget``
        data bytes; always at least ``first + 1`` so a read makes progress."""
        offsets = self.offsets
        k = first + 1
        used = self.bound(k) - offsets[first] - HEADER_SIZE
        while k < stop:
            nxt = self.bound(k + 1) - offsets[k] - HEADER_SIZE
            if used + nxt > budget:
                break
            used += nxt
            k += 1
        return k

    def span(self, first: int, stop: int) -> tuple[int, int]:
        """``(file offset, length)`` of records ``[first, stop)``."""
        start = self.offsets[first]
        return start, self.bound(stop) - start

    def acquire(self) -> None:
        """Keep the file open for an operation in flight."""
        self.users += 1

    def release(self, n: int = 1) -> None:
        """End ``n`` operations; closes the file if a close was deferred for them."""
        self.users -= n
        if self._closing and self.users <= 0:
            self._close_now()

    # --- reads -----------------------------------------------------------------------------

    def read(self, first: int, stop: int) -> list[Entry]:
        """Entries ``[first, stop)``, read with one pread and verified."""
        start, length = self.span(first, stop)
        return self.read_span(start, length, first, stop - first)

    def read_span(self, start: int, length: int, first: int, count: int) -> list[Entry]:
        """Parse ``count`` records from the ``length`` bytes at ``start``; safe off the loop."""
        if self.fd < 0:
            raise StorageError(f"ledger {self.ledger_id}: segment is closed")
        buf = os.pread(self.fd, length, start)
        if len(buf) != length:
            raise StorageError(
                f"ledger {self.ledger_id}: short read at offset {start} ({len(buf)}/{length})"
            )
        unpack = HEADER.unpack_from
        ledger_id = self.ledger_id
        out: list[Entry] = []
        append = out.append
        i = 0
        for entry_id in range(first, first + count):
            n, crc = unpack(buf, i)
            j = i + HEADER_SIZE + n
            data = buf[i + HEADER_SIZE : j]
            if len(data) != n or crc32c(data) != crc:
                raise StorageError(f"ledger {ledger_id}: entry {entry_id} is corrupt")
            append(Entry(Position(ledger_id, entry_id), data, crc))
            i = j
        if i != length:
            raise StorageError(f"ledger {ledger_id}: records do not match the index")
        return out

    # --- closing ---------------------------------------------------------------------------

    def park(self) -> bool:
        """Close the files of an idle segment (no write or read in flight), keeping everything
        else; ``unpark`` reopens them. Only idle: the journal thread and the read threads touch
        the fds only while ``users`` > 0, and a write is synced (under the sync policy) before
        its ``users`` is released, so nothing is left for a later fd's sync to cover."""
        if self.parked or self._closing or self.users > 0 or self.fd < 0:
            return False
        self._index_writable = self.index_fd >= 0
        with contextlib.suppress(OSError):
            if self.index_fd >= 0:
                os.close(self.index_fd)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.index_fd = self.fd = -1
        self.parked = True
        return True

    def unpark(self) -> None:
        """Reopen the files of a parked segment (OSError when it cannot)."""
        if not self.parked:
            return
        fd = os.open(data_path(self.directory, self.ledger_id), os.O_RDWR)
        if self._index_writable:
            try:
                self.index_fd = os.open(self.index_path(), os.O_WRONLY | os.O_APPEND)
            except OSError:
                os.close(fd)
                raise
        self.fd = fd
        self.parked = False

    def close_index(self) -> None:
        """Stop writing: close the index file (the data file stays open for reads)."""
        self._index_writable = False
        if self.index_fd >= 0:
            os.close(self.index_fd)
            self.index_fd = -1

    def close(self) -> None:
        """Close the files now, or as soon as in-flight operations end."""
        self._closing = True
        if self.users <= 0:
            self._close_now()

    def delete(self) -> None:
        """Close (possibly deferred) and remove both files."""
        self.close()
        for path in (data_path(self.directory, self.ledger_id), self.index_path()):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def index_path(self) -> Path:
        """This segment's index file."""
        return index_path(self.directory, self.ledger_id)

    @property
    def closed(self) -> bool:
        """Whether a close was requested."""
        return self._closing

    def _close_now(self) -> None:
        self.parked = False
        self.close_index()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SegmentPool:
    """Read-only segments kept open, least recently used closed first (bounds open files)."""

    def __init__(self, max_open: int) -> None:
        self._max = max(1, max_open)
        self._open: OrderedDict[int, Segment] = OrderedDict()

    def get(self, ledger_id: int) -> Segment | None:
        """The open segment of ``ledger_id``, marked as recently used."""
        seg = self._open.get(ledger_id)
        if seg is not None:
            self._open.move_to_end(ledger_id)
        return seg

    def add(self, seg: Segment) -> None:
        """Keep ``seg`` open; close the least recently used beyond the limit."""
        self._open[seg.ledger_id] = seg
        self._open.move_to_end(seg.ledger_id)
        while len(self._open) > self._max:
            _, old = self._open.popitem(last=False)
            old.close()

    def discard(self, ledger_id: int) -> Segment | None:
        """Forget (without closing) the segment of ``ledger_id``."""
        return self._open.pop(ledger_id, None)

    def close_all(self) -> None:
        """Close every pooled segment."""
        for seg in self._open.values():
            seg.close()
        self._open.clear()

    def __len__(self) -> int:
        return len(self._open)


class WritableSegments:
    """The segments being written (one per open ledger), with at most ``max_open`` of them
    holding their files open: the least recently used idle ones are parked (files closed) and
    reopened on their next append or read. 10,000 topics would otherwise hold 20,000 files open
    however idle they are. Loop only."""

    def __init__(self, max_open: int) -> None:
        self._max = max(1, max_open)
        # Segments with open files, least recently used first.
        self._open: OrderedDict[int, Segment] = OrderedDict()
        self.parks = 0
        self.unparks = 0
        self.crowded = False
        """Whether as many segments as may be hold their files open: an append must then mark
        its segment used (a plain attribute, read by every append)."""

    @property
    def max_open(self) -> int:
        """How many writable segments may hold their files open."""
        return self._max

    def use(self, seg: Segment) -> None:
        """``seg`` is about to be written or read: reopen it if parked (OSError if it cannot),
        mark it recently used, and park the least recently used idle ones beyond the limit."""
        key = seg.ledger_id
        if seg.parked:
            seg.unpark()
            self.unparks += 1
            self._open[key] = seg
        elif key in self._open:
            self._open.move_to_end(key)
        else:
            self._open[key] = seg
        if len(self._open) > self._max:
            self._shrink(seg)
        self.crowded = len(self._open) >= self._max

    def _shrink(self, keep: Segment) -> None:
        opened = self._open
        # Busy segments (writes or reads in flight) are passed over, at most once each.
        for _ in range(len(opened)):
            if len(opened) <= self._max:
                return
            key, seg = next(iter(opened.items()))
            if seg is keep:
                opened.move_to_end(key)
                continue
            if seg.closed or seg.fd < 0:
                del opened[key]
            elif seg.park():
                del opened[key]
                self.parks += 1
            else:
                opened.move_to_end(key)

    def discard(self, seg: Segment) -> None:
        """``seg`` is no longer written (closed, sealed into the read pool, or deleted)."""
        if self._open.get(seg.ledger_id) is seg:
            del self._open[seg.ledger_id]
            self.crowded = len(self._open) >= self._max

    def __len__(self) -> int:
        return len(self._open)


# --- recovery helpers ---------------------------------------------------------------------


def _record_valid_at(fd: int, offset: int, size: int) -> int:
    """End offset of a valid record at ``offset``, or -1."""
    if offset + HEADER_SIZE > size:
        return -1
    header = os.pread(fd, HEADER_SIZE, offset)
    if len(header) != HEADER_SIZE:
        return -1
    length: int
    crc: int
    length, crc = HEADER.unpack(header)
    end = offset + HEADER_SIZE + length
    if length == 0 or end > size:
        return -1
    data = os.pread(fd, length, offset + HEADER_SIZE)
    if len(data) != length or crc32c(data) != crc:
        return -1
    return end


def _load_index(path: Path, fd: int, size: int, expected: int | None) -> tuple[array[int], int]:
    """The verified prefix of the index and the end offset it covers (``(empty, 0)`` if none)."""
    empty: array[int] = array("Q")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return empty, 0
    if raw[: len(INDEX_MAGIC)] != INDEX_MAGIC:
        if raw:
            log.warning("%s: bad index magic, scanning the ledger", path)
        return empty, 0
    n = (len(raw) - len(INDEX_MAGIC)) // 8
    if expected is not None:
        n = min(n, expected)
    if n == 0:
        return empty, 0
    offsets: array[int] = array("Q")
    offsets.frombytes(memoryview(raw)[len(INDEX_MAGIC) : len(INDEX_MAGIC) + 8 * n])
    if not _LITTLE:
        offsets.byteswap()
    # Records are at least 9 bytes, so each offset must exceed the previous by more than 8.
    ordered = offsets[0] == 0 and all(
        map(operator.lt, map(operator.add, offsets, repeat(HEADER_SIZE)), islice(offsets, 1, None))
    )
    end = _record_valid_at(fd, offsets[-1], size) if ordered else -1
    if end < 0:
        log.warning("%s: index does not match the data, scanning the ledger", path)
        return empty, 0
    return offsets, end


def _scan(fd: int, pos: int, size: int, offsets: array[int], limit: int | None) -> int:
    """Append offsets of valid records from ``pos``; return the end of the last valid one."""
    unpack = HEADER.unpack_from
    append = offsets.append
    while pos < size:
        if limit is not None and len(offsets) >= limit:
            return pos
        buf = os.pread(fd, min(_SCAN_CHUNK, size - pos), pos)
        n = len(buf)
        mv = memoryview(buf)
        i = 0
        length: int
        crc: int
        while i + HEADER_SIZE <= n:
            length, crc = unpack(buf, i)
            stop = i + HEADER_SIZE + length
            if length == 0 or pos + stop > size:
                return pos + i
            if stop > n:
                break
            if crc32c(mv[i + HEADER_SIZE : stop]) != crc:
                return pos + i
            append(pos + i)
            i = stop
            if limit is not None and len(offsets) >= limit:
                return pos + i
        if i == 0:
            # A header that does not fit, or a record longer than one chunk: check it alone.
            end = _record_valid_at(fd, pos, size)
            if end < 0:
                return pos
            append(pos)
            pos = end
        else:
            pos += i
    return pos


def _index_length(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _rewrite_index(path: Path, offsets: array[int], keep: int) -> None:
    """Make the index hold exactly ``offsets``, reusing its first ``keep`` (verified) entries."""
    flags = os.O_WRONLY | os.O_CREAT
    fd = os.open(path, flags, 0o644)
    try:
        if keep == 0:
            os.ftruncate(fd, 0)
            _write_all(fd, INDEX_MAGIC + offsets_to_bytes(offsets), 0)
        else:
            base = len(INDEX_MAGIC) + 8 * keep
            os.ftruncate(fd, base)
            _write_all(fd, offsets_to_bytes(offsets[keep:]), base)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n
