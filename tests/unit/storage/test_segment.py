"""Segment files: record format, reads, recovery of torn tails and of a bad or lagging index."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest
from crc32c import crc32c

from keyshared.storage.errors import StorageError
from keyshared.storage.fsutil import fsync_directory, make_durable_dirs
from keyshared.storage.position import Position
from keyshared.storage.segment import (
    HEADER,
    HEADER_SIZE,
    INDEX_MAGIC,
    Segment,
    SegmentPool,
    data_path,
    index_path,
)

LEDGER = 7


def payload(i: int) -> bytes:
    return f"entry-{i:05d}-".encode() * (1 + i % 5)


def write_segment(directory: Path, n: int, *, with_index: bool = True) -> list[bytes]:
    """Write ``n`` records the way the journal does (data, then index offsets)."""
    seg = Segment.create(directory, LEDGER)
    datas = [payload(i) for i in range(n)]
    for data in datas:
        offset = seg.reserve(len(data))
        os.pwrite(seg.fd, HEADER.pack(len(data), crc32c(data)) + data, offset)
    if with_index:
        os.write(seg.index_fd, struct.pack(f"<{n}Q", *seg.offsets))
    seg.close()
    return datas


def file_size(directory: Path) -> int:
    return data_path(directory, LEDGER).stat().st_size


def index_entries(directory: Path) -> list[int]:
    raw = index_path(directory, LEDGER).read_bytes()
    assert raw[:8] == INDEX_MAGIC
    return list(struct.unpack(f"<{(len(raw) - 8) // 8}Q", raw[8:]))


def reopen(directory: Path, expected: int | None = None) -> Segment:
    return Segment.open(directory, LEDGER, expected_entries=expected, sync=False)


def test_record_format_is_length_crc_little_endian(tmp_path: Path) -> None:
    write_segment(tmp_path, 1)
    raw = data_path(tmp_path, LEDGER).read_bytes()
    data = payload(0)
    assert raw == struct.pack("<II", len(data), crc32c(data)) + data
    assert HEADER_SIZE == 8


def test_round_trip_and_offsets(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 50)
    seg = reopen(tmp_path)
    assert seg.count == 50
    entries = seg.read(0, 50)
    assert [e.data for e in entries] == datas
    assert [e.position for e in entries] == [Position(LEDGER, i) for i in range(50)]
    assert all(e.checksum == crc32c(e.data) for e in entries)
    assert [e.data for e in seg.read(10, 13)] == datas[10:13]
    assert seg.data_size(0, 50) == sum(map(len, datas))
    assert seg.end == file_size(tmp_path)
    seg.close()


def test_fit_respects_byte_budget_but_makes_progress(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 10)
    seg = reopen(tmp_path)
    assert seg.fit(0, 10, 0) == 1
    budget = len(datas[0]) + len(datas[1])
    assert seg.fit(0, 10, budget) == 2
    assert seg.fit(0, 10, 10**9) == 10
    seg.close()


@pytest.mark.parametrize("cut", [1, 4, 8, 9, 20])
def test_truncated_mid_record_is_cut_back(tmp_path: Path, cut: int) -> None:
    datas = write_segment(tmp_path, 20)
    size = file_size(tmp_path)
    last_len = HEADER_SIZE + len(datas[-1])
    good_end = size - last_len
    os.truncate(data_path(tmp_path, LEDGER), good_end + min(cut, last_len - 1))
    seg = reopen(tmp_path)
    assert seg.count == 19
    assert [e.data for e in seg.read(0, 19)] == datas[:19]
    assert file_size(tmp_path) == good_end
    assert index_entries(tmp_path) == list(seg.offsets)
    seg.close()


@pytest.mark.parametrize(
    "garbage",
    [b"\x00" * 64, b"\xff" * 3, random.Random(100).randbytes(100)],
    ids=["zeros", "ones", "random"],
)
def test_garbage_tail_is_cut(tmp_path: Path, garbage: bytes) -> None:
    datas = write_segment(tmp_path, 5)
    size = file_size(tmp_path)
    with open(data_path(tmp_path, LEDGER), "ab") as f:
        f.write(garbage)
    seg = reopen(tmp_path)
    assert seg.count == 5
    assert file_size(tmp_path) == size
    assert [e.data for e in seg.read(0, 5)] == datas
    seg.close()


def test_bad_crc_in_tail_record_truncates_there(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 6, with_index=False)
    seg = reopen(tmp_path)
    offset = seg.offsets[4]
    seg.close()
    with open(data_path(tmp_path, LEDGER), "r+b") as f:
        f.seek(offset + HEADER_SIZE + 1)
        f.write(b"#")
    # Without an index the scan stops at the first bad record and drops all after it.
    index_path(tmp_path, LEDGER).unlink()
    seg = reopen(tmp_path)
    assert seg.count == 4
    assert file_size(tmp_path) == offset
    assert [e.data for e in seg.read(0, 4)] == datas[:4]
    seg.close()


def test_missing_index_is_rebuilt_by_scan(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 30, with_index=False)
    index_path(tmp_path, LEDGER).unlink()
    seg = reopen(tmp_path)
    assert seg.count == 30
    assert index_entries(tmp_path) == list(seg.offsets)
    assert [e.data for e in seg.read(0, 30)] == datas
    seg.close()


def test_lagging_index_is_trusted_then_the_rest_scanned(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 30)
    # Keep 10 index entries and half of the 11th: the index is behind and torn.
    path = index_path(tmp_path, LEDGER)
    os.truncate(path, len(INDEX_MAGIC) + 8 * 10 + 4)
    # A closed ledger (its count is known) trusts what of its index verifies.
    seg = reopen(tmp_path, expected=30)
    assert seg.count == 30
    assert index_entries(tmp_path) == list(seg.offsets)
    assert [e.data for e in seg.read(0, 30)] == datas
    seg.close()


def test_index_ahead_of_data_is_not_trusted(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 30)
    # The data lost its last records (page cache never written), the index did not.
    seg = reopen(tmp_path)
    cut = seg.offsets[25]
    seg.close()
    os.truncate(data_path(tmp_path, LEDGER), cut)
    index_path(tmp_path, LEDGER).write_bytes(
        INDEX_MAGIC + struct.pack("<30Q", *[*seg.offsets[:30]])
    )
    seg = reopen(tmp_path)
    assert seg.count == 25
    assert [e.data for e in seg.read(0, 25)] == datas[:25]
    assert index_entries(tmp_path) == list(seg.offsets)
    seg.close()


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda raw: b"NOTMAGIC" + raw[8:],
        lambda raw: raw[:8] + b"\x00" * (len(raw) - 8),
        lambda raw: raw[:16] + struct.pack("<Q", 10**12) + raw[24:],
        lambda raw: raw[:-8] + struct.pack("<Q", 3),
    ],
    ids=["magic", "zeros", "huge-offset", "not-increasing"],
)
def test_corrupt_index_falls_back_to_scan(tmp_path: Path, corrupt: object) -> None:
    datas = write_segment(tmp_path, 12)
    path = index_path(tmp_path, LEDGER)
    path.write_bytes(corrupt(path.read_bytes()))  # type: ignore[operator]
    seg = reopen(tmp_path)
    assert seg.count == 12
    assert [e.data for e in seg.read(0, 12)] == datas
    assert index_entries(tmp_path) == list(seg.offsets)
    seg.close()


def test_plausible_wrong_index_offset_is_detected(tmp_path: Path) -> None:
    """An index whose last offset points inside a record fails the record check."""
    datas = write_segment(tmp_path, 12)
    path = index_path(tmp_path, LEDGER)
    raw = bytearray(path.read_bytes())
    last = struct.unpack_from("<Q", raw, len(raw) - 8)[0]
    struct.pack_into("<Q", raw, len(raw) - 8, last + 3)
    path.write_bytes(bytes(raw))
    seg = reopen(tmp_path)
    assert [e.data for e in seg.read(0, seg.count)] == datas
    seg.close()


def test_expected_entries_cuts_unconfirmed_records(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 10)
    seg = reopen(tmp_path, expected=7)
    assert seg.count == 7
    assert file_size(tmp_path) == seg.end
    assert [e.data for e in seg.read(0, 7)] == datas[:7]
    assert index_entries(tmp_path) == list(seg.offsets)
    seg.close()


def test_record_longer_than_scan_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import keyshared.storage.segment as segment_mod

    monkeypatch.setattr(segment_mod, "_SCAN_CHUNK", 64)
    seg = Segment.create(tmp_path, LEDGER)
    datas = [b"a" * 10, b"b" * 500, b"c" * 30, b"d" * 200]
    for data in datas:
        offset = seg.reserve(len(data))
        os.pwrite(seg.fd, HEADER.pack(len(data), crc32c(data)) + data, offset)
    seg.close()
    with open(data_path(tmp_path, LEDGER), "ab") as f:
        f.write(HEADER.pack(300, 0) + b"x" * 100)  # a torn long record
    seg = reopen(tmp_path)
    assert [e.data for e in seg.read(0, seg.count)] == datas
    seg.close()


def test_bad_last_record_with_index_is_cut(tmp_path: Path) -> None:
    datas = write_segment(tmp_path, 6)
    seg = reopen(tmp_path)
    offset = seg.offsets[5]
    seg.close()
    with open(data_path(tmp_path, LEDGER), "r+b") as f:
        f.seek(offset + HEADER_SIZE)
        f.write(b"#")
    seg = reopen(tmp_path)
    assert seg.count == 5
    assert file_size(tmp_path) == offset
    assert [e.data for e in seg.read(0, 5)] == datas[:5]
    seg.close()


def test_corrupt_entry_on_read_raises(tmp_path: Path) -> None:
    write_segment(tmp_path, 3)
    seg = reopen(tmp_path)
    with open(data_path(tmp_path, LEDGER), "r+b") as f:
        f.seek(seg.offsets[1] + HEADER_SIZE)
        f.write(b"?")
    with pytest.raises(StorageError):
        seg.read(0, 3)
    assert [e.data for e in seg.read(2, 3)] == [payload(2)]
    seg.close()


def test_missing_file_is_an_empty_segment(tmp_path: Path) -> None:
    seg = reopen(tmp_path)
    assert seg.count == 0
    assert seg.end == 0
    seg.close()


def test_close_is_deferred_while_in_use(tmp_path: Path) -> None:
    write_segment(tmp_path, 2)
    seg = reopen(tmp_path)
    seg.acquire()
    seg.close()
    assert seg.fd >= 0
    assert len(seg.read(0, 2)) == 2
    seg.release()
    assert seg.fd == -1


def test_delete_removes_files(tmp_path: Path) -> None:
    write_segment(tmp_path, 2)
    seg = reopen(tmp_path)
    seg.delete()
    assert not data_path(tmp_path, LEDGER).exists()
    assert not index_path(tmp_path, LEDGER).exists()


def test_pool_closes_least_recently_used(tmp_path: Path) -> None:
    segs = [Segment.create(tmp_path, i) for i in range(3)]
    pool = SegmentPool(2)
    pool.add(segs[0])
    pool.add(segs[1])
    assert pool.get(0) is segs[0]
    pool.add(segs[2])
    assert segs[1].fd == -1
    assert pool.get(1) is None
    assert segs[0].fd >= 0
    pool.close_all()
    assert segs[0].fd == -1
    assert segs[2].fd == -1
    assert len(pool) == 0


def test_unclosed_ledger_verifies_every_record_not_only_the_indexed_last(tmp_path: Path) -> None:
    """A power cut that let the index and the last record's page reach the disk but not a page
    in the middle: the ledger ends before the torn record, whatever the index says."""
    datas = write_segment(tmp_path, 30)
    seg = reopen(tmp_path, expected=30)
    torn_at = seg.offsets[12] + HEADER_SIZE + 2
    seg.close()
    fd = os.open(data_path(tmp_path, LEDGER), os.O_RDWR)
    try:
        os.pwrite(fd, b"\x00" * 4, torn_at)  # a page that never reached the disk
    finally:
        os.close(fd)
    seg = reopen(tmp_path)  # not closed cleanly: no entry count
    assert seg.count == 12
    assert [e.data for e in seg.read(0, 12)] == datas[:12]
    assert index_entries(tmp_path) == list(seg.offsets)
    assert file_size(tmp_path) == seg.offsets[11] + HEADER_SIZE + len(datas[11])
    seg.close()


def test_make_durable_dirs_creates_every_missing_level(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "c"
    make_durable_dirs(target)
    assert target.is_dir()
    make_durable_dirs(target)  # existing: nothing to do
    fsync_directory(target)
