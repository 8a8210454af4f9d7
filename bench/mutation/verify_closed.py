"""Re-run each survivor that a new test closes against that test, and record that it is killed.

    python bench/mutation/verify_closed.py

``bench/mutation/closed.toml`` maps a mutant that survived a run to the test written for it
(a pytest node id). Each is run in ./mutants with ``MUTANT_UNDER_TEST`` set: the test must
fail under the mutant, and pass without it. Results go to bench/results/mutation/closed.json,
which report.py counts as killed. (``run.py --rerun survived`` does the same through mutmut
with every test, at the cost of mutmut's start-up: minutes on a loaded machine.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MUTANTS, RESULTS, ROOT

CLOSED = Path(__file__).resolve().parent / "closed.toml"
OUT = RESULTS / "closed.json"


def run_test(node: str, mutant: str) -> int:
    """pytest's exit code for ``node`` under ``mutant`` ("" = the original code)."""
    env = dict(os.environ, MUTANT_UNDER_TEST=mutant, PYTHONPATH=f"{MUTANTS / 'src'}:{MUTANTS}")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider"]
    cmd += ["-o", "addopts=", node]
    return subprocess.run(cmd, cwd=MUTANTS, env=env, capture_output=True, timeout=600).returncode


def main() -> int:
    """Verify every entry of closed.toml; returns the exit status."""
    closed = {str(k): str(v) for k, v in tomllib.loads(CLOSED.read_text()).items()}
    # The tests as they are now (mutmut copies tests/ only when it starts).
    shutil.copytree(ROOT / "tests", MUTANTS / "tests", dirs_exist_ok=True)
    results: dict[str, dict[str, object]] = {}
    ok = True
    for mutant, node in closed.items():
        under = run_test(node, mutant)
        clean = run_test(node, "")
        killed = under == 1 and clean == 0
        ok &= killed
        results[mutant] = {"test": node, "killed": killed, "exit": under, "clean_exit": clean}
        print(f"{'killed' if killed else 'NOT KILLED'}: {mutant} by {node}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
