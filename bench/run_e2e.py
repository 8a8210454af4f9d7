"""End-to-end benchmark: keyshared and pulsar-lite side by side, with the official client.

Usage::

    .venv/bin/python bench/run_e2e.py [--quick] [--runs N] [--brokers keyshared,pulsar-lite]
                                      [--out bench/results/e2e.json]

Measures, per broker and interleaved A/B/A/B per configuration: end-to-end produce+consume
throughput and produce-only throughput (100 B and 1 KB keyed messages, batching on and off,
1 and 4 producer processes, Exclusive and Key_Shared consumers), paced publish latency at
1,000 msg/s, and start-up time. Writes JSON (``--out``) and a Markdown table (same path with
``.md``) and prints the table. A benchmark, not a test: it reports, it does not assert.
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
from pathlib import Path
from types import FrameType
from typing import Any

from e2e import brokers, report, runner
from e2e.pool import WorkerPool
from e2e.workloads import FULL_BUDGET, QUICK_BUDGET, SIZES, Workload, matrix, smoke_matrix

REPO = Path(__file__).resolve().parent.parent
STARTUP_SAMPLES = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run (< 60 s)")
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
        "--only",
        default="",
        help="run only workloads whose name contains this substring (several: comma-separated)",
    )
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="rounds outermost: each round runs every selected workload once",
    )
    parser.add_argument("--skip-latency", action="store_true", help="skip the latency runs")
    parser.add_argument(
        "--latency-only", action="store_true", help="only the latency runs (no throughput)"
    )
    parser.add_argument("--skip-startup", action="store_true", help="skip start-up timing")
    parser.add_argument(
        "--no-produce-only", action="store_true", help="skip the produce-only workloads"
    )
    parser.add_argument(
        "--matrix",
        choices=("full", "smoke"),
        default=None,
        help="all 24 configurations, or a 6-configuration cover (default: smoke with --quick)",
    )
    parser.add_argument(
        "--key-shared-batching",
        choices=("keybased", "default"),
        default="keybased",
        help="batching type of batched Key_Shared runs (default keybased)",
    )
    parser.add_argument(
        "--exclusive-batching",
        choices=("keybased", "default"),
        default="default",
        help="batching type of batched Exclusive runs (default default; keybased compares "
        "both subscriptions on the same producer workload)",
    )
    parser.add_argument(
        "--consumers",
        default="1",
        help="comma-separated consumer counts of the Key_Shared runs, e.g. 1,4 (Exclusive "
        "admits one consumer and always runs with one)",
    )
    parser.add_argument(
        "--batch-delay-ms", type=int, default=5, help="batching_max_publish_delay_ms"
    )
    parser.add_argument("--latency-seconds", type=float, default=None, help="paced run length")
    parser.add_argument(
        "--idle-timeout-s",
        type=float,
        default=None,
        help="consumer gives up after this long without a message (default 10; 2 with --quick)",
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
    *,
    alternate: bool = False,
) -> list[dict[str, Any]]:
    """Every workload, ``runs`` rounds, brokers interleaved within each round.

    With ``alternate`` each round runs every workload once (rounds outermost), so workloads
    compared with each other (Exclusive against Key_Shared) see the same stretch of load.
    """
    records: dict[str, list[dict[str, Any]]] = {w.name: [] for w in workloads}
    if alternate:
        order = [(r, w) for r in range(runs) for w in workloads]
    else:
        order = [(r, w) for w in workloads for r in range(runs)]
    for round_index, workload in order:
        for name in names:
            try:
                record = runner.throughput_run(pool, name, workload, settings, scratch)
            except Exception as error:
                record = _error_record(name, error)
            record["round"] = round_index
            records[workload.name].append(record)
            _log(f"{workload.name} {name} #{round_index + 1}: {_describe(record)}")
    results = []
    for workload in workloads:
        summary = report.summarize_workload(workload.as_dict(), records[workload.name])
        summary["runs"] = records[workload.name]
        results.append(summary)
    return results


def run_latency(
    pool: WorkerPool,
    names: list[str],
    sizes: tuple[int, ...],
    runs: int,
    settings: runner.Settings,
    scratch: Path,
) -> list[dict[str, Any]]:
    """Paced publish latency per payload size, brokers interleaved."""
    results = []
    for size in sizes:
        records: list[dict[str, Any]] = []
        for round_index in range(runs):
            for name in names:
                try:
                    record = runner.latency_run(pool, name, size, settings, scratch)
                except Exception as error:
                    record = _error_record(name, error)
                record["round"] = round_index
                records.append(record)
                _log(f"latency {size} B {name} #{round_index + 1}: {_describe(record)}")
        summary = report.summarize_latency(size, records)
        summary["runs"] = records
        results.append(summary)
    return results


def _raise_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    # Turn SIGTERM into an exception so every finally block stops its broker.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return the process exit code."""
    raw_argv = sys.argv[1:] if argv is None else argv
    args = parse_args(raw_argv)
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
    key_based = args.key_shared_batching == "keybased"
    full_matrix = args.matrix == "full" or (args.matrix is None and not args.quick)
    consumer_counts = tuple(int(n) for n in args.consumers.split(",") if n.strip())
    candidates = (
        matrix(
            budget,
            not args.no_produce_only,
            key_based,
            exclusive_key_based=args.exclusive_batching == "keybased",
            key_shared_consumers=consumer_counts,
        )
        if full_matrix
        else smoke_matrix(budget, key_based)
    )
    workloads = [
        w
        for w in candidates
        if any(part in w.name for part in args.only.split(","))
        and not (args.no_produce_only and w.subscription == "none")
        and not args.latency_only
    ]
    latency_seconds = args.latency_seconds or (2.0 if args.quick else 5.0)
    settings = runner.Settings(
        batch_delay_ms=args.batch_delay_ms,
        latency_duration_s=latency_seconds,
        latency_warmup_s=0.3 if args.quick else 0.5,
        idle_timeout_ms=int(1000 * (args.idle_timeout_s or (2.0 if args.quick else 10.0))),
    )
    latency_sizes = SIZES[:1] if args.quick else SIZES
    started_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    loads: list[float] = []
    began = time.perf_counter()

    scratch = Path(tempfile.mkdtemp(prefix="keyshared-bench-"))
    pool = WorkerPool(
        max((w.consumers for w in workloads), default=1)
        + max((w.producers for w in workloads), default=1)
    )
    try:
        startup = {} if args.skip_startup else run_startup(names, scratch)
        throughput = run_throughput(
            pool, names, workloads, runs, settings, scratch, alternate=args.alternate
        )
        latency = (
            []
            if args.skip_latency or (args.only and not args.latency_only)
            else run_latency(pool, names, latency_sizes, runs, settings, scratch)
        )
    finally:
        pool.close()
        for leftover in scratch.iterdir():
            _log(f"warning: leftover {leftover}")
        subprocess.run(["rm", "-rf", str(scratch)], check=False, timeout=60)

    for group in (throughput, latency):
        for item in group:
            loads += [run["loadavg_before"][0] for run in item["runs"] if "loadavg_before" in run]
    meta = {
        "command": _command_line(raw_argv),
        "started_at": started_at,
        "elapsed_s": time.perf_counter() - began,
        "git_commit": _git_commit(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": _versions(),
        "brokers": names,
        "runs": runs,
        "quick": args.quick,
        "matrix": "full" if full_matrix else "smoke",
        "settings": {
            "batch_delay_ms": settings.batch_delay_ms,
            "key_shared_batching": args.key_shared_batching,
            "exclusive_batching": args.exclusive_batching,
            "key_shared_consumers": list(consumer_counts),
            "max_pending_messages": settings.max_pending,
            "receiver_queue_size": settings.receiver_queue_size,
            "latency_rate": settings.latency_rate,
            "latency_duration_s": settings.latency_duration_s,
            "latency_warmup_s": settings.latency_warmup_s,
            "consumer_idle_timeout_ms": settings.idle_timeout_ms,
        },
        "loadavg_min": min(loads, default=float("nan")),
        "loadavg_max": max(loads, default=float("nan")),
        "notes": notes,
    }
    result = {
        "meta": meta,
        "startup": report.summarize_startup(startup) if startup else {},
        "throughput": throughput,
        "latency": latency,
    }
    markdown = report.render_markdown(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.json_safe(result), indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown)
    print(markdown)
    _log(f"wrote {out} and {out.with_suffix('.md')} in {meta['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
