"""``keyshared perf produce | consume``: a load generator shaped like ``pulsar-perf``.

Same options as pulsar-perf where they exist (``-r`` rate, ``-s`` size, ``-m`` messages,
``-time`` duration, ``-n`` producers or consumers, ``-st`` subscription type, ``-b``/``-bm``/``-bb``
batching, ``-z`` compression, ``-mk`` key mode, ``--auth-plugin``/``--auth-params``), through the
official ``pulsar-client``, so it measures what an application sees and runs as well against
Apache Pulsar. While it runs, a live line shows the last interval's rate and latency percentiles
(publish latency: send to broker receipt; consume latency: publish time to receipt, end to end);
at the end a summary, and with ``--json-out FILE`` the same as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from keyshared.perf.args import build_parser
from keyshared.perf.consume import run_consume
from keyshared.perf.histogram import LatencyHistogram
from keyshared.perf.produce import run_produce
from keyshared.perf.report import print_summary

__all__ = ["LatencyHistogram", "build_parser", "main", "run_consume", "run_produce"]


def main(argv: Sequence[str]) -> int:
    """Run ``keyshared perf ARGS``; 0 when every message went through, 1 when some failed."""
    args = build_parser().parse_args(list(argv))
    try:
        import pulsar
    except ImportError:
        print(
            "keyshared perf needs the official client: pip install pulsar-client",
            file=sys.stderr,
        )
        return 2
    if args.command == "produce" and args.size <= 0 and not args.payload_file:
        print("keyshared perf: --size must be positive", file=sys.stderr)
        return 2
    try:
        if args.command == "produce":
            summary = run_produce(pulsar, args)
        else:
            summary = run_consume(pulsar, args)
    except pulsar.PulsarException as exc:
        print(f"keyshared perf: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print_summary(summary)
    if args.json_out == "-":
        print(json.dumps(summary, indent=2))
    elif args.json_out:
        tmp = f"{args.json_out}.tmp"
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
        os.replace(tmp, args.json_out)
    return 1 if summary["failed"] else 0
