"""End-to-end benchmark: keyshared and pulsar-lite side by side, with the official client.

Usage::

    .venv/bin/python bench/run_e2e.py [--quick] [--runs N] [--cells PATTERNS] [filters]
                                      [--list] [--out bench/results/e2e.json]

The matrix (``bench/e2e/workloads.py``): 100 B and 1 KB keyed messages; batching off, default
and key-based; 1 and 4 producer processes; produce only, Exclusive (one consumer), Shared and
Key_Shared (1, 4 and 16 consumer processes; Key_Shared, and key-based batching, over 1,000 and
100,000 keys); paced publish latency at 1,000 and 10,000 msg/s and at 1,000 msg/s beside a
10,000 msg/s producer; start-up time. Each cell runs on fresh brokers, interleaved A/B/A/B.
Writes JSON (``--out``) and a Markdown table (same path with ``.md``) and prints the table.
A benchmark, not a test: it reports, it does not assert.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from e2e import brokers, report, runner
from e2e.pool import WorkerPool
from e2e.workloads import (
    FULL_BUDGET,
    QUICK_BUDGET,
    SUBSCRIPTIONS,
    LatencyCell,
    Selection,
    Workload,
    latency_matrix,
    matrix,
    smoke_latency_matrix,
    smoke_matrix,
)

REPO = Path(__file__).resolve().parent.parent
STARTUP_SAMPLES = 3


def _ints(text: str) -> frozenset[int]:
    return frozenset(int(part.replace("_", "")) for part in text.split(",") if part.strip())


def _words(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (a few minutes)")
    parser.add_argument(
        "--runs", type=int, default=None, help="runs per broker (default 3; 1 with --quick)"
    )
    parser.add_argument(
        "--brokers",
        default=",".join(brokers.BROKER_NAMES),
        help="comma-separated brokers, in interleaving order (default: keyshared,pulsar-lite)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON output path")
    parser.add_argument(
        "--cells",
        default="",
        help="comma-separated cell-name patterns (fnmatch globs, or substrings), e.g. "
        "'e2e-key_shared-x4/100B/*,latency/100B/*'; latency cells run only if one matches",
    )
    parser.add_argument("--only", default="", help="(older name) one substring, as --cells")
    parser.add_argument("--sizes", type=_ints, default=None, help="e.g. 100,1024")
    parser.add_argument("--batching", type=_words, default=None, help="any of off,default,keybased")
    parser.add_argument("--producers", type=_ints, default=None, help="e.g. 1,4")
    parser.add_argument(
        "--subs", type=_words, default=None, help="any of none,exclusive,shared,key_shared"
    )
    parser.add_argument(
        "--consumers", type=_ints, default=None, help="consumer processes, e.g. 1,4,16"
    )
    parser.add_argument("--keys", type=_ints, default=None, help="key spaces, e.g. 1000,100000")
    parser.add_argument(
        "--list", action="store_true", help="print the selected cells and an estimate; run nothing"
    )
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="JSON",
        help="recompute the summaries of a written result and rewrite its JSON and Markdown; "
        "run nothing",
    )
    parser.add_argument("--skip-latency", action="store_true", help="skip the latency runs")
    parser.add_argument(
        "--latency-only", action="store_true", help="only the latency runs (no throughput)"
    )
    parser.add_argument("--skip-startup", action="store_true", help="skip start-up timing")
    parser.add_argument(
        "--no-produce-only", action="store_true", help="skip the produce-only cells"
    )
    parser.add_argument(
        "--matrix",
        choices=("full", "smoke"),
        default=None,
        help="the whole matrix, or a six-cell cover (default: smoke with --quick)",
    )
    parser.add_argument(
        "--batch-delay-ms", type=int, default=5, help="batching_max_publish_delay_ms"
    )
    parser.add_argument(
        "--min-rate",
        type=float,
        default=500.0,
        help="a run's time limit is 40 s + its messages at this rate (default 500 msg/s); "
        "a broker still delivering then gets no rate",
    )
    parser.add_argument("--latency-seconds", type=float, default=None, help="paced run length")
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=None,
        help="a run whose consumers get nothing new for this long is stalled "
        "(default 10; 2 with --quick)",
    )
    return parser.parse_args(argv)


def _git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _versions() -> dict[str, str]:
    versions = {}
    for package in ("pulsar-client", "pulsar-lite", "keyshared"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _command_line(argv: list[str]) -> str:
    script = Path(__file__).resolve()
    try:
        shown = str(script.relative_to(REPO))
    except ValueError:
        shown = str(script)
    return shlex.join([".venv/bin/python", shown, *argv])


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _describe(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"ERROR {run['error'].strip().splitlines()[0]}"
    parts = [f"load {run['loadavg_before'][0]:.2f}"]
    if "e2e_msg_s" in run:
        parts.append(f"e2e {run['e2e_msg_s']:,.0f} msg/s")
    if "produce_msg_s" in run:
        parts.append(f"produce {run['produce_msg_s']:,.0f} msg/s")
    if "p99_ms" in run:
        parts.append(f"p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms")
    if run.get("duplicates") or run.get("missing"):
        parts.append(f"dups {run['duplicates']}, missing {run['missing']}")
    if run.get("acked", run.get("messages")) != run.get("messages"):
        parts.append(f"acked {run['acked']} of {run['messages']}")
    return ", ".join(parts)


def _error_record(name: str, error: BaseException) -> dict[str, Any]:
    return {"broker": name, "error": f"{type(error).__name__}: {error}"}


def run_startup(names: list[str], scratch: Path) -> dict[str, list[dict[str, Any]]]:
    """Interleaved start-up samples per broker."""
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    if "keyshared" in names:
        brokers.compile_keyshared()
    for _ in range(STARTUP_SAMPLES):
        for name in names:
            try:
                sample: dict[str, Any] = dict(runner.measure_startup(name, scratch))
            except Exception as error:
                sample = _error_record(name, error)
            samples[name].append(sample)
            if "error" in sample:
                _log(f"startup {name}: {_describe(sample)}")
            else:
                _log(
                    f"startup {name}: listening {sample['listen_s']:.3f} s, "
                    f"producer {sample['producer_s']:.3f} s"
                )
    return samples


def run_throughput(
    pool: WorkerPool,
    names: list[str],
    workloads: list[Workload],
    runs: int,
    settings: runner.Settings,
    scratch: Path,
    results: list[dict[str, Any]],
    after_cell: Callable[[], object],
) -> None:
    """Every cell, ``runs`` rounds, brokers interleaved within each round; each cell's
    summary is appended to ``results``, then ``after_cell`` is called."""
    for number, workload in enumerate(workloads, 1):
        records: list[dict[str, Any]] = []
        for round_index in range(runs):
            for name in names:
                try:
                    record = runner.throughput_run(pool, name, workload, settings, scratch)
                except Exception as error:
                    record = _error_record(name, error)
                record["round"] = round_index
                records.append(record)
                _log(
                    f"[{number}/{len(workloads)}] {workload.name} {name} #{round_index + 1}: "
                    f"{_describe(record)}"
                )
        summary = report.summarize_workload(workload.as_dict(), records)
        summary["runs"] = records
        results.append(summary)
        after_cell()


def run_latency(
    pool: WorkerPool,
    names: list[str],
    cells: list[LatencyCell],
    runs: int,
    settings: runner.Settings,
    scratch: Path,
    results: list[dict[str, Any]],
    after_cell: Callable[[], object],
) -> None:
    """Paced publish latency per cell, brokers interleaved; appended to ``results``."""
    for cell in cells:
        records: list[dict[str, Any]] = []
        for round_index in range(runs):
            for name in names:
                try:
                    record = runner.latency_run(pool, name, cell, settings, scratch)
                except Exception as error:
                    record = _error_record(name, error)
                record["round"] = round_index
                records.append(record)
                _log(f"{cell.name} {name} #{round_index + 1}: {_describe(record)}")
        summary = report.summarize_latency(cell.as_dict(), records)
        summary["runs"] = records
        results.append(summary)
        after_cell()


# Rough wall-clock costs per run, measured on this 2-core machine at load 8-25 from other work
# (2026-11-25), for --list: broker start to ready plus client set-up and stop; the messages at
# the rate keyshared reached (several consumer processes on two cores about halve it); a
# pulsar-lite Key_Shared run with small entries stalls (the idle timeout and a second), and its
# Shared runs with several consumers and small entries crawl at ~500 msg/s into the time limit.
_OVERHEAD_S = {"keyshared": 3.5, "pulsar-lite": 1.0}
_CONSUMER_SETUP_S = 0.3
_TYPICAL_RATE = {"off": 8_000.0, "keybased": 5_000.0, "default": 12_000.0}
_MANY_CONSUMERS_FACTOR = 0.5
_PEER_CRAWL_RATE = 500.0


def _run_estimate_s(name: str, w: Workload, settings: runner.Settings) -> float:
    setup = _OVERHEAD_S.get(name, 2.0) + w.consumers * _CONSUMER_SETUP_S
    small_entries = w.batching != "default"
    if name == "pulsar-lite" and small_entries and w.subscription == "key_shared":
        return setup + settings.idle_timeout_ms / 1000 + 1.0
    if name == "pulsar-lite" and small_entries and w.subscription == "shared" and w.consumers > 1:
        return setup + min(w.messages / _PEER_CRAWL_RATE, runner.run_deadline_s(w, settings))
    rate = _TYPICAL_RATE[w.batching] * (_MANY_CONSUMERS_FACTOR if w.consumers > 1 else 1.0)
    return setup + w.messages / rate


def estimate_seconds(
    names: list[str],
    workloads: list[Workload],
    latency: list[LatencyCell],
    runs: int,
    settings: runner.Settings,
) -> float:
    """A rough wall-clock estimate of an invocation (see the constants above)."""
    total = 0.0
    for name in names:
        overhead = _OVERHEAD_S.get(name, 2.0)
        total += runs * sum(_run_estimate_s(name, w, settings) for w in workloads)
        total += (
            runs
            * len(latency)
            * (overhead + settings.latency_duration_s + settings.latency_warmup_s + 1.0)
        )
        total += STARTUP_SAMPLES * overhead
    return total


def render(path: Path) -> int:
    """Re-summarize the result at ``path`` from its raw runs; rewrite it and its Markdown."""
    result = report.rebuild(json.loads(path.read_text()))
    markdown = report.render_markdown(result)
    path.write_text(json.dumps(report.json_safe(result), indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown)
    print(markdown)
    return 0


def _raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so every finally block stops its broker.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the process exit code."""
    raw_argv = sys.argv[1:] if argv is None else argv
    args = parse_args(raw_argv)
    if args.render is not None:
        return render(args.render)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    out: Path = args.out or REPO / "bench" / "results" / (
        "e2e-quick.json" if args.quick else "e2e.json"
    )
    requested = [name.strip() for name in args.brokers.split(",") if name.strip()]
    notes: list[str] = []
    names = []
    for name in requested:
        reason = brokers.broker_available(name)
        if reason is None:
            names.append(name)
        else:
            notes.append(f"{name} skipped: {reason}")
            _log(f"skipping {name}: {reason}")
    if not names:
        _log("no broker can be started")
        return 2

    budget = QUICK_BUDGET if args.quick else FULL_BUDGET
    full_matrix = args.matrix == "full" or (args.matrix is None and not args.quick)
    patterns = tuple(part.strip() for part in args.cells.split(",") if part.strip())
    if args.only:
        patterns += (args.only,)
    subscriptions = args.subs
    if args.no_produce_only:
        subscriptions = (subscriptions or frozenset(SUBSCRIPTIONS)) - {"none"}
    selection = Selection(
        sizes=args.sizes,
        batchings=args.batching,
        producers=args.producers,
        subscriptions=subscriptions,
        consumers=args.consumers,
        keys=args.keys,
        patterns=patterns,
    )
    workloads = (
        []
        if args.latency_only
        else selection.throughput(matrix(budget) if full_matrix else smoke_matrix(budget))
    )
    latency_cells = (
        []
        if args.skip_latency
        else selection.latency(latency_matrix() if full_matrix else smoke_latency_matrix())
    )
    latency_seconds = args.latency_seconds or (2.0 if args.quick else 5.0)
    settings = runner.Settings(
        batch_delay_ms=args.batch_delay_ms,
        latency_duration_s=latency_seconds,
        latency_warmup_s=0.3 if args.quick else 0.5,
        idle_timeout_ms=int(1000 * (args.idle_timeout_s or (2.0 if args.quick else 10.0))),
        min_rate=args.min_rate,
    )
    estimate = estimate_seconds(names, workloads, latency_cells, runs, settings)
    if args.list:
        for workload in workloads:
            print(f"{workload.name}  ({workload.messages:,} messages)")
        for cell in latency_cells:
            print(cell.name)
        print(
            f"{len(workloads)} throughput cells, {len(latency_cells)} latency cells, "
            f"{runs} run(s) x {len(names)} broker(s): about {estimate / 3600:.1f} h "
            f"({estimate / 60:.0f} min) on this machine under moderate load"
        )
        return 0
    _log(
        f"{len(workloads)} throughput cells, {len(latency_cells)} latency cells, {runs} run(s); "
        f"estimated {estimate / 60:.0f} min"
    )
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    began = time.perf_counter()
    startup: dict[str, list[dict[str, Any]]] = {}
    throughput: list[dict[str, Any]] = []
    latency: list[dict[str, Any]] = []

    def result(partial: bool) -> dict[str, Any]:
        loads = [
            run["loadavg_before"][0]
            for group in (throughput, latency)
            for item in group
            for run in item["runs"]
            if "loadavg_before" in run
        ]
        meta = {
            "command": _command_line(raw_argv),
            "started_at": started_at,
            "elapsed_s": time.perf_counter() - began,
            "partial": partial,
            "git_commit": _git_commit(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(terse=True),
            "python": platform.python_version(),
            "versions": _versions(),
            "brokers": names,
            "runs": runs,
            "quick": args.quick,
            "matrix": "full" if full_matrix else "smoke",
            "estimated_s": estimate,
            "cells": len(workloads),
            "latency_cells": len(latency_cells),
            "settings": {
                "batch_delay_ms": settings.batch_delay_ms,
                "max_pending_messages": settings.max_pending,
                "receiver_queue_size": settings.receiver_queue_size,
                "latency_duration_s": settings.latency_duration_s,
                "latency_warmup_s": settings.latency_warmup_s,
                "consumer_idle_timeout_ms": settings.idle_timeout_ms,
                "min_rate": settings.min_rate,
            },
            "loadavg_min": min(loads, default=float("nan")),
            "loadavg_max": max(loads, default=float("nan")),
            "notes": notes
            + (
                [
                    f"partial: {len(throughput)} of {len(workloads)} throughput cells and "
                    f"{len(latency)} of {len(latency_cells)} latency cells done"
                ]
                if partial
                else []
            ),
        }
        return {
            "meta": meta,
            "startup": report.summarize_startup(startup) if startup else {},
            "throughput": throughput,
            "key_shared_ratios": report.derive_key_shared_ratios(throughput),
            "latency": latency,
        }

    def write(partial: bool) -> str:
        # Rewritten after every cell, so an interrupted long run keeps what it measured.
        done = result(partial)
        markdown = report.render_markdown(done)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report.json_safe(done), indent=2) + "\n")
        out.with_suffix(".md").write_text(markdown)
        return markdown

    scratch = Path(tempfile.mkdtemp(prefix="keyshared-bench-"))
    pool = WorkerPool(runner.pool_size_for(workloads, latency_cells))
    try:
        if not args.skip_startup:
            startup.update(run_startup(names, scratch))
        run_throughput(
            pool, names, workloads, runs, settings, scratch, throughput, lambda: write(True)
        )
        run_latency(
            pool, names, latency_cells, runs, settings, scratch, latency, lambda: write(True)
        )
    finally:
        pool.close()
        for leftover in scratch.iterdir():
            _log(f"warning: leftover {leftover}")
        subprocess.run(["rm", "-rf", str(scratch)], check=False, timeout=60)

    markdown = write(False)
    print(markdown)
    _log(f"wrote {out} and {out.with_suffix('.md')} in {time.perf_counter() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
