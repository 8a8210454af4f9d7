"""What the power-loss test layer (tests/fault/lazyfs.py) costs: publish throughput of one broker
with its data directory on lazyfs against a plain directory, same client code, interleaved.

lazyfs is a test tool, never in the production path; this says how much slower the power-cut
tests run than a broker on a real disk would. Root and Debian's fuse3 are needed to mount.

    .venv/bin/python bench/bench_lazyfs.py [--messages N] [--runs R] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pulsar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.broker_process import BrokerProcess, quiet_logger
from tests.fault import fuse_available, mounted


def publish_rate(data_dir: Path, messages: int, batched: bool) -> float:
    broker = BrokerProcess(data_dir=data_dir)
    try:
        broker.start(timeout=60)
        client = pulsar.Client(broker.service_url, logger=quiet_logger())
        producer = client.create_producer(
            "bench-lazyfs", batching_enabled=batched, block_if_queue_full=True
        )
        payload = os.urandom(100)
        started = time.perf_counter()
        for _ in range(messages):
            producer.send_async(payload, None)
        producer.flush()
        elapsed = time.perf_counter() - started
        client.close()
        return messages / elapsed
    finally:
        broker.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default="bench/results/lazyfs.json")
    args = ap.parse_args()
    why = fuse_available()
    if why:
        print(f"cannot mount lazyfs here: {why}", file=sys.stderr)
        return 2
    results: dict[str, dict[str, list[float]]] = {}
    for batched in (False, True):
        mode = "batched" if batched else "unbatched"
        rates: dict[str, list[float]] = {"plain": [], "lazyfs": []}
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                rates["plain"].append(publish_rate(Path(tmp) / "data", args.messages, batched))
            with (
                tempfile.TemporaryDirectory() as tmp,
                mounted(Path(tmp) / "backing", Path(tmp) / "mnt") as mount,
            ):
                data = mount.mountpoint / "data"
                rates["lazyfs"].append(publish_rate(data, args.messages, batched))
        results[mode] = rates
        plain, lazy = statistics.median(rates["plain"]), statistics.median(rates["lazyfs"])
        print(
            f"{mode:>9} 100 B: plain {plain:,.0f} msg/s, lazyfs {lazy:,.0f} msg/s "
            f"({lazy / plain:.2f}x), medians of {args.runs}"
        )
    load = os.getloadavg()[0]
    Path(args.out).write_text(
        json.dumps({"messages": args.messages, "load": load, "rates": results}, indent=1)
    )
    print(f"load {load:.1f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
