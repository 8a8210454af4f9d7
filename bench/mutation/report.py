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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MODULES, RESULTS, ROOT, Mutant, load

EQUIVALENT = Path(__file__).resolve().parent / "equivalent.toml"
COLUMNS = ("killed", "survived", "equivalent", "timeout", "no tests", "not run")


def equivalents() -> dict[str, str]:
    """Mutant name -> why it cannot be told apart from the original."""
    if not EQUIVALENT.exists():
        return {}
    return {str(k): str(v) for k, v in tomllib.loads(EQUIVALENT.read_text()).items()}


def diff_of(mutant: Mutant) -> str:
    """The mutant's diff against the original function, as mutmut shows it."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    path = Path("src") / (mutant.module.replace(".", "/") + ".py")
    cwd = Path.cwd()
    os.chdir(ROOT)
    try:
        return get_diff_for_mutant(mutant.name, path=path)
    finally:
        os.chdir(cwd)


def column(m: Mutant, equiv: dict[str, str]) -> str:
    """Which column of the table ``m`` counts in."""
    st = m.status
    if st == "survived" and m.name in equiv:
        return "equivalent"
    if st in COLUMNS:
        return st
    return "timeout" if st == "suspicious" else st


def seeds_summary() -> dict[str, object] | None:
    """Seeds to the first failure of the simulator-killed mutants, if measured."""
    path = RESULTS / "seeds_to_kill.json"
    if not path.exists():
        return None
    data: dict[str, dict[str, object]] = json.loads(path.read_text())["mutants"]
    firsts = [int(str(v["first"])) for v in data.values() if v.get("first") is not None]
    missed = [k for k, v in data.items() if v.get("first") is None]
    out: dict[str, object] = {"measured": len(data), "caught": len(firsts), "missed": missed}
    if firsts:
        out |= {"median": statistics.median(firsts), "worst": max(firsts)}
    return out


def main() -> int:
    """Write the report; returns the exit status."""
    equiv = equivalents()
    rows: dict[str, dict[str, int]] = {}
    survivors: list[Mutant] = []
    listed_equiv: list[Mutant] = []
    for module in MODULES:
        mutants = load(module)
        counts = dict.fromkeys(("mutants", *COLUMNS), 0)
        counts["mutants"] = len(mutants)
        for m in mutants:
            col = column(m, equiv)
            counts[col] = counts.get(col, 0) + 1
            if col == "survived":
                survivors.append(m)
            elif col == "equivalent":
                listed_equiv.append(m)
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
        "mutated function fails: the unit tests nearest to it, then the simulator on a fifth of "
        "`make test`'s seeds. *Score* is killed (timeouts included, as mutmut counts them: a "
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
        caught = r["killed"] + r["timeout"]
        score = f"{100 * caught / ran:.1f} %" if ran > 0 else "-"
        short = module.removeprefix("keyshared.")
        out.append(
            "| " + " | ".join([short, *(str(r[c]) for c in ("mutants", *COLUMNS)), score]) + " |"
        )
    out.append("")
    if seeds is not None:
        out.append("## Seeds to the first failure")
        out.append("")
        out.append(
            f"Of {seeds['measured']} simulator-killed mutants measured "
            "(bench/mutation/seeds_to_kill.py, seeds 0, 1, 2, ... of test_sim_schedules): "
            f"{seeds['caught']} fail within make test's 15,000 seeds; median "
            f"{seeds.get('median', '-')} seeds, worst {seeds.get('worst', '-')}."
        )
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
    out.append(f"## Equivalent ({len(listed_equiv)})")
    out.append("")
    for m in listed_equiv:
        out.append(f"- `{m.name}`: {equiv[m.name]}")
    out.append("")
    (RESULTS / "report.md").write_text("\n".join(out))
    print("\n".join(out[:40]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
