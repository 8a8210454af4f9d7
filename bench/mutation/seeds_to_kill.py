"""How many simulator seeds each killed mutant survives: seeds 0, 1, 2, ... as make test runs them.

    python bench/mutation/seeds_to_kill.py [--budget 3000] [--workers 1] [MODULE-SUBSTRING ...]

For every mutant mutmut killed in the chosen modules (default: the dispatch modules the
simulator drives), runs ``tests.sim.simulator.run_seed`` on seeds 0, 1, 2, ... in ./mutants with
``MUTANT_UNDER_TEST`` set, up to ``--budget`` seeds, and records the first failing seed. A mutant
that no seed of the budget catches was killed by a unit test alone. Results (merged with earlier
ones, so it resumes): bench/results/mutation/seeds_to_kill.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODULES, MUTANTS, RESULTS, load

OUT = RESULTS / "seeds_to_kill.json"
SIM_MODULES = (
    "dispatch.draining",
    "dispatch.key_shared",
    "dispatch.shared",
    "dispatch.base",
    "dispatch.pending_acks",
    "dispatch.selectors",
    "storage.range_set",
    "storage.cursor",
)

# Runs inside ./mutants: the first failing seed of range(budget), or -1.
CHILD = """
import sys
from tests.sim.simulator import SimFailure, run_seed
budget = int(sys.argv[1])
for seed in range(budget):
    try:
        run_seed(seed, trace=False)
    except SimFailure:
        print(seed)
        break
else:
    print(-1)
"""


def first_failure(name: str, budget: int, timeout: float) -> int | str | None:
    """The first failing seed of mutant ``name`` (None: none of ``budget``; "timeout")."""
    env = dict(os.environ, MUTANT_UNDER_TEST=name, PYTHONPATH=f"{MUTANTS / 'src'}:{MUTANTS}")
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(budget)],
            cwd=MUTANTS,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return "timeout"
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return "timeout" if out.returncode < 0 else f"error: {out.stderr.strip()[-300:]}"
    seed = int(lines[-1])
    return None if seed < 0 else seed


def simulated_functions() -> set[str]:
    """The functions the simulator calls (mutmut's stats: test -> functions it called)."""
    stats = json.loads((MUTANTS / "mutmut-stats.json").read_text())
    return {
        fn
        for fn, tests in stats["tests_by_mangled_function_name"].items()
        if any(t.startswith("tests/sim/test_sim_schedules.py") for t in tests)
    }


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", help="substrings of module names")
    ap.add_argument("--budget", type=int, default=3000, help="seeds to try per mutant")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per mutant")
    ap.add_argument("--limit", type=int, default=0, help="measure a sample of this many")
    ap.add_argument(
        "--status",
        default="killed",
        help="measure mutants of this mutmut status (killed; 'any' also takes those not run yet)",
    )
    args = ap.parse_args(argv)

    wanted = args.modules or list(SIM_MODULES)
    modules = [m for m in MODULES if any(w in m for w in wanted)]
    done: dict[str, dict[str, object]] = (
        json.loads(OUT.read_text())["mutants"] if OUT.exists() else {}
    )
    sim_calls = simulated_functions()
    todo = [
        m.name
        for module in modules
        for m in load(module)
        if (args.status == "any" or m.status == args.status)
        and m.name.rsplit("__mutmut_", 1)[0] in sim_calls
        and (m.name not in done or done[m.name].get("budget", 0) < args.budget)
    ]
    if args.limit and len(todo) > args.limit:
        # A sample spread over the module, not its first functions.
        todo = todo[:: len(todo) // args.limit][: args.limit]
    print(f"seeds_to_kill: {len(todo)} mutants to measure", flush=True)

    def one(name: str) -> tuple[str, int | str | None]:
        return name, first_failure(name, args.budget, args.timeout)

    RESULTS.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(args.workers) as pool:
        for name, first in pool.map(one, todo):
            if isinstance(first, str):
                done[name] = {"budget": args.budget, "first": None, "note": first}
            else:
                # Seeds run to the first failure: its index plus one.
                done[name] = {"budget": args.budget, "first": None if first is None else first + 1}
            print(f"{name}: {done[name]}", flush=True)
            OUT.write_text(json.dumps({"mutants": done}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
