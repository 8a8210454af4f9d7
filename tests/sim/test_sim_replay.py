"""A seed replays exactly: same trace twice in one process, in another process with another
string-hash seed, and a cut schedule is a prefix of the full one."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.sim.simulator import run_seed, shrink

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (3, 17, 101, 2024)  # 101 runs the classic dispatcher (simulator.is_classic)


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_same_seed_same_trace_in_one_process() -> None:
    for seed in SEEDS:
        first = run_seed(seed).trace
        second = run_seed(seed).trace
        assert len(first) > 20
        assert first == second, f"seed {seed} took two different paths"


def test_same_seed_same_trace_in_another_process() -> None:
    here = {seed: _digest(run_seed(seed).trace) for seed in SEEDS}
    code = (
        "import hashlib, sys\n"
        "from tests.sim.simulator import run_seed\n"
        f"for s in {SEEDS!r}:\n"
        "    t = run_seed(s).trace\n"
        "    print(s, hashlib.sha256('\\n'.join(t).encode()).hexdigest())\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    there = {int(s): d for s, d in (line.split() for line in out.stdout.splitlines())}
    assert there == here


def test_a_cut_schedule_is_a_prefix() -> None:
    seed = 17
    full = run_seed(seed).trace
    cut = run_seed(seed, 12).trace
    body = [line for line in cut if not line.lstrip().startswith(("0 ", "13 "))]
    steps = [line for line in full if int(line.split()[0]) <= 12 and int(line.split()[0]) > 0]
    assert body == steps


def test_shrink_of_a_passing_seed_is_none() -> None:
    assert shrink(3) is None
