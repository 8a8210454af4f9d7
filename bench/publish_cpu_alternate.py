"""``bench_publish_cpu.py`` on two source trees in turn, one run each per round, merged.

On a shared machine the load moves between minutes; runs of the two trees taken in turn see
the same load on average, where three runs of one then three of the other do not:

    .venv/bin/python bench/publish_cpu_alternate.py --base /tmp/base/src --rounds 12 \\
        --out bench/results/publish-cpu-alternated.json

Each round runs ``bench_publish_cpu.py --runs 1`` on ``--base`` and then on ``--src`` (this
checkout's by default), keeping every run's JSON in ``--keep`` (a temporary directory if not
given), then writes one record: both trees' runs, each with its round, and per tree the median
and the range of the CPU figures, with the machine's load at each run. ``--collect DIR`` merges
the JSON files a previous invocation kept (``base-N.json``, ``after-N.json``) without running.
Extra options after ``--`` go to ``bench_publish_cpu.py`` (e.g. ``-- --messages 40000``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.e2e.report import write_result  # noqa: E402

SIDES = ("base", "after")
FIGURES = (
    ("unbatched", "cpu_us_per_message"),
    ("batched", "cpu_us_per_entry"),
    ("batched", "cpu_us_per_message"),
)


def run_rounds(args: argparse.Namespace, keep: Path) -> None:
    """Alternate the two trees, ``args.rounds`` times, writing ``keep/SIDE-N.json``."""
    bench = str(ROOT / "bench" / "bench_publish_cpu.py")
    for n in range(1, args.rounds + 1):
        for side, src in zip(SIDES, (args.base, args.src), strict=True):
            out = keep / f"{side}-{n}.json"
            label = f"{args.label} round {n}: {side} ({src})"
            command = [sys.executable, bench, "--runs", "1", "--src", str(src)]
            command += ["--label", label, "--out", str(out), *args.rest]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            unbatched = json.loads(out.read_text())["runs"][0]["unbatched"]
            print(
                f"round {n} {side}: {unbatched['cpu_us_per_message']} µs/msg unbatched "
                f"(load {unbatched['loadavg'][0]})",
                flush=True,
            )


def collect(keep: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The summary and the runs of the per-run files in ``keep``."""
    runs: list[dict[str, Any]] = []
    for side in SIDES:
        for path in keep.glob(f"{side}-*.json"):
            record = json.loads(path.read_text())
            n = int(path.stem.split("-", 1)[1])
            runs.append(
                {
                    "side": side,
                    "round": n,
                    "src": record["settings"]["src"],
                    **record["runs"][0],
                }
            )
    runs.sort(key=lambda r: (r["round"], SIDES.index(r["side"])))
    summary: dict[str, Any] = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        if not mine:
            continue
        figures: dict[str, Any] = {"runs": len(mine), "src": mine[0]["src"]}
        for phase, key in FIGURES:
            values = [float(r[phase][key]) for r in mine]
            figures[f"{phase}_{key}"] = {
                "median": round(statistics.median(values), 2),
                "min": min(values),
                "max": max(values),
            }
        loads = [float(r["unbatched"]["loadavg"][0]) for r in mine]
        figures["loadavg_1min"] = {"min": min(loads), "max": max(loads)}
        summary[side] = figures
    if all(side in summary for side in SIDES):
        key = "unbatched_cpu_us_per_message"
        summary["after_over_base_median"] = round(
            summary["after"][key]["median"] / summary["base"][key]["median"], 3
        )
    return summary, runs


def main(argv: list[str] | None = None) -> None:
    """Parse options, run the rounds (or collect kept ones), write the merged record."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, help="the tree to compare with (e.g. main's src)")
    parser.add_argument("--src", type=Path, default=ROOT / "src", help="the tree measured")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--keep", type=Path, default=None, help="where each run's JSON goes")
    parser.add_argument("--collect", type=Path, default=None, help="merge kept runs only")
    parser.add_argument("--label", default="", help="free text stored with the figures")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench/results/publish-cpu-alternated.json"
    )
    parser.add_argument("rest", nargs="*", help="options for bench_publish_cpu.py, after --")
    args = parser.parse_args(argv)
    if args.collect is not None:
        keep = args.collect
    else:
        if args.base is None:
            parser.error("--base is required unless --collect is given")
        keep = args.keep or Path(tempfile.mkdtemp(prefix="publish-cpu-alternate-"))
        keep.mkdir(parents=True, exist_ok=True)
        run_rounds(args, keep)
    summary, runs = collect(keep)
    print(json.dumps(summary, indent=2))
    write_result(args, summary, runs)


if __name__ == "__main__":
    main()
