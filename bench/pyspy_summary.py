"""Summarise py-spy raw (collapsed) profiles: top functions by own and cumulative share.

    .venv/bin/python bench/pyspy_summary.py PROFILE.raw [...] [--top 25]

Stacks of the broker's start and stop (imports, the web stack, shutdown) are left out, so the
shares are of the time spent serving. A function's cumulative share counts each sample once
however often the function recurs in its stack.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

STARTUP = ("Standalone.start", "_import_web_stack", "WebServer.start", "_find_and_load")
SHUTDOWN = ("Standalone.stop",)
# Frames every sample of a thread passes through: left out of the cumulative table.
ROOTS = ("<module>", "main (", "_standalone (", "run_standalone (", "run (uvloop", "Runner.run")
ROOTS_THREAD = ("Thread._bootstrap", "Thread.run (")
FRAME = re.compile(r"(.*) \((.*?)(?::\d+)?\)$")


def _name(frame: str) -> str:
    match = FRAME.match(frame)
    if match is None:
        return frame
    function, path = match.groups()
    path = re.sub(r".*/(site-packages|src)/", "", path)
    path = re.sub(r".*/lib/python3\.\d+/", "", path)
    return f"{function} ({path})"


def summarise(paths: list[str]) -> tuple[int, Counter[str], Counter[str]]:
    """Samples kept, and samples per function: own (leaf) and cumulative."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    total = 0
    for path in paths:
        with open(path) as lines:
            for line in lines:
                stack, _, count = line.rstrip().rpartition(" ")
                if not stack or any(mark in stack for mark in STARTUP + SHUTDOWN):
                    continue
                n = int(count)
                names = [_name(frame) for frame in stack.split(";")]
                total += n
                own[names[-1]] += n
                for name in set(names):
                    cumulative[name] += n
    return total, own, cumulative


def main() -> int:
    """Print the two Markdown tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="+")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    total, own, cumulative = summarise(args.profiles)
    print(f"{total} samples\n\n| own % | function |\n|---:|---|")
    for name, n in own.most_common(args.top):
        print(f"| {100 * n / total:.1f} | `{name}` |")
    print("\n| cumulative % | function |\n|---:|---|")
    shown = [
        (name, n)
        for name, n in cumulative.most_common()
        if not any(name.startswith(root) for root in ROOTS + ROOTS_THREAD)
    ]
    for name, n in shown[: args.top]:
        print(f"| {100 * n / total:.1f} | `{name}` |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
