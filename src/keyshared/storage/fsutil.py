"""Directory entries that survive a power cut.

A file's ``fsync`` makes its data durable, not its name: under POSIX a new file or directory is
only reachable after a crash once its parent directory was synced too (ext4 in its default mode
happens to do this for you; other file systems, and a strict power-loss model, do not). Every
directory the storage creates, and the directory holding every file it creates, is synced here.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_directory(path: Path) -> None:
    """Make the entries of directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_durable_dirs(path: Path, *, sync: bool = True) -> None:
    """``mkdir -p path``, syncing the parent of every directory it creates (with ``sync``)."""
    missing: list[Path] = []
    p = path.absolute()
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir()
        except FileExistsError:
            continue
        if sync:
            fsync_directory(d.parent)
