"""The broker's consume path in process: CPU per entry, Exclusive against Key_Shared.

Drives the real Subscription, dispatcher and ManagedCursor over an in-memory ledger (the
``Run`` of ``bench_dispatch.py``): every entry is read, routed, sent and acked by id, as the
official client acks one message at a time. Figures are CPU time (``time.process_time``) per
entry, so they hold on a loaded machine better than wall-clock ones; compare the ratios.

    .venv/bin/python bench/bench_consume.py [--entries 30000] [--repeats 3]
    .venv/bin/python bench/bench_consume.py --profile key_shared4   # cProfile, top 25
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_dispatch

from keyshared.broker.consumer import Consumer, SubType

KEYS = 10_000
CASES = {
    "exclusive": (SubType.Exclusive, 1),
    "key_shared1": (SubType.Key_Shared, 1),
    "key_shared4": (SubType.Key_Shared, 4),
}


def _run(sub_type: SubType, consumers: int, entries: int) -> bench_dispatch.Run:
    # bench_dispatch's Run tracks pending acks for every type; Exclusive does not.
    def consumer(**kwargs: object) -> Consumer:
        if sub_type is SubType.Exclusive:
            kwargs["track_pending_acks"] = False
        return Consumer(**kwargs)  # type: ignore[arg-type]

    bench_dispatch.Consumer = consumer  # type: ignore[assignment,misc]
    try:
        return bench_dispatch.Run(sub_type, consumers, KEYS, entries)
    finally:
        bench_dispatch.Consumer = Consumer  # type: ignore[misc]


def cpu_per_entry(case: str, entries: int, profile: cProfile.Profile | None = None) -> float:
    """CPU microseconds per entry to dispatch and ack ``entries`` entries."""
    sub_type, consumers = CASES[case]
    run = _run(sub_type, consumers, entries)
    gc.collect()
    began = time.process_time()
    if profile is not None:
        profile.enable()
    run.run(entries)
    if profile is not None:
        profile.disable()
    spent = time.process_time() - began
    run.close()
    return spent / entries * 1e6


def main() -> int:
    """Print CPU per entry per case (median and min over repeats, cases alternating)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", choices=sorted(CASES), help="cProfile one case instead")
    args = parser.parse_args()
    if args.profile:
        profile = cProfile.Profile()
        cpu_per_entry(args.profile, args.entries, profile)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return 0
    figures: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.repeats):
        for case in CASES:
            figures[case].append(cpu_per_entry(case, args.entries))
    base = statistics.median(figures["exclusive"])
    for case, values in figures.items():
        median = statistics.median(values)
        print(
            f"{case:12s} {median:5.2f} us/entry median, {min(values):5.2f} min, "
            f"{median / base:4.2f}x exclusive"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
