"""A FUSE file system that loses what was never synced (a test tool, in the spirit of LazyFS).

A passthrough over a backing directory, run in its own process. Writes and truncates of a file
stay in a volatile layer (what a reader of the mount sees, but not yet on the "disk", the
backing directory) until that file is ``fsync``ed; names created (files, directories, rename
targets) stay volatile until their parent directory is ``fsync``ed (strict POSIX: ext4 is kinder).
A control socket takes one-line commands:

- ``cut all SEED``: a power cut that loses every unsynced write and name;
- ``cut torn SEED``: every unsynced write of a file reaches the disk but its last, torn at a
  random point (names are lost);
- ``cut pages SEED``: a random subset of the unsynced 4 KiB pages reaches the disk, in any
  order (an index ahead of its data, a good record after a torn one; names are lost);
- ``fail_fsync GLOB``: ``fsync`` of matching paths fails with EIO (and, as after a failed
  write-back, their unsynced data is gone); ``fail_fsync -`` stops it;
- ``latency MS``: every ``fsync`` takes that much longer (a slow disk);
- ``ping``.

The process under test must be gone (SIGKILL) before a cut: the cut rewrites the backing files
behind open descriptors. Run: ``python -m tests.fault.lazyfs BACKING MOUNTPOINT CONTROL_SOCKET``.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import random
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import mfusepy as fuse

PAGE = 4096

# One pending change of a file: ("w", offset, data) or ("t", length, b"").
Op = tuple[str, int, bytes]


class LazyFS(fuse.Operations):  # type: ignore[misc]
    """The file system; every operation holds ``_mutex`` (the control thread changes state too)."""

    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.root = backing
        self._mutex = threading.RLock()
        self.ops: dict[str, list[Op]] = {}
        # Names created since their parent directory's last fsync: (parent, name) pairs.
        self.new_names: set[tuple[str, str]] = set()
        self.fail_glob = ""
        self.latency = 0.0
        self.fsyncs = 0

    def _p(self, path: str) -> str:
        return str(self.root) + path

    # --- the volatile view ---------------------------------------------------------------------
    def _size(self, path: str) -> int:
        size = os.lstat(self._p(path)).st_size
        for kind, a, data in self.ops.get(path, ()):
            size = max(size, a + len(data)) if kind == "w" else a
        return size

    def _view(self, path: str, fh: int, size: int, offset: int) -> bytes:
        buf = bytearray(os.pread(fh, size, offset))
        buf.extend(bytes(size - len(buf)))
        cur = os.fstat(fh).st_size
        for kind, a, data in self.ops.get(path, ()):
            if kind == "t":
                cut = max(0, a - offset)
                if cut < size:
                    buf[cut:] = bytes(size - cut)
                cur = a
            else:
                lo, hi = max(a, offset), min(a + len(data), offset + size)
                if lo < hi:
                    buf[lo - offset : hi - offset] = data[lo - a : hi - a]
                cur = max(cur, a + len(data))
        return bytes(buf[: max(0, min(size, cur - offset))])

    def _apply(self, path: str, ops: list[Op]) -> None:
        fd = os.open(self._p(path), os.O_WRONLY)
        try:
            for kind, a, data in ops:
                if kind == "t":
                    os.ftruncate(fd, a)
                else:
                    os.pwrite(fd, data, a)
        finally:
            os.close(fd)

    def _new_name(self, path: str) -> None:
        parent, _, name = path.rpartition("/")
        self.new_names.add((parent or "/", name))

    # --- FUSE operations -----------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._mutex:
            try:
                st = os.lstat(self._p(path))
            except OSError as exc:
                raise fuse.FuseOSError(exc.errno) from None
            out = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid")}
            out |= {k: getattr(st, k) for k in ("st_atime", "st_mtime", "st_ctime")}
            out["st_size"] = self._size(path) if path in self.ops else st.st_size
            return out

    def readdir(self, path: str, fh: int) -> list[str]:
        with self._mutex:
            return [".", "..", *os.listdir(self._p(path))]

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._p(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree")
        keys += ("f_files", "f_flag", "f_frsize", "f_namemax")
        return {k: getattr(st, k) for k in keys}

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._p(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._p(path), mode)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._p(path), ns=times) if times else os.utime(self._p(path))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            os.mkdir(self._p(path), mode)
            self._new_name(path)
            return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            os.rmdir(self._p(path))
            return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            os.unlink(self._p(path))
            self.ops.pop(path, None)
            return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            os.rename(self._p(old), self._p(new))
            if old in self.ops:
                self.ops[new] = self.ops.pop(old)
            self._new_name(new)
            return 0

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._mutex:
            fd = os.open(self._p(path), os.O_RDWR | os.O_CREAT, mode)
            self._new_name(path)
            return fd

    def open(self, path: str, flags: int) -> int:
        with self._mutex:
            fd = os.open(self._p(path), os.O_RDWR)
            if flags & os.O_TRUNC:
                self.ops.setdefault(path, []).append(("t", 0, b""))
            return fd

    def opendir(self, path: str) -> int:
        return os.open(self._p(path), os.O_RDONLY | os.O_DIRECTORY)

    def releasedir(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            if path not in self.ops:
                return os.pread(fh, size, offset)
            return self._view(path, fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            self.ops.setdefault(path, []).append(("w", offset, bytes(data)))
            return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._mutex:
            self.ops.setdefault(path, []).append(("t", length, b""))
            return 0

    def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
        raise fuse.FuseOSError(errno.EOPNOTSUPP)

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        if self.latency:
            time.sleep(self.latency)
        with self._mutex:
            if self.fail_glob and fnmatch.fnmatch(path, self.fail_glob):
                # A failed write-back: the data is not on the disk, and the page cache has
                # already dropped it (the lesson of PostgreSQL's fsyncgate).
                self.ops.pop(path, None)
                raise fuse.FuseOSError(errno.EIO)
            ops = self.ops.pop(path, [])
            if ops:
                self._apply(path, ops)
            os.fsync(fh)
            self.fsyncs += 1
            return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            self.new_names = {(p, n) for p, n in self.new_names if p != path}
            os.fsync(fh)
            return 0

    # --- faults --------------------------------------------------------------------------------
    def cut(self, mode: str, seed: int) -> str:
        """A power cut (see the module docstring); returns what reached the disk."""
        rng = random.Random(seed)
        with self._mutex:
            kept = 0
            for path, ops in sorted(self.ops.items()):
                if not os.path.exists(self._p(path)):
                    continue
                if mode == "torn":
                    chosen = ops[:-1]
                    kind, a, data = ops[-1]
                    chosen.append((kind, a, data[: rng.randrange(len(data) + 1)]))
                elif mode == "pages":
                    chosen = []
                    for kind, a, data in ops:
                        if kind == "t":
                            if rng.random() < 0.5:
                                chosen.append((kind, a, data))
                            continue
                        start = a
                        while start < a + len(data):
                            stop = min(a + len(data), (start // PAGE + 1) * PAGE)
                            if rng.random() < 0.5:
                                chosen.append(("w", start, data[start - a : stop - a]))
                            start = stop
                    rng.shuffle(chosen)
                else:
                    chosen = []
                self._apply(path, chosen)
                kept += len(chosen)
            self.ops.clear()
            lost = 0
            # Deepest first, so that a lost directory takes what was created inside it.
            for parent, name in sorted(self.new_names, key=lambda pn: -pn[0].count("/")):
                target = Path(self._p(parent.rstrip("/") + "/" + name))
                if target.is_dir():
                    shutil.rmtree(target, ignore_errors=True)
                    lost += 1
                elif target.exists():
                    target.unlink()
                    lost += 1
            self.new_names.clear()
            return f"kept {kept} lost-names {lost}"

    def control(self, line: str) -> str:
        """Run one control command."""
        words = line.split()
        if not words:
            return "err empty"
        cmd, args = words[0], words[1:]
        if cmd == "ping":
            return "ok"
        if cmd == "cut" and len(args) == 2 and args[0] in ("all", "torn", "pages"):
            return "ok " + self.cut(args[0], int(args[1]))
        if cmd == "fail_fsync" and len(args) == 1:
            self.fail_glob = "" if args[0] == "-" else args[0]
            return "ok"
        if cmd == "latency" and len(args) == 1:
            self.latency = float(args[0]) / 1000
            return "ok"
        if cmd == "stats":
            with self._mutex:
                pending = sum(len(v) for v in self.ops.values())
                return f"ok fsyncs {self.fsyncs} pending {pending} names {len(self.new_names)}"
        return f"err unknown command {line!r}"


def serve_control(fs: LazyFS, sock_path: str) -> None:
    """Answer control commands, one line in, one line out, until the process ends."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(4)
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("rw") as f:
            for line in f:
                try:
                    answer = fs.control(line.strip())
                except Exception as exc:  # a bad command must not take the file system down
                    answer = f"err {exc}"
                f.write(answer + "\n")
                f.flush()


def main(argv: list[str]) -> int:
    backing, mountpoint, control = argv
    fs = LazyFS(Path(backing).resolve())
    threading.Thread(target=serve_control, args=(fs, control), daemon=True).start()
    fuse.FUSE(
        fs,
        mountpoint,
        foreground=True,
        nothreads=True,
        attr_timeout=0,
        entry_timeout=0,
        negative_timeout=0,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
