"""Render mutmut's results into bench/results/mutation/report.md and summary.json.

    python bench/mutation/report.py

Per module: mutants, killed, survived, equivalent (survivors listed with a reason in
``bench/mutation/equivalent.toml``), timed out, no tests, not run yet. Every survivor that is not
listed as equivalent is printed with its diff; every equivalent with its reason. Seeds to the
first failure (``bench/mutation/seeds_to_kill.py``) are summarised when measured.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tomllib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODULES, MUTANTS, RESULTS, ROOT, Mutant, load, source_path

EQUIVALENT = Path(__file__).resolve().parent / "equivalent.toml"
# Figures of an earlier run, kept for the modules the run in ./mutants has not run (yet): module ->
# {"run": which run, "counts": the table's row, "survived": the survivors' names}.
RECORDED = RESULTS / "recorded.json"


def sim_budget() -> str:
    """The simulator seeds the run in ./mutants gave each mutant (run.py records them)."""
    path = MUTANTS / "keyshared-run.json"
    if not path.exists():
        return "the seeds run.py was given"
    run = json.loads(path.read_text())
    return (
        f"{run['seeds']:,} seeds of the schedules and {run['producer_seeds']:,} of the producer "
        "simulation (`make test` runs 15,000 and 6,000)"
    )


def recorded() -> dict[str, tuple[str, dict[str, int], list[str]]]:
    """The recorded figures of earlier runs: module -> (run, row, survivors); empty if none."""
    if not RECORDED.exists():
        return {}
    data: dict[str, dict[str, Any]] = json.loads(RECORDED.read_text())
    return {
        module: (
            str(rec["run"]),
            {str(k): int(v) for k, v in rec["counts"].items()},
            [str(n) for n in rec["survived"]],
        )
        for module, rec in data.items()
    }


COLUMNS = ("killed", "closed", "survived", "equivalent", "timeout", "no tests", "not run")


def equivalents() -> dict[str, str]:
    """Mutant name -> why it cannot be told apart from the original."""
    if not EQUIVALENT.exists():
        return {}
    return {str(k): str(v) for k, v in tomllib.loads(EQUIVALENT.read_text()).items()}


def diff_of(mutant: Mutant) -> str:
    """The mutant's diff against the original function, as mutmut shows it."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    path = source_path(mutant.module)
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        return get_diff_for_mutant(mutant.name, path=path)
    except FileNotFoundError:
        # A recorded survivor of an earlier run whose function has since moved to another
        # module (broker/dedup.py's decisions went to dedup_state.py): its name is all we have.
        return f"(no diff: {mutant.name} is from an earlier run; its function has moved since)"
    finally:
        os.chdir(cwd)


def closed_by() -> dict[str, str]:
    """Survivors a new test kills (verify_closed.py checked it): mutant name -> test."""
    path = RESULTS / "closed.json"
    if not path.exists():
        return {}
    data: dict[str, dict[str, object]] = json.loads(path.read_text())
    return {k: str(v["test"]) for k, v in data.items() if v.get("killed")}


def column(m: Mutant, equiv: dict[str, str], closed: dict[str, str]) -> str:
    """Which column of the table ``m`` counts in."""
    st = m.status
    if st in ("survived", "no tests") and m.name in closed:
        return "closed"
    if st in ("survived", "no tests", "not run") and m.name in equiv:
        # Equivalent whether or not a selected test calls the function; run.py does not run
        # a mutant already listed (it would survive, at the cost of every test calling it).
        return "equivalent"
    if st in COLUMNS:
        return st
    return "timeout" if st == "suspicious" else st


def seeds_summary() -> dict[str, dict[str, object]] | None:
    """Per module: seeds to the simulator's first failure, where measured (seeds_to_kill.py)."""
    path = RESULTS / "seeds_to_kill.json"
    if not path.exists():
        return None
    data: dict[str, dict[str, object]] = json.loads(path.read_text())["mutants"]
    out: dict[str, dict[str, object]] = {}
    for module in MODULES:
        mine = {k: v for k, v in data.items() if k.startswith(module + ".x")}
        if not mine:
            continue
        firsts = [int(str(v["first"])) for v in mine.values() if v.get("first") is not None]
        budget = min(int(str(v["budget"])) for v in mine.values())
        row: dict[str, object] = {"measured": len(mine), "caught": len(firsts), "budget": budget}
        if firsts:
            row |= {"median": statistics.median(firsts), "worst": max(firsts)}
            row["within_100"] = sum(1 for f in firsts if f <= 100)
        out[module] = row
    return out


def main() -> int:
    """Write the report; returns the exit status."""
    equiv = equivalents()
    closed = closed_by()
    closed_list: list[Mutant] = []
    rows: dict[str, dict[str, int]] = {}
    survivors: list[Mutant] = []
    listed_equiv: list[Mutant] = []
    earlier = recorded()
    from_earlier: dict[str, str] = {}
    for module in MODULES:
        mutants = load(module)
        rec = earlier.get(module)
        ran_here = sum(1 for m in mutants if m.code is not None)
        if rec is not None and ran_here < rec[1]["mutants"] - rec[1]["not run"]:
            # Not run here, or less of it than the earlier run did: that run's figures, its
            # survivors, its closed and equivalents.
            run, row, survived = rec
            rows[module] = row
            from_earlier[module] = run
            for name in survived:
                survivors.append(Mutant(str(name), module, 0, None))
            for name in closed:
                if name.startswith(module + ".x"):
                    closed_list.append(Mutant(name, module, 0, None))
            for name in equiv:
                if name.startswith(module + ".x"):
                    listed_equiv.append(Mutant(name, module, 0, None))
            continue
        counts = dict.fromkeys(("mutants", *COLUMNS), 0)
        counts["mutants"] = len(mutants)
        for m in mutants:
            col = column(m, equiv, closed)
            counts[col] = counts.get(col, 0) + 1
            if col == "survived":
                survivors.append(m)
            elif col == "equivalent":
                listed_equiv.append(m)
            elif col == "closed":
                closed_list.append(m)
        rows[module] = counts

    total = {c: sum(r[c] for r in rows.values()) for c in ("mutants", *COLUMNS)}
    seeds = seeds_summary()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(
        json.dumps({"modules": rows, "total": total, "seeds_to_kill": seeds}, indent=2) + "\n"
    )

    out = ["# Mutation run (mutmut)", ""]
    out.append(
        "Made by `make mutate` (bench/mutation/run.py) and rendered by bench/mutation/report.py. "
        "A mutant is killed when a test of `[tool.mutmut]` in pyproject.toml that calls the "
        "mutated function fails: the unit tests nearest to it, then the simulator on "
        f"{sim_budget()}. *Closed*: survived that run, killed now by a test written for it "
        "(bench/mutation/verify_closed.py re-ran it). *Score* is killed and closed (timeouts included, as mutmut counts them: a "
        "mutant that loops forever is caught) / (mutants run - equivalent); *no tests* (code no "
        "selected test calls) counts against it."
    )
    out.append("")
    head = ["module", "mutants", *COLUMNS, "score"]
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    for module, r in [*rows.items(), ("**total**", total)]:
        # A mutant no selected test calls counts against the score, like a survivor.
        ran = r["mutants"] - r["not run"] - r["equivalent"]
        caught = r["killed"] + r["closed"] + r["timeout"]
        score = f"{100 * caught / ran:.1f} %" if ran > 0 else "-"
        short = module.removeprefix("keyshared.") + (" †" if module in from_earlier else "")
        out.append(
            "| " + " | ".join([short, *(str(r[c]) for c in ("mutants", *COLUMNS)), score]) + " |"
        )
    out.append("")
    for module, run in from_earlier.items():
        out.append(
            f"† {module.removeprefix('keyshared.')}: run less far by this run than by an earlier "
            f"one, or not at all; the figures of {run}."
        )
    if from_earlier:
        out.append("")
    if seeds:
        out.append("## Seeds to the simulator's first failure")
        out.append("")
        out.append(
            "bench/mutation/seeds_to_kill.py: every mutant of a function the simulator calls, "
            "run on seeds 0, 1, 2, ... (make test's order) up to a budget; *caught* is how many "
            "failed within it, the median and worst count the seeds run up to the first failure "
            "of those caught. Mutants the simulator cannot see (stats, names, logs) are in the "
            "*measured* count and never caught: those are the unit tests' to kill."
        )
        out.append("")
        out.append("| module | measured | budget | caught | within 100 | median | worst |")
        out.append("|---|---|---|---|---|---|---|")
        for module, row in seeds.items():
            cells = [str(row.get(c, "-")) for c in ("measured", "budget", "caught")]
            cells += [str(row.get(c, "-")) for c in ("within_100", "median", "worst")]
            out.append(f"| {module.removeprefix('keyshared.')} | " + " | ".join(cells) + " |")
        out.append("")
    out.append(f"## Survivors ({len(survivors)})")
    out.append("")
    for m in survivors:
        out.append(f"### `{m.name}`")
        out.append("")
        out.append("```diff")
        out.append(diff_of(m))
        out.append("```")
        out.append("")
    out.append(f"## Closed: survivors killed by a new test ({len(closed_list)})")
    out.append("")
    for m in closed_list:
        out.append(f"### `{m.name}`")
        out.append("")
        out.append(f"Killed by `{closed[m.name]}`.")
        out.append("")
        out.append("```diff")
        out.append(diff_of(m))
        out.append("```")
        out.append("")
    out.append(f"## Equivalent ({len(listed_equiv)})")
    out.append("")
    for m in listed_equiv:
        out.append(f"- `{m.name}`: {equiv[m.name]}")
    out.append("")
    (RESULTS / "report.md").write_text("\n".join(out))
    print(f"wrote {RESULTS / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
