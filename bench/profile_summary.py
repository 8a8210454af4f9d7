"""Summarise a py-spy ``--format raw`` profile (collapsed stacks) as Markdown tables.

    .venv/bin/python bench/profile_summary.py PROFILE.raw [--top 25]

Prints the functions with the largest own share (samples whose innermost frame is the
function) and cumulative share (samples with the function anywhere on the stack), and the
stack families: samples grouped by the first frame the event loop (or a thread's bootstrap)
called, i.e. by the callback or thread that did the work. Shares are of all samples taken.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

# "func (path/file.py:123)" -> "func (path/file.py)": lines split one function into many rows.
_LINE = re.compile(r":\d+\)$")
# Frames that only carry the loop or a thread to the work done in it.
_ROOTS = (
    "<module> ",
    "main (keyshared/cli.py",
    "_standalone (keyshared/cli.py",
    "run_standalone (keyshared/standalone.py",
    "run (uvloop/",
    "Runner.run (asyncio/runners.py",
    "BaseEventLoop.run_until_complete",
    "BaseEventLoop.run_forever",
    "BaseEventLoop._run_once",
    "Handle._run (asyncio/events.py",
    "_bootstrap (threading.py",
    "_bootstrap_inner (threading.py",
    "Thread.run (threading.py",
    "Thread._bootstrap",
)


def _strip(frame: str) -> str:
    return _LINE.sub(")", frame.strip())


def load(path: Path) -> list[tuple[list[str], int]]:
    """The stacks of a raw profile, outermost frame first, with their sample counts."""
    stacks = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        stack, _, count = line.rpartition(" ")
        stacks.append(([_strip(f) for f in stack.split(";")], int(count)))
    return stacks


def family(stack: list[str]) -> str:
    """The first frame below the loop's or a thread's own frames."""
    for frame in stack:
        if not frame.startswith(_ROOTS):
            return frame
    return stack[-1]


def summarise(stacks: list[tuple[list[str], int]], top: int) -> str:
    """The Markdown tables."""
    total = sum(n for _, n in stacks)
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    families: Counter[str] = Counter()
    for stack, n in stacks:
        own[stack[-1]] += n
        for frame in set(stack):
            cumulative[frame] += n
        families[family(stack)] += n

    def table(title: str, counter: Counter[str], skip_roots: bool = False) -> list[str]:
        rows = [f"### {title}", "", "| share | samples | function |", "|---:|---:|---|"]
        shown = 0
        for name, n in counter.most_common():
            if skip_roots and name.startswith(_ROOTS):
                continue
            rows.append(f"| {100 * n / total:.1f} % | {n} | `{name}` |")
            shown += 1
            if shown == top:
                break
        return [*rows, ""]

    lines = [f"{total} samples.", ""]
    lines += table("Own time (innermost frame)", own)
    lines += table("Cumulative (anywhere on the stack)", cumulative, skip_roots=True)
    lines += table("Stack families (what the loop or thread ran)", families)
    return "\n".join(lines)


def main() -> None:
    """Print the summary of the profile named on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--loop-only",
        action="store_true",
        help="leave out other threads' stacks (the journal thread's sampled fdatasync waits)",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        help="leave out stacks with a frame containing this text (repeatable), e.g. set-up",
    )
    args = parser.parse_args()
    stacks = load(args.profile)
    if args.exclude:
        stacks = [(st, n) for st, n in stacks if not any(x in f for f in st for x in args.exclude)]
    if args.loop_only:
        stacks = [(st, n) for st, n in stacks if not any("threading.py" in f for f in st)]
    print(summarise(stacks, args.top))


if __name__ == "__main__":
    main()
