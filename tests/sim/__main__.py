"""Replay, trace and shrink simulation seeds from the command line.

.venv/bin/python -m tests.sim --seed 123 --trace      # one seed, full trace
.venv/bin/python -m tests.sim --seed 123 --shrink     # shortest failing prefix, traced
.venv/bin/python -m tests.sim --seeds 50000           # many seeds, report failures
.venv/bin/python -m tests.sim --seeds 1000 --start 7000
.venv/bin/python -m tests.sim --seeds 60000 --dispatcher classic   # the classic third of them
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.sim.simulator import SimFailure, is_classic, run_seed, shrink


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, help="run this one seed")
    ap.add_argument("--steps", type=int, help="override the seed's number of steps (a prefix)")
    ap.add_argument("--trace", action="store_true", help="print the whole trace")
    ap.add_argument("--shrink", action="store_true", help="find the shortest failing prefix")
    ap.add_argument("--seeds", type=int, default=0, help="run this many seeds")
    ap.add_argument("--start", type=int, default=0, help="first seed of --seeds")
    ap.add_argument(
        "--dispatcher",
        choices=("classic", "pip379"),
        help="of --seeds, only those that draw this dispatcher",
    )
    args = ap.parse_args(argv)

    if args.seed is not None:
        if args.shrink:
            failure = shrink(args.seed)
            if failure is None:
                print(f"seed {args.seed} passes")
                return 0
            print(f"shortest failing prefix: --steps {failure.steps}")
            print(failure.render(trace_lines=10_000 if args.trace else 60))
            return 1
        try:
            sim = run_seed(args.seed, args.steps)
        except SimFailure as failure:
            print(failure.render(trace_lines=10_000 if args.trace else 60))
            return 1
        if args.trace:
            print("\n".join(sim.trace))
        print(
            f"seed {args.seed} passes: {len(sim.order)} entries, {sim.deliveries} deliveries "
            f"({sim.redeliveries} redeliveries)"
        )
        return 0

    failed: list[SimFailure] = []
    t0 = time.perf_counter()
    seeds = [
        s
        for s in range(args.start, args.start + args.seeds)
        if args.dispatcher is None or is_classic(s) == (args.dispatcher == "classic")
    ]
    for seed in seeds:
        try:
            run_seed(seed, args.steps, trace=False)
        except SimFailure:
            try:
                run_seed(seed, args.steps)
            except SimFailure as failure:
                failed.append(failure)
                print(
                    f"FAIL seed {seed}: {failure.message.splitlines()[0]}\n  {failure.replay_command}"
                )
    took = time.perf_counter() - t0
    print(f"{len(seeds) - len(failed)} passed, {len(failed)} failed in {took:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
