"""Instructions per unbatched publish, counted by valgrind: a figure the machine's load leaves alone.

CPU time on this project's shared 2-core machines moves by a third from run to run with the
other work on it; an instruction count does not. This runs ``bench_publish_inproc.py`` (the
publish path in one process: SEND frames into a real ``ServerConnection`` over real storage,
every append synced) under ``valgrind --tool=callgrind`` for ``--small`` and ``--large``
messages, subtracts the instructions of building the frames (``send_frames``, counted the same
way), and divides the difference by the extra messages: what the broker executes per send,
both threads, start-up and shutdown cancelled out. Each ``--src`` tree is measured in turn:

    .venv/bin/python bench/bench_publish_instructions.py --src /tmp/base/src --src src

Instructions are not time (a cache miss costs no instruction, a ``fdatasync`` wait none
either), so this is for comparing Python-level changes to the same path, next to
``bench_publish_cpu.py``'s CPU figures, not instead of them. About a minute per tree per
thousand messages of ``--large``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.e2e.report import write_result  # noqa: E402

_COLLECTED = re.compile(rb"Collected : (\d+)")

# Builds the frames as bench_publish_inproc.py does, and nothing else.
_SETUP_ONLY = (
    "import sys; sys.path.insert(0, {bench!r}); import bench_publish_inproc as b; "
    "b.send_frames({count}, {size}, 0)"
)


def instructions(argv: list[str], src: Path) -> int:
    """Instructions valgrind counts for running ``argv`` with ``src`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(src.resolve()))
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=True,
    )
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output: {done.stderr[-500:]!r}")
    return int(found.group(1))


def measure(src: Path, small: int, large: int, size: int) -> dict[str, Any]:
    """Instructions per unbatched send of the tree ``src``, set-up excluded."""
    inproc = str(ROOT / "bench" / "bench_publish_inproc.py")
    total = {}
    setup = {}
    for count in (small, large):
        total[count] = instructions(
            [sys.executable, inproc, "--batch", "0", "--messages", str(count), "--size", str(size)],
            src,
        )
        code = _SETUP_ONLY.format(bench=str(ROOT / "bench"), count=count, size=size)
        setup[count] = instructions([sys.executable, "-c", code], src)
    extra = large - small
    per_send = (total[large] - total[small]) / extra
    setup_per_send = (setup[large] - setup[small]) / extra
    return {
        "src": str(src),
        "instructions": total,
        "setup_instructions": setup,
        "instructions_per_send": round(per_send - setup_per_send),
        "setup_instructions_per_send": round(setup_per_send),
    }


def main(argv: list[str] | None = None) -> None:
    """Parse options, measure each tree, print and write the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--src", type=Path, action="append", help="source tree (repeatable; default: src)"
    )
    parser.add_argument("--small", type=int, default=1000, help="messages of the shorter run")
    parser.add_argument("--large", type=int, default=6000, help="messages of the longer run")
    parser.add_argument("--size", type=int, default=100, help="payload bytes")
    parser.add_argument("--label", default="", help="free text stored with the figures")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "bench/results/publish-instructions.json"
    )
    args = parser.parse_args(argv)
    trees: list[Path] = args.src or [ROOT / "src"]
    runs = []
    for src in trees:
        run = measure(src, args.small, args.large, args.size)
        print(f"{src}: {run['instructions_per_send']} instructions per send", flush=True)
        runs.append(run)
    write_result(args, {str(r["src"]): r["instructions_per_send"] for r in runs}, runs)


if __name__ == "__main__":
    main()
