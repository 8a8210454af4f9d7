"""Micro-benchmark of the Key_Shared decision structures: selectors, pending acks, draining.

Usage::

    .venv/bin/python bench/bench_selectors.py [--quick] [--out bench/results/selectors.json]

For each selector (consistent hashing with 100 points, auto-split, sticky exclusive ranges) and
1, 10, 100 and 1000 consumers: the cost of ``select(hash)`` per call, of ``select_key(key)`` (hash
plus select) per call, and of adding one more consumer and removing it again (including the
``ImpactedRanges`` each returns). Also the per-entry cost and memory of ``PendingAcksMap`` and the
cost of ``DrainingHashesTracker.should_block_sticky_key_hash``. Prints a table and writes JSON.
A benchmark, not a test: it reports, it does not assert. Timings are best of several rounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyshared.broker.dispatch.draining import DrainingHashesTracker
from keyshared.broker.dispatch.pending_acks import PendingAcksMap
from keyshared.broker.dispatch.selectors import (
    ConsistentHashingStickyKeyConsumerSelector,
    HashRangeAutoSplitStickyKeyConsumerSelector,
    HashRangeExclusiveStickyKeyConsumerSelector,
    StickyKeyConsumerSelector,
)
from keyshared.storage.position import Position

REPO = Path(__file__).resolve().parent.parent
CONSUMER_COUNTS = (1, 10, 100, 1000)


@dataclass(eq=False)
class BenchConsumer:
    """Stand-in consumer: a name and identity, as the selectors require."""

    consumer_name: str


Selector = StickyKeyConsumerSelector[BenchConsumer]


def best_ns_per_op(fn: Callable[[], int], rounds: int) -> float:
    """Run ``fn`` (which returns how many operations it did) ``rounds`` times; best ns/op."""
    best = float("inf")
    for _ in range(rounds):
        gc.collect()
        start = time.perf_counter_ns()
        ops = fn()
        elapsed = time.perf_counter_ns() - start
        best = min(best, elapsed / ops)
    return best


def sticky_ranges(n: int, i: int) -> list[tuple[int, int]]:
    """The i-th of n equal slices of [0, 65535]."""
    width = 65536 // n
    start = i * width
    end = 65535 if i == n - 1 else start + width - 1
    return [(start, end)]


def build(kind: str, n: int) -> tuple[Selector, list[BenchConsumer]]:
    """A selector of ``kind`` holding ``n`` consumers."""
    selector: Selector
    if kind == "consistent-100":
        selector = ConsistentHashingStickyKeyConsumerSelector[BenchConsumer](100)
    elif kind == "auto-split":
        selector = HashRangeAutoSplitStickyKeyConsumerSelector[BenchConsumer]()
    else:
        selector = HashRangeExclusiveStickyKeyConsumerSelector[BenchConsumer]()
    consumers = [BenchConsumer(f"consumer-{i}") for i in range(n)]
    for i, consumer in enumerate(consumers):
        ranges = sticky_ranges(n + 1, i) if kind == "sticky" else None
        selector.add_consumer(consumer, ranges)
    return selector, consumers


def bench_selector(kind: str, n: int, quick: bool) -> dict[str, Any]:
    """select / select_key / add+remove costs for one selector size."""
    rounds = 3 if quick else 5
    selector, _ = build(kind, n)
    hashes = [(i * 2654435761) % 65535 + 1 for i in range(20_000 if quick else 100_000)]
    keys = [f"key-{i}".encode() for i in range(len(hashes))]
    select = selector.select
    select_key = selector.select_key

    def run_select() -> int:
        for h in hashes:
            select(h)
        return len(hashes)

    def run_select_key() -> int:
        for k in keys:
            select_key(k)
        return len(keys)

    def run_loop() -> int:
        for _h in hashes:
            pass
        return len(hashes)

    loop_ns = best_ns_per_op(run_loop, rounds)
    select_ns = best_ns_per_op(run_select, rounds)
    select_key_ns = best_ns_per_op(run_select_key, rounds)

    cycles = 5 if n >= 1000 else 20 if n >= 100 else 200
    if quick:
        cycles = max(2, cycles // 4)
    add_samples: list[int] = []
    remove_samples: list[int] = []
    moved_hashes: list[int] = []
    for round_no in range(rounds):
        for i in range(cycles):
            newcomer = BenchConsumer(f"newcomer-{round_no}-{i}")
            ranges = sticky_ranges(n + 1, n) if kind == "sticky" else None
            start = time.perf_counter_ns()
            impacted = selector.add_consumer(newcomer, ranges)
            mid = time.perf_counter_ns()
            selector.remove_consumer(newcomer)
            end = time.perf_counter_ns()
            add_samples.append(mid - start)
            remove_samples.append(end - mid)
            moved_hashes.append(impacted.hash_count())
    add_samples.sort()
    remove_samples.sort()
    return {
        "selector": kind,
        "consumers": n,
        "select_ns": round(select_ns, 1),
        "select_ns_minus_loop": round(select_ns - loop_ns, 1),
        "select_key_ns": round(select_key_ns, 1),
        "add_us_median": round(add_samples[len(add_samples) // 2] / 1000, 1),
        "remove_us_median": round(remove_samples[len(remove_samples) // 2] / 1000, 1),
        "add_moved_hashes_median": sorted(moved_hashes)[len(moved_hashes) // 2],
        "add_remove_cycles": len(add_samples),
    }


def bench_pending_acks(quick: bool) -> dict[str, Any]:
    """PendingAcksMap add+remove cost per entry and bytes per pending entry."""
    n = 50_000 if quick else 200_000
    rounds = 3 if quick else 5
    positions = [Position(3, i) for i in range(n)]
    hashes = [(i * 2654435761) % 65535 + 1 for i in range(n)]
    consumer = BenchConsumer("c")
    tracker = DrainingHashesTracker[BenchConsumer]()

    def run_add() -> int:
        pending = PendingAcksMap[BenchConsumer, Position](consumer, remove_handler=tracker)
        add = pending.add_pending_ack_if_allowed
        for pos, h in zip(positions, hashes, strict=True):
            add(pos, 1, h)
        return n

    def run_add_remove() -> int:
        pending = PendingAcksMap[BenchConsumer, Position](consumer, remove_handler=tracker)
        add = pending.add_pending_ack_if_allowed
        remove = pending.remove
        for pos, h in zip(positions, hashes, strict=True):
            add(pos, 1, h)
        for pos in positions:
            remove(pos)
        return n

    add_ns = best_ns_per_op(run_add, rounds)
    add_remove_ns = best_ns_per_op(run_add_remove, rounds)

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    pending = PendingAcksMap[BenchConsumer, Position](consumer)
    for pos, h in zip(positions, hashes, strict=True):
        pending.add_pending_ack_if_allowed(pos, 1, h)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()

    def run_query() -> int:
        # Worst case: a hash no entry carries, so the whole map is scanned.
        pending.positions_for_sticky_hash(0)
        return 1

    query_us = best_ns_per_op(run_query, rounds) / 1000
    return {
        "entries": n,
        "add_ns": round(add_ns, 1),
        "remove_ns": round(add_remove_ns - add_ns, 1),
        "bytes_per_entry": round((after - before) / n, 1),
        "bytes_note": "map only; Position objects already exist (storage made them)",
        "positions_for_hash_full_scan_us": round(query_us, 1),
    }


def bench_draining(quick: bool) -> dict[str, Any]:
    """should_block_sticky_key_hash cost: hash not draining, and draining for another consumer."""
    rounds = 3 if quick else 5
    hashes = [(i * 2654435761) % 65535 + 1 for i in range(20_000 if quick else 100_000)]
    c1, c2 = BenchConsumer("c1"), BenchConsumer("c2")
    tracker = DrainingHashesTracker[BenchConsumer]()
    should_block = tracker.should_block_sticky_key_hash

    def run() -> int:
        for h in hashes:
            should_block(c2, h)
        return len(hashes)

    idle_ns = best_ns_per_op(run, rounds)
    for h in set(hashes[:1000]):
        tracker.add_entry(c1, h)
    draining = hashes[:1000] * (len(hashes) // 1000)

    def run_blocked() -> int:
        for h in draining:
            should_block(c2, h)
        return len(draining)

    blocked_ns = best_ns_per_op(run_blocked, rounds)
    return {
        "should_block_idle_ns": round(idle_ns, 1),
        "should_block_blocked_ns": round(blocked_ns, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run everything, print a table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and smaller inputs")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "selectors.json")
    args = parser.parse_args(argv)
    # Other work on the machine skews micro-timings; the JSON records how busy it was.
    load_before = round(os.getloadavg()[0], 2)

    rows = [
        bench_selector(kind, n, args.quick)
        for kind in ("consistent-100", "auto-split", "sticky")
        for n in CONSUMER_COUNTS
    ]
    print(
        f"{'selector':<15} {'consumers':>9} {'select ns':>10} {'select_key ns':>14} "
        f"{'add us':>9} {'remove us':>10} {'moved on add':>13}"
    )
    for r in rows:
        print(
            f"{r['selector']:<15} {r['consumers']:>9} {r['select_ns']:>10} "
            f"{r['select_key_ns']:>14} {r['add_us_median']:>9} {r['remove_us_median']:>10} "
            f"{r['add_moved_hashes_median']:>13}"
        )
    pending = bench_pending_acks(args.quick)
    draining = bench_draining(args.quick)
    print(
        f"\nPendingAcksMap: add {pending['add_ns']} ns, remove {pending['remove_ns']} ns, "
        f"{pending['bytes_per_entry']} B/entry ({pending['entries']} entries), "
        f"full positions_for_sticky_hash scan {pending['positions_for_hash_full_scan_us']} us"
    )
    print(
        f"DrainingHashesTracker.should_block: {draining['should_block_idle_ns']} ns (not "
        f"draining), {draining['should_block_blocked_ns']} ns (draining elsewhere)"
    )
    result = {
        "benchmark": "selectors",
        "quick": args.quick,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_1m_before": load_before,
        "cpu_count": os.cpu_count(),
        "selectors": rows,
        "pending_acks": pending,
        "draining": draining,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
