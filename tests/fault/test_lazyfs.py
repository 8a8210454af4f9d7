"""The power-loss FUSE layer itself: what a cut keeps and what it drops, on a real mount."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fault.lazyfs import PAGE, TAIL, Control, LazyFS, fuse_available, mounted

pytestmark = pytest.mark.xdist_group("power-loss")


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[tuple[Path, Control]]:
    reason = fuse_available()
    assert reason is None, f"FUSE is needed (make deps-fuse): {reason}"
    with mounted(tmp_path / "backing", tmp_path / "mnt") as control:
        yield control.mountpoint, control


def write(path: Path, data: bytes, *, sync: bool, flags: int = os.O_CREAT | os.O_WRONLY) -> None:
    fd = os.open(path, flags, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_cut_all_drops_unsynced_data_and_keeps_synced(fs: tuple[Path, Control]) -> None:
    mnt, control = fs
    write(mnt / "f", b"synced|", sync=True)
    sync_dir(mnt)
    write(mnt / "f", b"unsynced tail", sync=False, flags=os.O_WRONLY | os.O_APPEND)
    assert (mnt / "f").read_bytes() == b"synced|unsynced tail"  # reads see the volatile layer
    kept = control.cut("all", 1)
    assert kept["lost_pages"] > 0
    assert (mnt / "f").read_bytes() == b"synced|"
    # An unsynced truncate is undone as well.
    os.truncate(mnt / "f", 2)
    assert (mnt / "f").read_bytes() == b"sy"
    control.cut("all", 2)
    assert (mnt / "f").read_bytes() == b"synced|"


def test_new_file_needs_its_directory_synced(fs: tuple[Path, Control]) -> None:
    mnt, control = fs
    (mnt / "d").mkdir()
    sync_dir(mnt)
    write(mnt / "d" / "data-synced-entry-not", b"x" * 5000, sync=True)
    write(mnt / "d" / "both", b"y" * 5000, sync=True)
    sync_dir(mnt / "d")
    write(mnt / "d" / "later", b"z", sync=True)  # entry made after the directory's fsync
    (mnt / "e").mkdir()  # a directory whose parent is never synced again
    control.cut("all", 3)
    assert sorted(os.listdir(mnt)) == ["d"]
    assert sorted(os.listdir(mnt / "d")) == ["both", "data-synced-entry-not"]
    assert (mnt / "d" / "both").read_bytes() == b"y" * 5000
    # A rename and an unlink are undone too unless the directory is synced.
    os.rename(mnt / "d" / "both", mnt / "d" / "renamed")
    os.unlink(mnt / "d" / "data-synced-entry-not")
    control.cut("all", 4)
    assert sorted(os.listdir(mnt / "d")) == ["both", "data-synced-entry-not"]
    os.rename(mnt / "d" / "both", mnt / "d" / "renamed")
    sync_dir(mnt / "d")
    control.cut("all", 5)
    assert sorted(os.listdir(mnt / "d")) == ["data-synced-entry-not", "renamed"]


def test_torn_keeps_a_strict_prefix_of_the_last_write(fs: tuple[Path, Control]) -> None:
    mnt, control = fs
    write(mnt / "log", b"A" * 100, sync=True)
    sync_dir(mnt)
    record = bytes(range(256)) * 40
    prefixes = set()
    for seed in range(6):
        fd = os.open(mnt / "log", os.O_WRONLY | os.O_APPEND)
        os.write(fd, b"B" * 50)  # an earlier unsynced write: written back whole by `torn`
        os.write(fd, record)
        os.close(fd)
        control.cut("torn", seed)
        data = (mnt / "log").read_bytes()
        assert data[:150] == b"A" * 100 + b"B" * 50
        tail = data[150:]
        assert len(tail) < len(record) and record.startswith(tail)
        prefixes.add(len(tail))
        os.truncate(mnt / "log", 100)
        fd = os.open(mnt / "log", os.O_WRONLY)
        os.fsync(fd)
        os.close(fd)
    assert len(prefixes) > 1  # the seed picks where the write tears


def test_pages_keeps_a_seeded_subset_of_pages(fs: tuple[Path, Control]) -> None:
    mnt, control = fs
    pages = 64
    write(mnt / "p", bytes(4096 * pages), sync=True)
    sync_dir(mnt)
    kept: list[int] = []
    for seed in (7, 7, 8):
        fd = os.open(mnt / "p", os.O_WRONLY)
        for i in range(pages):
            os.pwrite(fd, bytes([i + 1]) * 4096, i * 4096)
        os.close(fd)
        control.cut("pages", seed)
        data = (mnt / "p").read_bytes()
        assert len(data) == 4096 * pages
        survivors = [i for i in range(pages) if data[i * 4096 : (i + 1) * 4096] != bytes(4096)]
        for i in survivors:  # a page is either all old or all new
            assert data[i * 4096 : (i + 1) * 4096] == bytes([i + 1]) * 4096
        kept.append(len(survivors))
        assert 0 < len(survivors) < pages
        fd = os.open(mnt / "p", os.O_WRONLY)
        os.pwrite(fd, bytes(4096 * pages), 0)
        os.fsync(fd)
        os.close(fd)
    assert kept[0] == kept[1]  # the same seed, the same choice


def test_failed_fsync_is_reported_and_drops_the_unsynced_data(fs: tuple[Path, Control]) -> None:
    mnt, control = fs
    (mnt / "ledgers").mkdir()
    sync_dir(mnt)
    write(mnt / "ledgers" / "seg", b"good|", sync=True)
    sync_dir(mnt / "ledgers")
    control.fail_fsync("/ledgers/*")
    fd = os.open(mnt / "ledgers" / "seg", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"lost")
        with pytest.raises(OSError) as exc:
            os.fsync(fd)
        assert exc.value.errno == errno.EIO
    finally:
        os.close(fd)
    write(mnt / "other", b"fine", sync=True)  # other paths still sync
    assert control.stats()["failed_fsyncs"] == 1
    control.clear()
    control.cut("all", 9)
    assert (mnt / "ledgers" / "seg").read_bytes() == b"good|"


def test_unmount_leaves_the_durable_tree_in_the_backing_directory(tmp_path: Path) -> None:
    backing = tmp_path / "backing"
    backing.mkdir()
    (backing / "old").write_bytes(b"before the mount")
    with mounted(backing, tmp_path / "mnt") as control:
        mnt = control.mountpoint
        assert (mnt / "old").read_bytes() == b"before the mount"
        write(mnt / "kept", b"k", sync=True)
        sync_dir(mnt)
        write(mnt / "lost", b"l", sync=True)
    assert sorted(os.listdir(backing)) == ["kept", "old"]
    assert (backing / "kept").read_bytes() == b"k"


# --- the model itself, without a mount: random writes, truncates, syncs and cuts ---------------


def _apply(data: bytearray, op: tuple[int, int, bytes]) -> None:
    a, b, chunk = op
    if b < 0:
        del data[a:]
        data.extend(bytes(a - len(data)))
    else:
        data.extend(bytes(max(0, a + b - len(data))))
        data[a : a + b] = chunk


@pytest.mark.parametrize("mode", ["all", "torn", "pages"])
def test_the_volatile_view_and_each_cut_against_a_byte_array_model(
    tmp_path: Path, mode: str
) -> None:
    """Reads always show the last writes; a cut leaves exactly what its mode allows."""
    rng = random.Random(mode)
    fs = LazyFS(tmp_path)
    for rnd in range(40):
        fh = fs.create("/f", 0o644, 0) if rnd == 0 else fs.open("/f", os.O_RDWR)
        if rnd == 0:
            fs.fsyncdir("/", 0, 0)
        durable = bytearray(fs.read("/f", 1 << 20, 0, fh))
        live = bytearray(durable)
        ops: list[tuple[int, int, bytes]] = []
        # More operations than the layer keeps unfolded (TAIL), across page boundaries.
        for _ in range(rng.randrange(1, 3 * TAIL)):
            if rng.random() < 0.1:
                op: tuple[int, int, bytes] = (rng.randrange(3 * PAGE), -1, b"")
                fs.truncate("/f", op[0], fh)
            else:
                chunk = rng.randbytes(rng.randrange(1, 2 * PAGE))
                op = (rng.randrange(4 * PAGE), len(chunk), chunk)
                fs.write("/f", chunk, op[0], fh)
            _apply(live, op)
            ops.append(op)
            if rng.random() < 0.05:
                fs.fsync("/f", 0, fh)
                durable, ops = bytearray(live), []
            assert fs.read("/f", 1 << 20, 0, fh) == live
            assert fs.getattr("/f", fh)["st_size"] == len(live)
        fs.cut(mode, rnd)
        fh = fs.open("/f", os.O_RDWR)
        after = fs.read("/f", 1 << 20, 0, fh)
        if mode == "all" or not ops:
            assert after == durable
        elif mode == "torn":
            base = bytearray(durable)
            for op in ops[:-1]:
                _apply(base, op)
            a, b, chunk = ops[-1]
            if b < 0:  # a truncate: done or not
                assert after in (bytes(base), bytes(base[:a]) + bytes(max(0, a - len(base))))
            else:  # a strict prefix chunk[:k] of the write, for some k < b
                padded = bytes(base) + bytes(max(0, a - len(base)))
                rest = after[a:]
                # k is at most where `after` stops agreeing with the chunk: try from there down
                # (the first try matches unless old and new bytes happen to agree).
                upto = next((i for i in range(min(len(rest), b - 1)) if rest[i] != chunk[i]), None)
                upto = min(len(rest), b - 1) if upto is None else upto
                outcomes = (
                    bytes(base) if k == 0 else padded[:a] + chunk[:k] + padded[a + k :]
                    for k in range(upto, -1, -1)
                )
                assert after in outcomes
        else:
            # Every byte is old, new, zero (a hole, or an unsynced truncate that reached the
            # disk) and whole pages below both sizes are one or the other; at the end of the file a
            # page's write may land without the size change (or truncate) around it.
            below = min(len(durable), len(live), len(after)) // PAGE * PAGE
            for p in range(0, len(after), PAGE):
                page = after[p : p + PAGE]
                old, new = durable[p : p + len(page)], live[p : p + len(page)]
                if p + PAGE <= below and not any(b < 0 for _, b, _ in ops):
                    assert page in (old, new), f"page {p // PAGE} is neither old nor new"
                for i, byte in enumerate(page):
                    assert byte == 0 or byte in old[i : i + 1] or byte in new[i : i + 1], p + i
        fs.release("/f", fh)


def test_a_rename_reaches_the_disk_whole_or_not_at_all(tmp_path: Path) -> None:
    fs = LazyFS(tmp_path)
    fs.release("/old", fs.create("/old", 0o644, 0))
    fs.fsyncdir("/", 0, 0)
    seen = set()
    for seed in range(20):
        fs.rename("/old", "/new")
        fs.release("/x", fs.create("/x", 0o644, 0))  # an unrelated entry, kept or not
        fs.cut("pages", seed)
        names = set(fs.readdir("/", 0)) - {".", "..", "x"}
        assert names in ({"old"}, {"new"}), names
        seen.add(frozenset(names))
        if names == {"new"}:
            fs.rename("/new", "/old")
            fs.fsyncdir("/", 0, 0)
    assert len(seen) == 2  # both outcomes happen


def test_a_failed_directory_fsync_leaves_the_names_visible_but_not_durable(
    tmp_path: Path,
) -> None:
    fs = LazyFS(tmp_path)
    fs.mkdir("/d", 0o755)
    fs.fsyncdir("/", 0, 0)
    fs.release("/d/f", fs.create("/d/f", 0o644, 0))
    fs.command("fail_fsync /d")
    with pytest.raises(OSError) as exc:
        fs.fsyncdir("/d", 0, 0)
    assert exc.value.errno == errno.EIO
    assert "f" in fs.readdir("/d", 0)
    fs.command("fail_fsync")
    fs.cut("all", 0)
    assert fs.readdir("/d", 0) == [".", ".."]
