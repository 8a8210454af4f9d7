"""Broker start-up (issue 12): seconds from ``Popen`` to listening and to ready, over N runs.

Starts ``keyshared standalone`` ``--runs`` times, each in a fresh data directory (as
``bench/e2e/brokers.py`` does for the end-to-end matrix), and records per run the seconds from
``Popen`` to the first successful TCP connect on the binary port ("listening", the issue's
target: < 0.5 s) and to the broker's ``standalone ready in`` line (web port and admin up too).
``--src`` picks the source tree the broker runs (default: this checkout's), so two trees compare
with one script. The tree is byte-compiled first (``compileall``), as ``pip install`` does for
an installed broker: an editable checkout under ``PYTHONDONTWRITEBYTECODE=1`` (this machine's
environment) would otherwise compile every module from source at every start, which doubles
the start-up's CPU; ``--from-source`` measures that case instead (the ``__pycache__``
directories of ``--src`` are removed first). ``--importtime PATH`` also writes ``python -X importtime``'s report of one
start (the broker's stderr) for reading where import time goes.

    PYTHONPATH=src .venv/bin/python bench/bench_startup.py --runs 10
    PYTHONPATH=src .venv/bin/python bench/bench_startup.py --src /work/main/src --out /tmp/m.json

Writes ``bench/results/startup.json`` (or ``--out``) with every run, the medians, the min and
max, and the load average before and after.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.e2e import brokers  # noqa: E402
from bench.e2e.report import write_result  # noqa: E402

TARGET_LISTEN_S = 0.5
CLK_TCK = os.sysconf("SC_CLK_TCK")


def one_start(scratch: Path, importtime: Path | None) -> dict[str, float]:
    """One cold start in a fresh directory: seconds to listening and to ready."""
    if importtime is not None:
        os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
    try:
        broker = brokers.start("keyshared", scratch)
    finally:
        os.environ.pop("PYTHONPROFILEIMPORTTIME", None)
    try:
        # CPU the broker spent until it listened (read right after the first connect, so it
        # overshoots by the moment this takes): steadier than wall time on a loaded machine.
        fields = Path(f"/proc/{broker.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        listen_cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK
        ready_s = brokers.wait_ready(broker)
        if importtime is not None:
            importtime.parent.mkdir(parents=True, exist_ok=True)
            lines = broker.log_path.read_text(errors="replace").splitlines()
            importtime.write_text("\n".join(x for x in lines if x.startswith("import time:")))
        return {
            "listen_s": round(broker.listen_s, 4),
            "listen_cpu_s": round(listen_cpu_s, 3),
            "ready_s": round(ready_s, 4),
        }
    finally:
        brokers.stop(broker)


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse options, start the broker N times, print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--src", type=Path, default=ROOT / "src", help="source tree the broker runs"
    )
    parser.add_argument(
        "--from-source", action="store_true", help="no bytecode: every start compiles"
    )
    parser.add_argument("--importtime", type=Path, default=None, help="-X importtime report")
    parser.add_argument("--label", default="", help="free text stored with the figures")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/startup.json")
    args = parser.parse_args(argv)
    # The broker starts in its own directory: a relative PYTHONPATH would not reach it.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(args.src.resolve()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    )
    if args.from_source:
        for cache in args.src.resolve().rglob("__pycache__"):
            shutil.rmtree(cache)
    else:
        compileall.compile_dir(str(args.src.resolve()), quiet=1)
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        if args.importtime is not None:
            one_start(Path(scratch), args.importtime)
        for i in range(args.runs):
            run = one_start(Path(scratch), None)
            run["load1"] = round(os.getloadavg()[0], 2)
            print(
                f"run {i + 1}: listening {run['listen_s']:.3f} s "
                f"(CPU {run['listen_cpu_s']:.2f} s), ready {run['ready_s']:.3f} s"
            )
            runs.append(run)
            time.sleep(0.2)
    summary: dict[str, Any] = {
        "listen_s": _stats([r["listen_s"] for r in runs]),
        "listen_cpu_s": _stats([r["listen_cpu_s"] for r in runs]),
        "ready_s": _stats([r["ready_s"] for r in runs]),
        "target_listen_s": TARGET_LISTEN_S,
        "bytecode": "from source" if args.from_source else "compiled",
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(summary, indent=2))
    write_result(args, summary, runs)


if __name__ == "__main__":
    main()
