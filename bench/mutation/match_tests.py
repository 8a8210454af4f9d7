"""Which of some tests kills which survivors: the step between writing tests and closed.toml.

    python bench/mutation/match_tests.py tests/unit/mutation/test_x.py key_shared.xǁKeyShared
    python bench/mutation/match_tests.py --write tests/unit/mutation/test_x.py key_shared.xǁ

Runs every test of the file (its node ids, collected) clean and under each survivor (or "no
tests" mutant) of the last mutmut run whose name contains one of the filters and that closed.toml
and equivalent.toml do not list yet. Prints, per mutant, the first test that kills it, and the
mutants no test kills (each needs a test, or a reason in equivalent.toml); ``--write`` appends
the killed ones to closed.toml and records them in closed.json as verify_closed.py does (the same
evidence: the test passes clean and fails under the mutant).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODULES, MUTANTS, ROOT, load
from verify_closed import CLOSED, OUT, run_node

EQUIVALENT = Path(__file__).resolve().parent / "equivalent.toml"


def candidates(filters: list[str]) -> list[str]:
    """Survivors and "no tests" mutants naming a filter, not yet closed or equivalent."""
    known = set(tomllib.loads(CLOSED.read_text())) | set(tomllib.loads(EQUIVALENT.read_text()))
    out = []
    for module in MODULES:
        for m in load(module):
            live = m.status in ("survived", "no tests") and m.name not in known
            if live and any(f in m.name for f in filters):
                out.append(m.name)
    return out


def node_ids(path: str) -> list[str]:
    """The test node ids of ``path``."""
    env = dict(os.environ, PYTHONPATH=f"{MUTANTS / 'src'}:{MUTANTS}")
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    cmd += ["-o", "addopts=", path]
    proc = subprocess.run(cmd, cwd=MUTANTS, env=env, capture_output=True, text=True, check=True)
    return [ln for ln in proc.stdout.splitlines() if "::" in ln]


def main() -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("tests", help="a test file under tests/")
    ap.add_argument("filters", nargs="+", help="substrings of mutant names")
    ap.add_argument("--write", action="store_true", help="append the matches to closed.toml")
    ap.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only the test nodes whose id contains this (repeatable): new tests, not all",
    )
    args = ap.parse_args()
    shutil.copytree(ROOT / "tests", MUTANTS / "tests", dirs_exist_ok=True)
    left = candidates(args.filters)
    print(f"{len(left)} candidate mutant(s)", flush=True)
    found: dict[str, str] = {}
    codes_of: dict[str, int] = {}
    nodes = node_ids(args.tests)
    if args.only:
        nodes = [n for n in nodes if any(o in n for o in args.only)]
    for node in nodes:
        if not left:
            break
        clean, codes = run_node(node, left)
        if clean != 0:
            print(f"FAILS CLEAN: {node}")
            return 1
        killed = [m for m, c in zip(left, codes, strict=True) if c == 1]
        for m in killed:
            found[m] = node
            codes_of[m] = 1
        left = [m for m in left if m not in found]
        print(f"{node}: kills {len(killed)}", flush=True)
    for m, node in found.items():
        print(f"killed {m} by {node}")
    for m in left:
        print(f"NOT KILLED {m}")
    if args.write and found:
        with CLOSED.open("a") as f:
            for m, node in found.items():
                f.write(f'"{m}" = "{node}"\n')
        results = json.loads(OUT.read_text()) if OUT.exists() else {}
        for m, node in found.items():
            results[m] = {"test": node, "killed": True, "exit": codes_of[m], "clean_exit": 0}
        OUT.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
