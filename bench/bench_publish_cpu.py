"""Broker CPU per published message (issue 12): unbatched messages and batched entries.

Starts a fresh ``keyshared standalone`` (as ``bench/e2e/brokers.py`` does, default sync
policy: every publish is fdatasync'ed before its receipt), creates ``--producers`` official
clients in spawned processes (``bench/e2e/workers.py``'s produce loop: ``send_async``, 10,000
pending, keyed messages), and once every producer is connected reads the broker's CPU time from
``/proc/<pid>/task/*/stat``, sends, and reads it again after the last receipt. Two phases per
broker, each on its own topic: ``--messages`` unbatched messages, then ``--batched-messages``
with the client's default batching (1000 messages or 5 ms); the number of entries the batched
phase stored comes from the topic's ``internalStats``. Figures: CPU µs per unbatched message,
per batched entry and per batched message, also split by thread (the event loop, the journal
writer, the rest). Runs are repeated ``--runs`` times on fresh brokers; medians are reported.

    .venv/bin/python bench/bench_publish_cpu.py                       # 3 runs, ~1 min
    .venv/bin/python bench/bench_publish_cpu.py --profile bench/results/profiles/x.txt

``--profile PATH`` samples the broker with py-spy (``record --format raw``, non-blocking)
during the unbatched phase of the first run and writes the collapsed stacks to ``PATH``;
``bench/profile_summary.py`` turns them into the tables of ``bench/results/profiles/``.
``--syscalls PATH`` counts the broker's system calls in the unbatched phases (``strace -c``;
it slows the broker down a lot, so only the counts mean something). The
CPU figures of a profiled run include py-spy's sampling overhead on the broker (small, but
use unprofiled runs for the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.e2e import brokers  # noqa: E402
from bench.e2e.pool import WorkerPool  # noqa: E402
from bench.e2e.report import write_result  # noqa: E402
from bench.e2e.workers import ProduceSpec  # noqa: E402

READY_TIMEOUT_S = 30.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread name of process ``pid``, from /proc."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        secs = (int(fields[11]) + int(fields[12])) / CLK_TCK
        # The main thread is named after the console script; name it for what it runs.
        key = "loop" if task.name == str(pid) else name
        out[key] = out.get(key, 0.0) + secs
    return out


def process_cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of the whole process (threads that ended included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def entries_of(broker: brokers.RunningBroker, topic: str) -> int:
    """Entries stored for ``topic`` (its internalStats' numberOfEntries)."""
    path = topic.replace("persistent://", "persistent/")
    url = f"http://{brokers.HOST}:{broker.web_port}/admin/v2/{path}/internalStats"
    with urllib.request.urlopen(url, timeout=30) as resp:
        return int(json.loads(resp.read())["numberOfEntries"])


def phase(
    pool: WorkerPool,
    broker: brokers.RunningBroker,
    *,
    messages: int,
    producers: int,
    size: int,
    batching: bool,
    profile: Path | None,
    syscalls: Path | None = None,
) -> dict[str, Any]:
    """Send ``messages`` through ``producers`` processes; the broker's CPU while they do."""
    topic = f"persistent://public/default/cpu-{uuid.uuid4().hex[:12]}"
    share = messages // producers
    for n in range(producers):
        spec = ProduceSpec(
            url=broker.url,
            topic=topic,
            first_seq=n * share,
            count=share,
            size=size,
            batching=batching,
            key_based=False,
            batch_delay_ms=5,
            max_pending=10_000,
            key_space=10_000,
        )
        pool.send(n, "produce", spec)
    for n in range(producers):
        pool.expect(n, "ready", READY_TIMEOUT_S)
    spy = None
    if profile is not None:
        profile.parent.mkdir(parents=True, exist_ok=True)
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--pid",
                str(broker.process.pid),
                "--format",
                "raw",
                "--nonblocking",
                "--rate",
                "200",
                "--output",
                str(profile),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # py-spy attaches
    if syscalls is not None:
        syscalls.parent.mkdir(parents=True, exist_ok=True)
        spy = subprocess.Popen(
            ["strace", "-c", "-f", "-o", str(syscalls), "-p", str(broker.process.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # strace attaches
    load = [round(x, 2) for x in os.getloadavg()]
    pid = broker.process.pid
    threads_before = thread_cpu(pid)
    user_before, sys_before = process_cpu(pid)
    began = time.perf_counter()
    for n in range(producers):
        pool.send(n, "go")
    results = [pool.expect(n, "result", 600.0) for n in range(producers)]
    elapsed = time.perf_counter() - began
    user_after, sys_after = process_cpu(pid)
    user, system = user_after - user_before, sys_after - sys_before
    cpu = user + system
    threads_after = thread_cpu(pid)
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    acked = sum(r["acked"] for r in results)
    by_thread = {
        name: round(secs - threads_before.get(name, 0.0), 3)
        for name, secs in threads_after.items()
        if secs - threads_before.get(name, 0.0) > 0
    }
    entries = entries_of(broker, topic)
    return {
        "messages": messages,
        "acked": acked,
        "failed": sum(r["failed"] for r in results),
        "entries": entries,
        "elapsed_s": round(elapsed, 3),
        "msg_per_s": round(acked / elapsed),
        "broker_cpu_s": round(cpu, 3),
        "broker_user_s": round(user, 3),
        "broker_sys_s": round(system, 3),
        "cpu_us_per_message": round(cpu / max(acked, 1) * 1e6, 2),
        "cpu_us_per_entry": round(cpu / max(entries, 1) * 1e6, 2),
        "cpu_s_by_thread": by_thread,
        "loadavg": load,
    }


def one_run(args: argparse.Namespace, pool: WorkerPool, profile: Path | None) -> dict[str, Any]:
    """A fresh broker: the unbatched phase, then the batched one."""
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as scratch:
        broker = brokers.start("keyshared", Path(scratch))
        try:
            brokers.wait_ready(broker)
            unbatched = phase(
                pool,
                broker,
                messages=args.messages,
                producers=args.producers,
                size=args.size,
                batching=False,
                profile=profile,
                syscalls=args.syscalls,
            )
            batched = phase(
                pool,
                broker,
                messages=args.batched_messages,
                producers=args.producers,
                size=args.size,
                batching=True,
                profile=None,
            )
        finally:
            brokers.stop(broker)
    return {"unbatched": unbatched, "batched": batched}


def _median(runs: list[dict[str, Any]], kind: str, key: str) -> float:
    return round(statistics.median(r[kind][key] for r in runs), 2)


def main(argv: list[str] | None = None) -> None:
    """Parse options, run, print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000, help="unbatched messages")
    parser.add_argument("--batched-messages", type=int, default=200_000)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", type=Path, default=None, help="py-spy raw output path")
    parser.add_argument(
        "--syscalls", type=Path, default=None, help="strace -c output of the unbatched phase"
    )
    parser.add_argument(
        "--src",
        type=Path,
        default=ROOT / "src",
        help="source tree the broker runs (default: this checkout's src; e.g. main's to compare)",
    )
    parser.add_argument("--label", default="", help="free text stored with the figures")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/publish-cpu.json")
    args = parser.parse_args(argv)
    # The broker starts in its own directory: a relative PYTHONPATH would not reach it, and it
    # would run whatever keyshared the virtualenv has installed instead of this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(args.src.resolve()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    pool = WorkerPool(args.producers)
    runs = []
    try:
        for i in range(args.runs):
            run = one_run(args, pool, args.profile if i == 0 else None)
            u, b = run["unbatched"], run["batched"]
            print(
                f"run {i + 1}: unbatched {u['cpu_us_per_message']} µs/msg "
                f"({u['msg_per_s']} msg/s, load {u['loadavg'][0]}); batched "
                f"{b['cpu_us_per_entry']} µs/entry over {b['entries']} entries, "
                f"{b['cpu_us_per_message']} µs/msg ({b['msg_per_s']} msg/s); "
                f"threads {u['cpu_s_by_thread']}",
                flush=True,
            )
            runs.append(run)
    finally:
        pool.close()
    summary = {
        "unbatched_cpu_us_per_message": _median(runs, "unbatched", "cpu_us_per_message"),
        "batched_cpu_us_per_entry": _median(runs, "batched", "cpu_us_per_entry"),
        "batched_cpu_us_per_message": _median(runs, "batched", "cpu_us_per_message"),
        "unbatched_msg_per_s": _median(runs, "unbatched", "msg_per_s"),
        "batched_msg_per_s": _median(runs, "batched", "msg_per_s"),
        "targets": {"unbatched_us": 12, "batched_entry_us": 20},
    }
    print(json.dumps(summary, indent=2))
    write_result(args, summary, runs)


if __name__ == "__main__":
    main()
