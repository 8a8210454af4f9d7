"""Broker memory per stored message: does RSS stay bounded while a backlog grows?

A fresh broker (``--src`` chooses the source tree it runs from, so that two trees can be
compared with one command), ``--topics`` topics each with a subscription that never consumes,
and ``--messages`` unbatched messages of ``--size`` bytes published round-robin over them with
the official client. The broker's RSS is read from /proc after every ``--step`` messages; the
figure that matters is the slope once the caches are full (the second half of the run), in
bytes of RSS per stored message.

Also, in this process, what the entry cache really costs per entry (tracemalloc) against what it
accounts (``len(data) + ENTRY_OVERHEAD``), and the same for the parsed-metadata cache.

    .venv/bin/python bench/bench_memory.py --src src --out bench/results/memory-after.json
    .venv/bin/python bench/bench_memory.py --src /work/main/src --out .../memory-before.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from tests.broker_process import BrokerProcess, quiet_logger  # noqa: E402

NS = "persistent://public/default"


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` from /proc."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def entry_cache_cost(n: int, size: int) -> dict[str, float]:
    """Bytes per entry the entry cache really takes (beyond the payload) and what it accounts."""
    from keyshared.storage.cache import ENTRY_OVERHEAD, EntryCache

    datas = [os.urandom(size) for _ in range(n)]
    payload = sum(sys.getsizeof(d) for d in datas)
    gc.collect()
    tracemalloc.start()
    cache = EntryCache(1 << 40)
    buckets: list[dict[int, tuple[bytes, int]]] = [{} for _ in range(n // 50_000 + 1)]
    for i in range(n):
        cache.insert(buckets[i // 50_000], 1000 + i // 50_000, i % 50_000, datas[i], 0x12345678 + i)
    gc.collect()
    bookkeeping, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    real = bookkeeping / n + payload / n
    accounted = size + ENTRY_OVERHEAD
    return {
        "payload_bytes": size,
        "bookkeeping_per_entry": round(bookkeeping / n, 1),
        "real_per_entry": round(real, 1),
        "accounted_per_entry": accounted,
        "real_over_accounted": round(real / accounted, 3),
    }


def meta_cache_cost(n: int) -> dict[str, float]:
    """Bytes per entry of the parsed-metadata cache, and its limit."""
    from keyshared.broker import entry_meta
    from keyshared.broker.entry_meta import EntryMeta, EntryMetaCache
    from keyshared.storage.position import Position

    gc.collect()
    tracemalloc.start()
    cache = EntryMetaCache()
    ledger_id = 123456
    now = int(time.time() * 1000)
    for i in range(n):
        cache.put(
            Position(ledger_id, i), EntryMeta(1, (i * 2654435761) & 0x7FFFFFFF, now + i, 0, 0)
        )
    gc.collect()
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    kept = len(cache._cache)
    limit = getattr(entry_meta, "CACHE_LIMIT", getattr(entry_meta, "_CACHE_LIMIT", 0))
    return {"per_entry": round(used / kept, 1), "limit_entries": limit}


def run_broker(args: argparse.Namespace) -> dict[str, Any]:
    """Publish into backlogs on a fresh broker, sampling its RSS."""
    import pulsar

    src = str(Path(args.src).resolve())
    conf: dict[str, object] = {"managedLedgerCacheSizeMB": args.cache_mb}
    broker = BrokerProcess(conf=conf, env={"PYTHONPATH": src}).start(60)
    samples: list[dict[str, float]] = []
    try:
        assert broker.proc is not None
        pid = broker.proc.pid
        client = pulsar.Client(broker.service_url, logger=quiet_logger())
        topics = [f"{NS}/mem-{i}" for i in range(args.topics)]
        for t in topics:
            client.subscribe(t, "backlog").close()
        producers = [
            client.create_producer(
                t,
                batching_enabled=False,
                max_pending_messages=2000,
                block_if_queue_full=True,
                send_timeout_millis=0,
            )
            for t in topics
        ]
        body = b"m" * args.size
        time.sleep(1.0)
        samples.append({"messages": 0, "rss_mb": rss_bytes(pid) / 2**20, "t": 0.0})
        start = time.monotonic()
        sent = 0
        while sent < args.messages:
            for i in range(args.step):
                producers[(sent + i) % len(producers)].send_async(body, None)
            for p in producers:
                p.flush()
            sent += args.step
            samples.append(
                {
                    "messages": sent,
                    "rss_mb": round(rss_bytes(pid) / 2**20, 1),
                    "t": round(time.monotonic() - start, 1),
                }
            )
            print(f"  {sent:>9,} messages  RSS {samples[-1]['rss_mb']:7.1f} MB", flush=True)
        seconds = time.monotonic() - start
        for p in producers:
            p.close()
        client.close()
    finally:
        broker.stop()
        broker.close()
    half = [s for s in samples if s["messages"] >= args.messages / 2]
    first, last = half[0], samples[-1]
    slope = (
        (last["rss_mb"] - first["rss_mb"]) * 2**20 / max(1, last["messages"] - first["messages"])
    )
    whole = (last["rss_mb"] - samples[0]["rss_mb"]) * 2**20 / max(1, last["messages"])
    return {
        "rate_msg_s": round(args.messages / seconds, 1),
        "rss_start_mb": round(samples[0]["rss_mb"], 1),
        "rss_end_mb": last["rss_mb"],
        "rss_peak_mb": max(s["rss_mb"] for s in samples),
        "bytes_per_message_second_half": round(slope, 1),
        "bytes_per_message_whole_run": round(whole, 1),
        "samples": samples,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=str(ROOT / "src"), help="source tree the broker runs from")
    ap.add_argument("--topics", type=int, default=5)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--step", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--cache-mb", type=int, default=32, help="managedLedgerCacheSizeMB")
    ap.add_argument("--out", default=str(ROOT / "bench/results/memory.json"))
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.src).resolve()))
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "src": args.src,
        "loadavg_before": os.getloadavg(),
        "topics": args.topics,
        "messages": args.messages,
        "size": args.size,
        "cache_mb": args.cache_mb,
        "entry_cache_in_process": entry_cache_cost(200_000, args.size + 30),
        "meta_cache_in_process": meta_cache_cost(100_000),
    }
    print(json.dumps({k: v for k, v in result.items()}, indent=1), flush=True)
    result["broker"] = run_broker(args)
    result["loadavg_after"] = os.getloadavg()
    b = result["broker"]
    print(
        f"RSS {b['rss_start_mb']} -> {b['rss_end_mb']} MB (peak {b['rss_peak_mb']}) after "
        f"{args.messages:,} messages; {b['bytes_per_message_second_half']} B per message in the "
        f"second half, {b['bytes_per_message_whole_run']} over the run; {b['rate_msg_s']} msg/s"
    )
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
