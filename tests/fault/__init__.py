"""Faults below the process: a FUSE layer that loses unsynced data (lazyfs)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def fuse_available() -> str:
    """Why a FUSE mount cannot be made here ("" when it can)."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian's fuse3; `make test` installs it)"
    if os.geteuid() != 0:
        return "mounting needs root"
    return ""


@dataclass
class LazyMount:
    """A mounted lazyfs: ``mnt`` is what the broker uses, ``backing`` is the "disk"."""

    mnt: Path
    backing: Path
    control: Path
    proc: subprocess.Popen[bytes]

    def command(self, line: str) -> str:
        """Send one control command; raise if the file system refused it."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(self.control))
            s.sendall(line.encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
        text = answer.decode().strip()
        if not text.startswith("ok"):
            raise RuntimeError(f"lazyfs {line!r}: {text}")
        return text

    def cut(self, mode: str, seed: int) -> str:
        """A power cut (the process using the mount must be gone)."""
        return self.command(f"cut {mode} {seed}")


def _unmount(mnt: Path) -> None:
    for args in (["fusermount3", "-u", str(mnt)], ["fusermount3", "-uz", str(mnt)]):
        if not os.path.ismount(mnt):
            return
        subprocess.run(args, capture_output=True, timeout=30, check=False)
        time.sleep(0.1)


@contextlib.contextmanager
def lazy_mount(root: Path) -> Iterator[LazyMount]:
    """Mount lazyfs over ``root/backing`` at ``root/mnt``; always unmounted afterwards."""
    backing, mnt, control = root / "backing", root / "mnt", root / "control.sock"
    backing.mkdir(parents=True, exist_ok=True)
    mnt.mkdir(parents=True, exist_ok=True)
    log = open(root / "lazyfs.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fault.lazyfs", str(backing), str(mnt), str(control)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while not (os.path.ismount(mnt) and control.exists()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"lazyfs did not mount: {(root / 'lazyfs.log').read_text()}")
            time.sleep(0.05)
        mount = LazyMount(mnt, backing, control, proc)
        mount.command("ping")
        yield mount
    finally:
        _unmount(mnt)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
