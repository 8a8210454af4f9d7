"""Key_Shared dispatch cost per entry as consumers and distinct keys grow (issue 3, point 8).

Drives the real Subscription, KeySharedDispatcher (and SharedDispatcher for comparison) and
ManagedCursor over an in-memory ledger, in process, with no network: what is measured is the
broker's own decision and bookkeeping cost per entry (read, route, pending acks, send, ack).

    .venv/bin/python bench/bench_dispatch.py [--quick] [--out bench/results/dispatch.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from keyshared.broker.consumer import Consumer, KeySharedMeta, OutboundMessage, SubType  # noqa: E402
from keyshared.broker.dispatch.base import LoopScheduler  # noqa: E402
from keyshared.broker.entry_meta import parse_entry_meta  # noqa: E402
from keyshared.broker.subscription import AckItem, Subscription  # noqa: E402
from keyshared.config import BrokerConfig  # noqa: E402
from keyshared.storage.cursor import ManagedCursor  # noqa: E402
from keyshared.storage.memory import InMemoryLedger  # noqa: E402
from keyshared.storage.position import EARLIEST  # noqa: E402
from tests.sim.world import SimTopic, SimTransport, payload  # noqa: E402


class Run:
    """One subscription with ``consumers`` consumers over ``entries`` entries of ``keys`` keys."""

    def __init__(self, sub_type: SubType, consumers: int, keys: int, entries: int) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        config = BrokerConfig()
        config.dispatcherMaxReadBatchSize = 100
        config.keySharedLookAheadMsgInReplayThresholdPerSubscription = 0
        config.keySharedLookAheadMsgInReplayThresholdPerConsumer = 0
        self.topic = SimTopic(config)
        self.ledger = InMemoryLedger()
        for i in range(entries):
            data = payload(f"key-{i % keys}", 1, False)
            pos = self.ledger.add_entry(data)
            # The broker parses metadata once, on publish; do that outside the timing too.
            self.topic.meta_cache.put(pos, parse_entry_meta(data))
        cursor = ManagedCursor("b", self.ledger, None, durable=True, initial_position=EARLIEST)
        self.sub = Subscription(
            self.topic,  # type: ignore[arg-type]
            "b",
            cursor,
            durable=True,
            config=config,
            scheduler=LoopScheduler(self.loop),
        )
        self.sub_type = sub_type
        self.delivered = 0
        self.target = entries
        self.auto_ack = True
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.consumers: list[Consumer] = []
        self._to_ack: list[tuple[Consumer, list[OutboundMessage]]] = []
        for i in range(consumers):
            transport = SimTransport(self._on_messages, lambda c: None)
            c = Consumer(
                consumer_id=i,
                consumer_name=f"c{i}",
                subscription=self.sub,
                sub_type=sub_type,
                transport=transport,
                key_shared_meta=KeySharedMeta() if sub_type is SubType.Key_Shared else None,
                track_pending_acks=True,
            )
            self.sub.add_consumer(c)
            self.consumers.append(c)

    def _on_messages(self, consumer: Consumer, messages: Any) -> None:
        self.delivered += len(messages)
        if self.auto_ack:
            # As a client would: the ack arrives on a later turn of the loop.
            ids = [AckItem(m.entry.position) for m in messages]
            self.loop.call_soon(self.sub.acknowledge, consumer, False, ids)
        else:
            self._to_ack.append((consumer, list(messages)))
        if self.delivered >= self.target and not self.done.done():
            self.done.set_result(None)

    def run(self, entries: int) -> float:
        """Seconds to dispatch and ack everything."""
        disp = self.sub.dispatcher
        assert disp is not None
        t0 = time.perf_counter()
        for c in self.consumers:
            c.add_permits(1_000_000)
            disp.consumer_flow(c, 1_000_000)
        self.target = entries
        self.loop.run_until_complete(self.done)
        return time.perf_counter() - t0

    def close(self) -> None:
        disp = self.sub.dispatcher
        if disp is not None:
            disp.close()
        self.sub.cursor.close()
        for _ in range(5):
            self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


def cost_per_entry(sub_type: SubType, consumers: int, keys: int, entries: int) -> float:
    run = Run(sub_type, consumers, keys, entries)
    gc.collect()
    seconds = run.run(entries)
    run.close()
    return seconds / entries * 1e6


def draining_cost(hashes: int, entries: int) -> dict[str, float]:
    """Dispatch while ``hashes`` hashes drain: c1 holds one entry of each key, c2 joins."""
    run = Run(SubType.Key_Shared, 1, hashes, hashes)
    run.auto_ack = False
    disp = run.sub.dispatcher
    assert disp is not None
    c1 = run.consumers[0]
    c1.add_permits(hashes)
    disp.consumer_flow(c1, hashes)
    run.loop.run_until_complete(run.done)
    run._to_ack.clear()  # c1 holds everything unacked
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    transport = SimTransport(run._on_messages, lambda c: None)
    c2 = Consumer(
        consumer_id=99,
        consumer_name="joiner",
        subscription=run.sub,
        sub_type=SubType.Key_Shared,
        transport=transport,
        key_shared_meta=KeySharedMeta(),
        track_pending_acks=True,
    )
    t0 = time.perf_counter()
    run.sub.add_consumer(c2)
    join_s = time.perf_counter() - t0
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    draining = disp.draining  # type: ignore[attr-defined]
    n_draining = len(draining) if draining is not None else 0
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    # Now dispatch more entries of the same keys: half are blocked behind draining hashes.
    for i in range(entries):
        data = payload(f"key-{i % hashes}", 1, False)
        run.topic.meta_cache.put(run.ledger.add_entry(data), parse_entry_meta(data))
    c2.add_permits(1_000_000)
    disp.consumer_flow(c2, 1_000_000)
    t0 = time.perf_counter()
    for _ in range(200):
        run.loop.run_until_complete(asyncio.sleep(0))
    spin_s = time.perf_counter() - t0
    run.close()
    return {
        "draining_hashes": n_draining,
        "join_ms": join_s * 1000,
        "bytes_per_draining_hash": grown / n_draining if n_draining else 0.0,
        "loop_time_ms_with_blocked_entries": spin_s * 1000,
    }


def pending_ack_bytes(n: int) -> float:
    """Memory per pending ack on a consumer (Consumer.pending_acks entries)."""
    run = Run(SubType.Key_Shared, 1, n, n)
    run.auto_ack = False
    disp = run.sub.dispatcher
    assert disp is not None
    c = run.consumers[0]
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    c.add_permits(n)
    disp.consumer_flow(c, n)
    run.loop.run_until_complete(run.done)
    run._to_ack.clear()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    # Only what the consumer's pending-ack map holds, not the entries or the cursor.
    pending = c.pending_acks or {}
    size = sys.getsizeof(pending) + sum(sys.getsizeof(v) for v in pending.values())
    del after, before
    run.close()
    return size / max(len(pending), 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--out", default=str(ROOT / "bench/results/dispatch.json"))
    args = parser.parse_args()
    entries = 5_000 if args.quick else 30_000
    consumers_axis = [1, 10, 100] if args.quick else [1, 10, 100, 1000]
    keys_axis = [10, 10_000] if args.quick else [10, 10_000, 1_000_000]
    results: dict[str, Any] = {
        "command": "python bench/bench_dispatch.py" + (" --quick" if args.quick else ""),
        "machine": f"{os.cpu_count()} CPUs, {platform.platform()}, Python {platform.python_version()}",
        "load_average": os.getloadavg(),
        "entries_per_run": entries,
        "cost_us_per_entry": [],
    }
    print(f"{'type':10} {'consumers':>9} {'keys':>9} {'us/entry':>9}")
    for consumers in consumers_axis:
        for keys in keys_axis:
            n = max(entries, keys) if keys <= 10_000 else entries
            for st in (SubType.Shared, SubType.Key_Shared):
                us = cost_per_entry(st, consumers, keys, n)
                results["cost_us_per_entry"].append(
                    {"type": st.name, "consumers": consumers, "keys": keys, "us": round(us, 2)}
                )
                print(f"{st.name:10} {consumers:>9} {keys:>9} {us:>9.1f}", flush=True)
    hashes = 1_000 if args.quick else 10_000
    results["draining"] = draining_cost(hashes, entries)
    print("draining:", json.dumps(results["draining"]))
    results["pending_ack_bytes"] = round(pending_ack_bytes(10_000 if args.quick else 100_000), 1)
    print("bytes per pending ack:", results["pending_ack_bytes"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
