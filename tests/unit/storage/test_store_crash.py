"""SIGKILL a process that is appending; every entry it saw confirmed must survive, intact."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyshared.storage.config import StorageConfig
from keyshared.storage.position import EARLIEST, Position
from keyshared.storage.store import Storage

CHILD = r"""
import asyncio, sys
from pathlib import Path
from keyshared.storage.config import StorageConfig
from keyshared.storage.store import Storage

def payload(i):
    return b"%d-" % i * (1 + i % 7)

async def main():
    st = Storage(Path(sys.argv[1]), StorageConfig(max_entries_per_ledger=97)).open()
    ml = st.open_managed_ledger("crash-topic")
    out = sys.stdout
    sys.stdout.write("ready\n")
    sys.stdout.flush()

    def confirmed(fut, pos, i):
        if fut.exception() is None:
            out.write(f"{pos.ledger_id} {pos.entry_id} {i}\n")
            out.flush()

    i = 0
    while True:
        batch = []
        for _ in range(64):
            pos, fut = ml.add_entry(payload(i))
            fut.add_done_callback(lambda f, pos=pos, i=i: confirmed(f, pos, i))
            batch.append(fut)
            i += 1
        await asyncio.gather(*batch)

asyncio.run(main())
"""


def payload(i: int) -> bytes:
    return b"%d-" % i * (1 + i % 7)


@pytest.mark.crash
@pytest.mark.parametrize("round_", [1, 2])
def test_sigkill_loses_no_confirmed_entry(tmp_path: Path, round_: int) -> None:
    confirmed: list[tuple[Position, int]] = []
    # The second round kills a process that reopened a directory left by a kill.
    for _ in range(round_):
        confirmed += run_and_kill(tmp_path, min_confirmed=1500)

    async def check() -> None:
        st = Storage(tmp_path, StorageConfig(max_entries_per_ledger=97)).open()
        ml = st.open_managed_ledger("crash-topic")
        entries = await ml.read_entries(EARLIEST, 10**7)
        by_pos = {e.position: e.data for e in entries}
        for pos, i in confirmed:
            assert by_pos.get(pos) == payload(i), f"confirmed entry {pos} (#{i}) lost"
        # FIFO writes: what survived of each run is a gap-free prefix of what it appended
        # (entry numbers 0, 1, 2, ... restarting at 0 for the next run), each intact.
        previous = -1
        runs = 0
        for entry in entries:
            i = int(entry.data.split(b"-", 1)[0])
            assert i in (previous + 1, 0)
            assert entry.data == payload(i)
            runs += i == 0
            previous = i
        assert runs == round_
        assert ml.number_of_entries == len(entries)
        await st.close()

    asyncio.run(check())


def run_and_kill(path: Path, min_confirmed: int) -> list[tuple[Position, int]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[3] / "src")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[bytes] = []
    try:
        assert proc.stdout.readline() == b"ready\n"
        deadline = time.monotonic() + 20
        while len(lines) < min_confirmed and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    # Lines still in the pipe were written (so confirmed) before the kill; a torn last line
    # was being written at the kill and is ignored.
    lines += rest.splitlines(keepends=True)
    out = []
    for line in lines:
        if not line.endswith(b"\n"):
            continue
        ledger, entry, i = map(int, line.split())
        out.append((Position(ledger, entry), i))
    assert len(out) >= min_confirmed, err.decode()
    return out
