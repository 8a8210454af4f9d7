"""A FUSE file system that loses what was not synced: power cuts for the crash tests.

A test tool, never in the production path. It mounts over a *backing* directory and behaves
like a disk with a volatile write cache in front of it, in the strict POSIX model:

* a file's writes and truncates since its last ``fsync``/``fdatasync`` live only in memory
  (reads see them); ``fsync`` of the file writes them through to the backing store;
* directory entries (create, mkdir, rename, unlink, rmdir) since the parent directory's last
  ``fsync`` are volatile too: a new file whose directory was never synced vanishes at a cut,
  whatever was synced of its data (Linux file systems often commit the entry with the file's
  fsync; POSIX does not promise it, so this layer does not either).

A control channel (a unix socket, one command a line, answered ``ok ...`` or ``err ...``):

* ``cut MODE SEED``: a power cut. ``all`` drops everything unsynced; ``torn`` writes back every
  unsynced write but the last of each file, and of that last one only a (seeded) prefix, and
  keeps every unsynced directory entry; ``pages`` writes back a seeded random subset of the
  unsynced 4 KiB pages (in no particular order: a later page may survive an earlier one) and of
  the unsynced directory entries (a rename counts as one entry: it reaches the disk whole or not
  at all, as on every journaling file system). Afterwards the mount shows only what was kept;
  open handles are dead (the machine rebooted).
* ``fail_fsync GLOB``: an fsync of a path matching the glob (``fnmatch`` on the path inside the
  mount, e.g. ``*/ledgers/*``) fails with EIO, and the file's unsynced data is dropped, as a
  kernel does after a failed write-back; ``fail_fsync`` alone stops failing.
* ``latency MS``: sleep that long in every fsync (a slow disk).
* ``stats``: counters, as ``key=value`` words. ``clear``: no failures, no latency.

Layout of the backing directory while mounted: file contents in ``.lazyfs/objects/<n>`` (one
per inode, holding its synced bytes); names are kept in memory, live and durable separately.
The existing tree is imported at mount; at unmount the durable names are written back as real
files (hard links to the objects), so the backing directory then shows what survives a power
loss at that moment.

Run as its own process: ``python -m tests.fault.lazyfs BACKING MOUNTPOINT --control SOCKET``
(foreground, single-threaded FUSE); :func:`mounted` does it for tests.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fnmatch
import logging
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE = 4096
TAIL = 32
"""Recent writes kept as such (for ``torn``); older ones are folded into the page map."""

META = ".lazyfs"

log = logging.getLogger("lazyfs")

Op = tuple[int, int, bytes]
"""A pending operation: (offset, length, data) for a write; (length, -1, b"") for a truncate."""


@dataclass
class Node:
    """An inode: a file (synced bytes in its object file, unsynced ones here) or a directory."""

    ino: int
    mode: int
    # files: the live view is object[:floor] + zeros, overlaid with `pages`, clipped to
    # `base_size`, then the `tail` operations in order.
    durable_size: int = 0
    floor: int = 0
    base_size: int = 0
    size: int = 0
    pages: dict[int, bytearray] = field(default_factory=dict)
    tail: list[Op] = field(default_factory=list)
    # directories
    live: dict[str, int] = field(default_factory=dict)
    durable: dict[str, int] = field(default_factory=dict)
    mtime: int = 0
    uid: int = 0
    gid: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def dirty(self) -> bool:
        return (
            bool(self.pages or self.tail)
            or self.floor != self.durable_size
            or (self.base_size != self.durable_size)
        )


class LazyFS:
    """The file system's state and operations (mfusepy ``Operations`` shape, paths in the mount)."""

    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.backing = backing
        self.objects = backing / META / "objects"
        self.lock = threading.RLock()
        self.nodes: dict[int, Node] = {}
        self.fds: dict[int, int] = {}
        self.handles: dict[int, int] = {}
        self.next_ino = 1
        self.next_fh = 1
        # Renames since their directories' last fsync: (from dir, name, to dir, name). A cut
        # keeps or drops each as one change (rename is atomic on every journaling file system),
        # never the new name without the old one's removal or the reverse.
        self.renames: list[tuple[int, str, int, str]] = []
        self.fail_glob: str | None = None
        self.latency = 0.0
        self.counts: dict[str, int] = {
            "fsyncs": 0,
            "dirsyncs": 0,
            "failed_fsyncs": 0,
            "cuts": 0,
            "writes": 0,
        }
        self._import()

    # --- backing store ----------------------------------------------------------------------

    def _new(self, mode: int) -> Node:
        n = Node(self.next_ino, mode, mtime=time.time_ns(), uid=os.getuid(), gid=os.getgid())
        self.next_ino += 1
        self.nodes[n.ino] = n
        return n

    def _import(self) -> None:
        """Take the backing tree (every name durable) and move its files into objects."""
        meta = self.backing / META
        if meta.exists():
            shutil.rmtree(meta)
        self.objects.mkdir(parents=True)
        root = self._new(stat.S_IFDIR | 0o755)

        def walk(path: Path, node: Node) -> None:
            for entry in sorted(os.scandir(path), key=lambda e: e.name):
                if entry.name == META and node is root:
                    continue
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    child = self._new(st.st_mode)
                    walk(Path(entry.path), child)
                    os.rmdir(entry.path)
                elif stat.S_ISREG(st.st_mode):
                    child = self._new(st.st_mode)
                    os.rename(entry.path, self.objects / str(child.ino))
                    child.durable_size = child.floor = child.base_size = child.size = st.st_size
                else:
                    continue
                node.live[entry.name] = node.durable[entry.name] = child.ino

        walk(self.backing, root)

    def export(self) -> None:
        """Write the durable names back as real files and directories; drop the objects."""
        with self.lock:
            done: set[int] = set()

            def walk(path: Path, node: Node) -> None:
                for name, ino in node.durable.items():
                    child = self.nodes[ino]
                    target = path / name
                    if child.is_dir:
                        target.mkdir(exist_ok=True)
                        if ino not in done:
                            done.add(ino)
                            walk(target, child)
                    else:
                        obj = self.objects / str(ino)
                        if not obj.exists():
                            obj.touch()
                        os.link(obj, target)

            for fd in self.fds.values():
                os.close(fd)
            self.fds.clear()
            walk(self.backing, self.nodes[1])
            shutil.rmtree(self.backing / META)

    def _fd(self, ino: int) -> int:
        fd = self.fds.get(ino)
        if fd is None:
            fd = os.open(self.objects / str(ino), os.O_RDWR | os.O_CREAT, 0o644)
            self.fds[ino] = fd
        return fd

    # --- the page map ------------------------------------------------------------------------

    def _page(self, n: Node, p: int) -> bytearray:
        page = n.pages.get(p)
        if page is None:
            start = p * PAGE
            page = bytearray(PAGE)
            upto = min(n.floor, n.durable_size, start + PAGE)
            if upto > start:
                data = os.pread(self._fd(n.ino), upto - start, start)
                page[: len(data)] = data
            n.pages[p] = page
        return page

    def _fold(self, n: Node, op: Op) -> None:
        a, b, data = op
        if b < 0:  # truncate to a
            for p in [p for p in n.pages if p * PAGE >= a]:
                del n.pages[p]
            page = n.pages.get(a // PAGE)
            if page is not None:
                page[a % PAGE :] = bytes(PAGE - a % PAGE)
            n.floor = min(n.floor, a)
            n.base_size = a
            return
        off, pos = a, 0
        while pos < b:
            p, within = divmod(off, PAGE)
            chunk = min(PAGE - within, b - pos)
            self._page(n, p)[within : within + chunk] = data[pos : pos + chunk]
            off += chunk
            pos += chunk
        n.base_size = max(n.base_size, a + b)

    def _push(self, n: Node, op: Op) -> None:
        n.tail.append(op)
        n.size = op[0] if op[1] < 0 else max(n.size, op[0] + op[1])
        while len(n.tail) > TAIL:
            self._fold(n, n.tail.pop(0))

    def _fold_all(self, n: Node, keep_last: bool = False) -> Op | None:
        last = n.tail.pop() if keep_last and n.tail else None
        for op in n.tail:
            self._fold(n, op)
        n.tail.clear()
        return last

    def _read(self, n: Node, off: int, size: int) -> bytes:
        end = min(off + size, n.size)
        if off >= end:
            return b""
        length = end - off
        buf = bytearray(length)
        upto = min(end, n.floor, n.durable_size)
        if upto > off:
            data = os.pread(self._fd(n.ino), upto - off, off)
            buf[: len(data)] = data
        if n.pages:
            for p in range(off // PAGE, (end - 1) // PAGE + 1):
                page = n.pages.get(p)
                if page is None:
                    continue
                s, e = max(p * PAGE, off), min(p * PAGE + PAGE, end)
                buf[s - off : e - off] = page[s - p * PAGE : e - p * PAGE]
        if n.base_size < end:
            buf[max(n.base_size - off, 0) :] = bytes(length - max(n.base_size - off, 0))
        for a, b, data in n.tail:
            if b < 0:
                if a < end:
                    cut = max(a - off, 0)
                    buf[cut:] = bytes(length - cut)
                continue
            s, e = max(a, off), min(a + b, end)
            if s < e:
                buf[s - off : e - off] = data[s - a : e - a]
        return bytes(buf)

    def _persist(self, n: Node, pages: set[int] | None = None, truncate: bool = True) -> None:
        """Write the page map through (only `pages` if given: a partial write-back)."""
        fd = self._fd(n.ino)
        if truncate and n.floor < n.durable_size:
            os.ftruncate(fd, n.floor)
            n.durable_size = n.floor
        top = n.durable_size
        for p, page in sorted(n.pages.items()):
            if pages is not None and p not in pages:
                continue
            length = min(PAGE, n.base_size - p * PAGE)
            if length > 0:
                os.pwrite(fd, page[:length], p * PAGE)
                top = max(top, p * PAGE + length)
        if pages is None:
            top = n.base_size
        os.ftruncate(fd, top)
        self._reset(n, top)

    def _reset(self, n: Node, size: int) -> None:
        n.pages.clear()
        n.tail.clear()
        n.durable_size = n.floor = n.base_size = n.size = size

    def _sync(self, n: Node) -> None:
        self._fold_all(n)
        self._persist(n)

    # --- names --------------------------------------------------------------------------------

    def _lookup(self, path: str) -> Node:
        n = self.nodes[1]
        for part in path.strip("/").split("/"):
            if not part:
                continue
            if not n.is_dir:
                raise OSError(errno.ENOTDIR, path)
            ino = n.live.get(part)
            if ino is None:
                raise OSError(errno.ENOENT, path)
            n = self.nodes[ino]
        return n

    def _parent(self, path: str) -> tuple[Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise OSError(errno.ENOTDIR, path)
        return parent, name

    def _gc(self) -> None:
        """Forget inodes no name (live or durable) and no open handle reaches."""
        seen: set[int] = set()
        stack = [1, *self.handles.values()]
        while stack:
            ino = stack.pop()
            if ino in seen or ino not in self.nodes:
                continue
            seen.add(ino)
            n = self.nodes[ino]
            stack.extend(n.live.values())
            stack.extend(n.durable.values())
        for ino in [i for i in self.nodes if i not in seen]:
            del self.nodes[ino]
            fd = self.fds.pop(ino, None)
            if fd is not None:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.objects / str(ino))

    # --- power cut and faults ------------------------------------------------------------------

    def cut(self, mode: str, seed: int) -> str:
        """Lose what was not synced as ``mode`` says; returns what was kept, in words."""
        if mode not in ("all", "torn", "pages"):
            raise ValueError(f"unknown cut mode {mode!r} (all, torn, pages)")
        rng = random.Random(seed)
        kept_pages = lost_pages = kept_entries = lost_entries = torn = 0
        with self.lock:
            # Which pending directory entry changes reach the disk; a rename is one change.
            keeps: dict[tuple[int, str], bool] = {}
            for ino in sorted(self.nodes):
                n = self.nodes[ino]
                for name in sorted(set(n.live) | set(n.durable)) if n.is_dir else ():
                    if n.live.get(name) != n.durable.get(name):
                        keeps[(ino, name)] = mode == "torn" or (
                            mode == "pages" and rng.random() < 0.5
                        )
            for src_dir, src_name, dst_dir, dst_name in self.renames:
                if (src_dir, src_name) in keeps and (dst_dir, dst_name) in keeps:
                    keeps[(dst_dir, dst_name)] = keeps[(src_dir, src_name)]
            self.renames.clear()
            for ino in sorted(self.nodes):
                n = self.nodes[ino]
                if n.is_dir:
                    for name in sorted(set(n.live) | set(n.durable)):
                        if n.live.get(name) == n.durable.get(name):
                            continue
                        if keeps[(ino, name)]:
                            kept_entries += 1
                            if name in n.live:
                                n.durable[name] = n.live[name]
                            else:
                                del n.durable[name]
                        else:
                            lost_entries += 1
                    n.live = dict(n.durable)
                    continue
                if not n.dirty:
                    continue
                if mode == "all":
                    lost_pages += len(n.pages) + len(n.tail)
                elif mode == "torn":
                    last = self._fold_all(n, keep_last=True)
                    self._persist(n)
                    if last is not None:
                        a, b, data = last
                        if b < 0:
                            if rng.random() < 0.5:
                                os.ftruncate(self._fd(ino), a)
                                n.durable_size = a
                        elif b > 0:
                            prefix = rng.randrange(b)
                            if prefix:
                                os.pwrite(self._fd(ino), data[:prefix], a)
                                n.durable_size = max(n.durable_size, a + prefix)
                            torn += 1
                else:
                    self._fold_all(n)
                    chosen = {p for p in sorted(n.pages) if rng.random() < 0.5}
                    kept_pages += len(chosen)
                    lost_pages += len(n.pages) - len(chosen)
                    self._persist(n, chosen, truncate=rng.random() < 0.5)
                size = os.fstat(self._fd(ino)).st_size if (self.objects / str(ino)).exists() else 0
                self._reset(n, size)
            self.handles.clear()
            self._gc()
            self.counts["cuts"] += 1
        return (
            f"kept_pages={kept_pages} lost_pages={lost_pages} torn_writes={torn} "
            f"kept_entries={kept_entries} lost_entries={lost_entries}"
        )

    def _fsync_fault(self, path: str | None) -> bool:
        return self.fail_glob is not None and fnmatch.fnmatch(path or "", self.fail_glob)

    # --- FUSE operations -----------------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self.lock:
            n = self.nodes[self.handles[fh]] if fh in self.handles else self._lookup(path)
            return {
                "st_mode": n.mode,
                "st_nlink": 2 if n.is_dir else 1,
                "st_size": 4096 if n.is_dir else n.size,
                "st_uid": n.uid,
                "st_gid": n.gid,
                "st_atime": n.mtime,
                "st_mtime": n.mtime,
                "st_ctime": n.mtime,
                "st_blocks": (n.size + 511) // 512,
                "st_blksize": PAGE,
            }

    def readdir(self, path: str, fh: int) -> list[str]:
        with self.lock:
            n = self._lookup(path)
            if not n.is_dir:
                raise OSError(errno.ENOTDIR, path)
            return [".", "..", *n.live]

    def opendir(self, path: str) -> int:
        with self.lock:
            if not self._lookup(path).is_dir:
                raise OSError(errno.ENOTDIR, path)
        return 0

    def access(self, path: str, amode: int) -> int:
        with self.lock:
            self._lookup(path)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.backing)
        return {k: getattr(st, k) for k in dir(st) if k.startswith("f_") and k != "f_fsid"}

    def mkdir(self, path: str, mode: int) -> int:
        with self.lock:
            parent, name = self._parent(path)
            if name in parent.live:
                raise OSError(errno.EEXIST, path)
            parent.live[name] = self._new(stat.S_IFDIR | (mode & 0o7777)).ino
            parent.mtime = time.time_ns()
        return 0

    def rmdir(self, path: str) -> int:
        with self.lock:
            parent, name = self._parent(path)
            n = self._lookup(path)
            if not n.is_dir:
                raise OSError(errno.ENOTDIR, path)
            if n.live:
                raise OSError(errno.ENOTEMPTY, path)
            del parent.live[name]
            self._gc()
        return 0

    def unlink(self, path: str) -> int:
        with self.lock:
            parent, name = self._parent(path)
            n = self._lookup(path)
            if n.is_dir:
                raise OSError(errno.EISDIR, path)
            del parent.live[name]
            self._gc()
        return 0

    def rename(self, old: str, new: str) -> int:
        with self.lock:
            src_parent, src_name = self._parent(old)
            n = self._lookup(old)
            dst_parent, dst_name = self._parent(new)
            existing = dst_parent.live.get(dst_name)
            if existing is not None:
                target = self.nodes[existing]
                if target.is_dir and not n.is_dir:
                    raise OSError(errno.EISDIR, new)
                if n.is_dir and not target.is_dir:
                    raise OSError(errno.ENOTDIR, new)
                if target.is_dir and target.live:
                    raise OSError(errno.ENOTEMPTY, new)
            del src_parent.live[src_name]
            dst_parent.live[dst_name] = n.ino
            self.renames.append((src_parent.ino, src_name, dst_parent.ino, dst_name))
            self._gc()
        return 0

    def chmod(self, path: str, mode: int) -> int:
        with self.lock:
            n = self._lookup(path)
            n.mode = (n.mode & ~0o7777) | (mode & 0o7777)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        with self.lock:
            n = self._lookup(path)
            if uid != -1 and uid != 0xFFFFFFFF:
                n.uid = uid
            if gid != -1 and gid != 0xFFFFFFFF:
                n.gid = gid
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self.lock:
            n = self._lookup(path)
            n.mtime = times[1] if times else time.time_ns()
        return 0

    def _handle(self, n: Node) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = n.ino
        return fh

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self.lock:
            parent, name = self._parent(path)
            existing = parent.live.get(name)
            if existing is not None:
                if flags & os.O_EXCL:
                    raise OSError(errno.EEXIST, path)
                n = self.nodes[existing]
                if flags & os.O_TRUNC:
                    self._push(n, (0, -1, b""))
                return self._handle(n)
            n = self._new(stat.S_IFREG | (mode & 0o7777))
            parent.live[name] = n.ino
            parent.mtime = time.time_ns()
            return self._handle(n)

    def open(self, path: str, flags: int) -> int:
        with self.lock:
            n = self._lookup(path)
            if n.is_dir:
                raise OSError(errno.EISDIR, path)
            if flags & os.O_TRUNC and n.size:
                self._push(n, (0, -1, b""))
            return self._handle(n)

    def _node(self, fh: int) -> Node:
        ino = self.handles.get(fh)
        if ino is None:  # a handle from before a cut
            raise OSError(errno.EIO, "stale handle")
        return self.nodes[ino]

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self.lock:
            return self._read(self._node(fh), offset, size)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self.lock:
            n = self._node(fh)
            self._push(n, (offset, len(data), bytes(data)))
            n.mtime = time.time_ns()
            self.counts["writes"] += 1
            return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self.lock:
            n = self._node(fh) if fh in self.handles else self._lookup(path)
            self._push(n, (length, -1, b""))
            n.mtime = time.time_ns()
        return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        if mode != 0:
            raise OSError(errno.EOPNOTSUPP, "fallocate mode")
        with self.lock:
            n = self._node(fh)
            if offset + size > n.size:
                self._push(n, (offset + size, -1, b""))
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self.lock:
            self.handles.pop(fh, None)
            self._gc()
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        if self.latency:
            time.sleep(self.latency)
        with self.lock:
            n = self._node(fh)
            if self._fsync_fault(path):
                self.counts["failed_fsyncs"] += 1
                self._reset(n, n.durable_size)
                raise OSError(errno.EIO, path)
            self._sync(n)
            self.counts["fsyncs"] += 1
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        if self.latency:
            time.sleep(self.latency)
        with self.lock:
            n = self._lookup(path)
            if self._fsync_fault(path):
                # The names stay visible (the kernel's view is not undone); they are simply
                # not durable, so the next cut drops them unless a later fsync succeeds.
                self.counts["failed_fsyncs"] += 1
                raise OSError(errno.EIO, path)
            n.durable = dict(n.live)
            self.renames = [r for r in self.renames if n.ino not in (r[0], r[2])]
            self.counts["dirsyncs"] += 1
            self._gc()
        return 0

    # --- control -------------------------------------------------------------------------------

    def command(self, line: str) -> str:
        """Run one control command; returns the answer line."""
        words = line.split()
        if not words:
            return "err empty command"
        cmd, args = words[0], words[1:]
        try:
            if cmd == "cut" and len(args) == 2:
                return "ok " + self.cut(args[0], int(args[1]))
            if cmd == "fail_fsync" and len(args) <= 1:
                self.fail_glob = args[0] if args else None
                return "ok"
            if cmd == "latency" and len(args) == 1:
                self.latency = float(args[0]) / 1000
                return "ok"
            if cmd == "clear" and not args:
                self.fail_glob, self.latency = None, 0.0
                return "ok"
            if cmd == "stats" and not args:
                with self.lock:
                    dirty = sum(1 for n in self.nodes.values() if not n.is_dir and n.dirty)
                    words = [f"{k}={v}" for k, v in self.counts.items()]
                    return "ok " + " ".join([*words, f"inodes={len(self.nodes)}", f"dirty={dirty}"])
            if cmd == "ping" and not args:
                return "ok"
        except (ValueError, OSError) as exc:
            return f"err {exc}"
        return f"err unknown command {line.strip()!r}"


def serve_control(fs: LazyFS, path: Path) -> None:
    """Answer control commands on a unix socket, one connection at a time, in a daemon thread."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def loop() -> None:
        while True:
            conn, _ = server.accept()
            with conn, conn.makefile("rw") as f:
                for line in f:
                    f.write(fs.command(line) + "\n")
                    f.flush()

    threading.Thread(target=loop, name="lazyfs-control", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    """Mount in the foreground until unmounted; then write the durable names back."""
    import mfusepy

    parser = argparse.ArgumentParser(prog="python -m tests.fault.lazyfs", description=__doc__)
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--control", type=Path, required=True, help="unix socket for commands")
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING)
    fs = LazyFS(args.backing.resolve())
    serve_control(fs, args.control)
    ops = _operations(fs, mfusepy)
    try:
        mfusepy.FUSE(
            ops,
            str(args.mountpoint),
            foreground=True,
            nothreads=True,
            hard_remove=True,
            attr_timeout=0,
            entry_timeout=0,
            negative_timeout=0,
            fsname="lazyfs",
        )
    finally:
        fs.export()


def _operations(fs: LazyFS, mfusepy: Any) -> Any:
    """An ``mfusepy.Operations`` that forwards to ``fs`` (only what it implements)."""
    names = [
        "getattr", "readdir", "opendir", "access", "statfs", "mkdir", "rmdir", "unlink",
        "rename", "chmod", "chown", "utimens", "create", "open", "read", "write", "truncate",
        "fallocate", "flush", "release", "fsync", "fsyncdir",
    ]  # fmt: skip
    ns: dict[str, Any] = {"use_ns": True}
    for name in names:
        ns[name] = (lambda f: lambda self, *a: f(*a))(getattr(fs, name))
    return type("LazyOps", (mfusepy.Operations,), ns)()


# --- helpers for tests -------------------------------------------------------------------------


class Control:
    """The test side of the control socket."""

    def __init__(self, path: Path, mountpoint: Path, proc: subprocess.Popen[bytes]) -> None:
        self.path = path
        self.mountpoint = mountpoint
        self.proc = proc

    def send(self, line: str) -> str:
        """Send one command; returns the answer after ``ok``; raises on ``err``."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(self.path))
            s.sendall(line.encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
        answer = buf.decode().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"lazyfs {line!r}: {answer}")
        return answer[2:].strip()

    def cut(self, mode: str = "all", seed: int = 0) -> dict[str, int]:
        """A power cut; returns the counts of what was kept and lost."""
        return _words(self.send(f"cut {mode} {seed}"))

    def fail_fsync(self, glob: str | None) -> None:
        """Fail fsyncs of paths (inside the mount) matching ``glob``; None stops it."""
        self.send("fail_fsync" + (f" {glob}" if glob else ""))

    def latency(self, ms: float) -> None:
        """Sleep ``ms`` in every fsync."""
        self.send(f"latency {ms}")

    def clear(self) -> None:
        """No failures, no latency."""
        self.send("clear")

    def stats(self) -> dict[str, int]:
        """Counters: fsyncs, dirsyncs, failed_fsyncs, cuts, writes, inodes, dirty files."""
        return _words(self.send("stats"))


def _words(text: str) -> dict[str, int]:
    return {k: int(v) for k, _, v in (w.partition("=") for w in text.split())}


def _is_mount(path: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(path) for line in f)


def fuse_available() -> str | None:
    """Why FUSE cannot be used here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian package fuse3: make deps-fuse)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy: {exc}"
    return None


@contextlib.contextmanager
def mounted(backing: Path, mountpoint: Path, timeout: float = 15.0) -> Iterator[Control]:
    """Mount a LazyFS over ``backing`` at ``mountpoint`` in its own process; always unmount."""
    backing.mkdir(parents=True, exist_ok=True)
    mountpoint.mkdir(parents=True, exist_ok=True)
    sock = mountpoint.parent / f".{mountpoint.name}.lazyfs.sock"
    log_path = mountpoint.parent / f".{mountpoint.name}.lazyfs.log"
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fault.lazyfs",
                str(backing),
                str(mountpoint),
                "--control",
                str(sock),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
        )
    mountpoint = mountpoint.resolve()
    control = Control(sock, mountpoint, proc)
    try:
        deadline = time.monotonic() + timeout
        while not (_is_mount(mountpoint) and sock.exists()):
            if proc.poll() is not None:
                raise RuntimeError(f"lazyfs exited with {proc.returncode}: {log_path.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"lazyfs did not mount in {timeout}s: {log_path.read_text()}")
            time.sleep(0.02)
        control.send("ping")
        yield control
    finally:
        if _is_mount(mountpoint):
            done = subprocess.run(["fusermount3", "-u", str(mountpoint)], capture_output=True)
            if done.returncode != 0:
                subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            subprocess.run(["fusermount3", "-uz", str(mountpoint)], capture_output=True)


if __name__ == "__main__":
    main(sys.argv[1:])
