"""Recovery after SIGKILL: a standalone broker holding 1 GB in 1 KB messages is killed -9,
started again, and timed until a consumer is served its first message.

The data is written with the official client through one batching producer (1000 messages or
1 MB a batch, the broker's default durable sync), into a topic with a durable subscription
created first at the earliest position, so all of it is backlog. Each round then:

1. SIGKILLs the broker (no shutdown work: unclosed ledgers, cursors as last persisted);
2. starts it again on the same data directory and ports, and measures
   * ``ready``: process start until it prints where it listens (ledgers are opened lazily),
   * ``first message``: process start until the subscription's consumer has received
     its first message (the topic loaded, its last ledger recovered, the entry read from disk),
   * ``first publish``: then a new producer's first send confirmed.

The data directory lives under /tmp and is deleted afterwards. The OS page cache is left warm
unless ``--drop-caches`` (root only; it empties the whole machine's cache). Target (issue 6):
recovery under 5 s.

    .venv/bin/python bench/bench_recovery.py [--gigabytes 1] [--message-size 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pulsar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.broker_process import BrokerProcess, quiet_logger  # noqa: E402

RESULTS = Path(__file__).parent / "results"
TOPIC = "persistent://public/default/recovery"
SUBSCRIPTION = "bench-sub"
TARGET_S = 5.0


def client_for(broker: BrokerProcess) -> pulsar.Client:
    return pulsar.Client(
        broker.service_url,
        logger=quiet_logger(),
        operation_timeout_seconds=30,
        connection_timeout_ms=10_000,
    )


def fill(broker: BrokerProcess, total_bytes: int, size: int) -> dict[str, Any]:
    """Publish ``total_bytes`` in ``size``-byte messages; returns counts and the rate."""
    client = client_for(broker)
    try:
        client.subscribe(
            TOPIC, SUBSCRIPTION, initial_position=pulsar.InitialPosition.Earliest
        ).close()
        producer = client.create_producer(
            TOPIC,
            batching_enabled=True,
            batching_max_messages=1000,
            batching_max_allowed_size_in_bytes=1 << 20,
            batching_max_publish_delay_ms=5,
            max_pending_messages=50_000,
            block_if_queue_full=True,
        )
        count = total_bytes // size
        payload = os.urandom(size)
        failed = [0]
        done = threading.Semaphore(0)

        def confirmed(res: Any, _: Any) -> None:
            if res != pulsar.Result.Ok:
                failed[0] += 1
            done.release()

        t0 = time.perf_counter()
        for i in range(count):
            producer.send_async(payload, confirmed)
            if i % 200_000 == 0 and i:
                print(f"  {i:>9} sent, {i * size / (time.perf_counter() - t0) / 1e6:.0f} MB/s")
        producer.flush()
        for _ in range(count):
            done.acquire()
        seconds = time.perf_counter() - t0
        producer.close()
    finally:
        client.close()
    if failed[0]:
        raise RuntimeError(f"{failed[0]} sends failed")
    return {
        "messages": count,
        "bytes": count * size,
        "fill_seconds": round(seconds, 2),
        "fill_mb_per_s": round(count * size / seconds / 1e6, 1),
    }


def storage_size(broker: BrokerProcess) -> int:
    path = "/admin/v2/persistent/" + TOPIC.removeprefix("persistent://") + "/stats"
    status, body = broker.admin("GET", path)
    return int(body["storageSize"]) if status == 200 else -1


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def one_round(broker: BrokerProcess, dropped: bool) -> dict[str, Any]:
    broker.kill()
    cold = drop_caches() if dropped else False
    t0 = time.perf_counter()
    broker.start(timeout=120, same_ports=True)
    ready = time.perf_counter() - t0
    client = client_for(broker)
    try:
        consumer = client.subscribe(
            TOPIC, SUBSCRIPTION, initial_position=pulsar.InitialPosition.Earliest
        )
        msg = consumer.receive(60_000)
        first = time.perf_counter() - t0
        first_id = str(msg.message_id())
        producer = client.create_producer(TOPIC, batching_enabled=False)
        producer.send(b"after recovery")
        publish = time.perf_counter() - t0
    finally:
        client.close()
    m = re.findall(r"ready in (\d+) ms", broker.log())
    return {
        "ready_s": round(ready, 3),
        "first_message_s": round(first, 3),
        "first_publish_s": round(publish, 3),
        "broker_reported_ready_ms": int(m[-1]) if m else None,
        "first_message_id": first_id,
        "page_cache_dropped": cold,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--message-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--drop-caches", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "recovery.json")
    args = parser.parse_args()
    total = int(args.gigabytes * (1 << 30))
    broker = BrokerProcess()
    rounds = []
    try:
        broker.start(timeout=60)
        print(f"filling {total / 2**30:.2f} GiB in {args.message_size} B messages ...")
        filled = fill(broker, total, args.message_size)
        filled["storage_size"] = storage_size(broker)
        print(
            f"  {filled['messages']} messages, {filled['storage_size'] / 2**20:.0f} MiB stored, "
            f"{filled['fill_mb_per_s']} MB/s"
        )
        for i in range(args.rounds):
            r = one_round(broker, args.drop_caches)
            rounds.append(r)
            print(
                f"round {i + 1}: SIGKILL -> ready {r['ready_s']:.2f} s, first message "
                f"{r['first_message_s']:.2f} s, first publish {r['first_publish_s']:.2f} s"
            )
        after = storage_size(broker)
    finally:
        broker.close()
    median = statistics.median(r["first_message_s"] for r in rounds)
    verdict = {"first_message_median_s": median, "under_5s": median < TARGET_S}
    print(f"target: {verdict}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "recovery-after-sigkill",
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "python": platform.python_version(),
                "machine": platform.machine(),
                "cpus": os.cpu_count(),
                "message_size": args.message_size,
                "fill": filled,
                "storage_size_after": after,
                "target_s": TARGET_S,
                "verdict": verdict,
                "rounds": rounds,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
