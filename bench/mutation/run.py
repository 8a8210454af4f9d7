"""Run mutmut over the ordering and durability code, module by module, resumably (`make mutate`).

    python bench/mutation/run.py                      # every module, what has not run yet
    python bench/mutation/run.py --workers 1 range_set dedup
    python bench/mutation/run.py --rerun survived key_shared   # again, after adding tests
    python bench/mutation/run.py --seeds 15000 --rerun survived   # make test's full budget

Each mutant is killed by the tests of ``[tool.mutmut]`` in pyproject.toml that call the mutated
function, fastest first: the unit tests nearest to it, then the simulator. The simulator runs
``--seeds`` seeds of ``tests/sim/test_sim_schedules.py`` (default 3,000: a fifth of what
``make test`` runs, so a survivor costs ~30 s, not ~2.5 min) and a fifth of the producer
simulation's 6,000; a survivor can be re-run at the full budget with ``--seeds 15000 --rerun
survived``. The seeds come in chunks of 10, 40, then 50 (``SIM_CHUNKS=growing``), so a mutant the
first seeds catch is killed in a second.

Resumable: mutmut records each result as it comes (``mutants/**/*.meta``); this script passes
mutmut only the mutants that have none yet (or those of the ``--rerun`` status), in chunks, so
an interrupted run loses at most the mutants in flight. Run it under ``nice``: it is a
background job. Results: ``python bench/mutation/report.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODULES, MUTANTS, ROOT, load

EQUIVALENT = Path(__file__).resolve().parent / "equivalent.toml"

FULL_SIM_SEEDS = 15_000
FULL_PRODUCER_SEEDS = 6_000


def chosen_modules(filters: list[str]) -> list[str]:
    """The modules ``filters`` name, in the order given (all of them, in MODULES' order, without).

    A filter that ends a module's dotted name names that module alone (``shared`` is
    ``dispatch.shared``, not ``key_shared``; ``cursor`` is not ``cursor_codec``), and a package
    with its modules (``selectors``: the package and ``selectors.consistent``, ...); any other
    picks every module whose name contains it (``cursor_``).
    """
    if not filters:
        return list(MODULES)
    picked: list[str] = []
    for f in filters:
        exact = [m for m in MODULES if m == f or m.endswith("." + f) or f".{f}." in f".{m}"]
        for m in exact or [m for m in MODULES if f in m]:
            if m not in picked:
                picked.append(m)
    if not picked:
        raise SystemExit(f"no module matches {filters}; modules: {', '.join(MODULES)}")
    return picked


def pending(module: str, rerun: str | None) -> list[str] | None:
    """Mutant names of ``module`` to run; None when mutmut has not generated them yet.

    Mutants listed in equivalent.toml are left out: they survive every test, so running one
    costs every test that calls its function (the simulator's seeds too) and tells nothing.
    """
    mutants = load(module)
    if not mutants:
        return None
    want = {"not run"} if rerun is None else {rerun}
    equivalent = set(tomllib.loads(EQUIVALENT.read_text()))
    return [m.name for m in mutants if m.status in want and m.name not in equivalent]


def mutmut(names: list[str], workers: int, env: dict[str, str]) -> int:
    """One ``mutmut run`` over ``names`` (names or globs)."""
    mutmut_bin = Path(sys.executable).with_name("mutmut")
    cmd = [str(mutmut_bin), "run", "--max-children", str(workers), *names]
    print(f"mutate: mutmut run on {len(names)} name(s), e.g. {names[0]}", flush=True)
    return subprocess.call(cmd, cwd=ROOT, env=env)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("modules", nargs="*", help="substrings of module names (default: all)")
    ap.add_argument("--workers", type=int, default=2, help="mutmut's --max-children")
    ap.add_argument("--seeds", type=int, default=3000, help="simulator seeds per mutant")
    ap.add_argument("--chunk", type=int, default=1000, help="mutants per mutmut invocation")
    ap.add_argument("--rerun", help="run again the mutants with this status (e.g. survived)")
    ap.add_argument(
        "--together",
        action="store_true",
        help="one mutmut run over the chosen modules' mutants (its clean run once, not per module)",
    )
    args = ap.parse_args(argv)

    producer_seeds = max(1, args.seeds * FULL_PRODUCER_SEEDS // FULL_SIM_SEEDS)
    env = dict(os.environ, SIM_SEEDS=str(args.seeds), SIM_PRODUCER_SEEDS=str(producer_seeds))
    # mutmut runs a mutant's tests fastest first and stops at the first failure: seeds in chunks
    # that grow from 10 put the first seeds, which catch most mutants, before the slow tests.
    env["SIM_CHUNKS"] = "growing"
    # A mutant is killed at a property's first failure: no minutes spent shrinking it.
    env["KEYSHARED_HYPOTHESIS_PROFILE"] = "mutate"
    # mutmut puts mutants/src first on sys.path; a PYTHONPATH naming src/ must not shadow it.
    env.pop("PYTHONPATH", None)
    # What report.py says the simulator ran (the last run's budget).
    MUTANTS.mkdir(exist_ok=True)
    (MUTANTS / "keyshared-run.json").write_text(
        json.dumps({"seeds": args.seeds, "producer_seeds": producer_seeds}) + "\n"
    )
    modules = chosen_modules(args.modules)
    if args.together and all(pending(m, args.rerun) is not None for m in modules):
        # Each mutmut run starts with the selected tests run clean: minutes on a loaded
        # machine, paid once here rather than once per module (mutmut runs the fastest first).
        together = [n for m in modules for n in pending(m, args.rerun) or []]
        print(f"mutate: {len(modules)} modules, {len(together)} to run", flush=True)
        for i in range(0, len(together), args.chunk):
            if mutmut(together[i : i + args.chunk], args.workers, env) != 0:
                return 1
        return 0
    for module in modules:
        names = pending(module, args.rerun)
        if names is None:
            # First run: mutmut generates every module's mutants; this one's are all pending.
            if mutmut([f"{module}.*"], args.workers, env) != 0:
                return 1
            continue
        print(f"mutate: {module}: {len(names)} to run", flush=True)
        for i in range(0, len(names), args.chunk):
            if mutmut(names[i : i + args.chunk], args.workers, env) != 0:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
