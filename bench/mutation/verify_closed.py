"""Re-run each survivor that a new test closes against that test, and record that it is killed.

    python bench/mutation/verify_closed.py                 # every entry of closed.toml
    python bench/mutation/verify_closed.py key_shared.xǁ   # the entries naming one of these

``bench/mutation/closed.toml`` maps a mutant that survived a run to the test written for it
(a pytest node id). Each is run in ./mutants with ``MUTANT_UNDER_TEST`` set: the test must
fail under the mutant, and pass without it. Results go to bench/results/mutation/closed.json
(merged into what is there when only some entries are checked), which report.py counts as
killed. (``run.py --rerun survived`` does the same through mutmut with every test, at the cost
of mutmut's start-up: minutes on a loaded machine.)

One process per test node runs the node once clean and once under each of its mutants, with
``pytest.main`` in a loop: mutmut's trampolines read ``MUTANT_UNDER_TEST`` at every call, so
no re-import is needed, and a test node costs one interpreter start-up, not two per mutant.
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

# Runs in ./mutants: argv[1] is the node, argv[2:] the mutants ("" = the original code); prints
# one JSON list of pytest's exit codes.
_WORKER = """
import json, os, sys
import pytest
node, mutants = sys.argv[1], sys.argv[2:]
codes = []
args = ["-q", "-x", "-n", "0", "-p", "no:cacheprovider", "-o", "addopts=", node]
out = os.dup(1)
for mutant in mutants:
    os.environ["MUTANT_UNDER_TEST"] = mutant
    codes.append(int(pytest.main(args)))
os.write(out, ("\\nCODES " + json.dumps(codes) + "\\n").encode())
"""


def run_node(node: str, mutants: list[str]) -> tuple[int, list[int]]:
    """pytest's exit code for ``node`` clean, then under each of ``mutants``."""
    env = dict(os.environ, PYTHONPATH=f"{MUTANTS / 'src'}:{MUTANTS}")
    env.pop("MUTANT_UNDER_TEST", None)
    cmd = [sys.executable, "-c", _WORKER, node, "", *mutants]
    proc = subprocess.run(cmd, cwd=MUTANTS, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CODES ")]
    if not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        return -1, [-1] * len(mutants)
    codes: list[int] = json.loads(lines[-1].removeprefix("CODES "))
    return codes[0], codes[1:]


def main(argv: list[str] | None = None) -> int:
    """Verify the entries of closed.toml (those naming one of ``argv``); the exit status."""
    filters = sys.argv[1:] if argv is None else argv
    closed = {str(k): str(v) for k, v in tomllib.loads(CLOSED.read_text()).items()}
    if filters:
        closed = {k: v for k, v in closed.items() if any(f in k for f in filters)}
    # The tests as they are now (mutmut copies tests/ only when it starts).
    shutil.copytree(ROOT / "tests", MUTANTS / "tests", dirs_exist_ok=True)
    results: dict[str, dict[str, object]] = {}
    if filters and OUT.exists():
        results = json.loads(OUT.read_text())
    by_node: dict[str, list[str]] = {}
    for mutant, node in closed.items():
        by_node.setdefault(node, []).append(mutant)
    ok = True
    for node, mutants in by_node.items():
        clean, under = run_node(node, mutants)
        for mutant, code in zip(mutants, under, strict=True):
            killed = code == 1 and clean == 0
            ok &= killed
            results[mutant] = {"test": node, "killed": killed, "exit": code, "clean_exit": clean}
            print(f"{'killed' if killed else 'NOT KILLED'}: {mutant} by {node}", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
