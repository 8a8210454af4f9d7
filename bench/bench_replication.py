"""Geo-replication throughput and lag between two broker processes (clusters ``ca``, ``cb``).

Two standalone brokers on loopback replicate namespace ``geo/bench`` to each other
(deduplication on, as Pulsar's geo-replication guide sets it up). A producer process publishes
100 B keyed messages on ``ca`` with batching (1000 messages or 5 ms; ``--batching default``
mixes keys in a batch, ``keybased`` keeps one key a batch, as Key_Shared consumers need;
``none`` sends every message as its own entry); one consumer
process reads them on ``ca`` (the local baseline) and one on ``cb`` (through the replicator).
Every payload starts with its send time (``time.time_ns()``), so each consumer measures the
time from ``send_async`` on ``ca`` to ``receive`` (same machine, same clock).

Two phases, each on a fresh topic:

- **throughput**: ``--messages`` as fast as the producer goes; the replication rate is the
  messages over the time from the first send to the last receive on ``cb``;
- **lag**: ``--rate`` messages/s for ``--seconds``, well under saturation, so the percentiles
  are the replication path's own and not a queue's;
- **catch-up**: ``cb`` stopped, ``--catch-up-messages`` published on ``ca``, ``cb`` started
  again: the rate at which the replicator drains its backlog, from the moment it connected
  (``outboundConnectedSince``) to ``replicationBacklog`` 0 (polled on ``ca`` every 50 ms), the
  replicator's own ceiling with no producer or consumer in the way.

    .venv/bin/python bench/bench_replication.py [--messages 100000] [--rate 1000]
        [--seconds 15] [--keys 100] [--batching default|keybased|none] [--catch-up-messages 300000]
        [--phases throughput,lag,catch-up]
        [--out bench/results/replication.json]
"""

from __future__ import annotations

import argparse
import calendar
import json
import multiprocessing as mp
import os
import statistics
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.broker_process import BrokerProcess  # noqa: E402

RESULTS = ROOT / "bench" / "results"
NS = "geo/bench"
SIZE = 100


def _client(url: str) -> Any:
    import pulsar

    from tests.broker_process import quiet_logger

    return pulsar.Client(url, operation_timeout_seconds=30, logger=quiet_logger())


def produce(
    url: str, topic: str, count: int, rate: float, keys: int, batching: str, out: Any
) -> None:
    """Publish ``count`` keyed 100 B messages (at ``rate``/s, 0: as fast as possible)."""
    import pulsar

    client = _client(url)
    try:
        producer = client.create_producer(
            topic,
            batching_enabled=batching != "none",
            batching_type=(
                pulsar.BatchingType.KeyBased
                if batching == "keybased"
                else pulsar.BatchingType.Default
            ),
            batching_max_messages=1000,
            batching_max_publish_delay_ms=5,
            max_pending_messages=10000,
            block_if_queue_full=True,
        )
        pad = b"x" * (SIZE - 8)
        t0 = time.perf_counter()
        first_ns = time.time_ns()
        for i in range(count):
            if rate:
                wait = t0 + i / rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            producer.send_async(
                struct.pack(">Q", time.time_ns()) + pad, None, partition_key=f"key-{i % keys}"
            )
        producer.flush()
        out.put({"first_send_ns": first_ns, "sent": count})
    finally:
        client.close()


def consume(url: str, topic: str, count: int, ready: Any, out: Any) -> None:
    """Receive ``count`` messages; report each one's lag from its send (ms)."""
    import pulsar

    client = _client(url)
    try:
        consumer = client.subscribe(
            topic, "bench", consumer_type=pulsar.ConsumerType.Exclusive, receiver_queue_size=5000
        )
        ready.put(True)
        lags: list[float] = []
        last_ns = 0
        while len(lags) < count:
            try:
                msg = consumer.receive(timeout_millis=60_000)
            except pulsar.Timeout:
                break
            last_ns = time.time_ns()
            (sent_ns,) = struct.unpack_from(">Q", msg.data())
            lags.append((last_ns - sent_ns) / 1e6)
            consumer.acknowledge_cumulative(msg)
        out.put({"received": len(lags), "last_receive_ns": last_ns, "lags_ms": lags})
    finally:
        client.close()


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def _register(a: BrokerProcess, name: str, b: BrokerProcess) -> None:
    body = {"serviceUrl": b.web_url, "brokerServiceUrl": b.service_url}
    status, answer = a.admin("PUT", f"/admin/v2/clusters/{name}", body)
    assert status == 204, answer


def _setup(a: BrokerProcess, b: BrokerProcess) -> None:
    _register(a, "cb", b)
    _register(b, "ca", a)
    for x in (a, b):
        for method, path, body in (
            ("PUT", "/admin/v2/tenants/geo", {"allowedClusters": ["ca", "cb"]}),
            ("PUT", f"/admin/v2/namespaces/{NS}", {"deduplicationEnabled": True}),
            ("POST", f"/admin/v2/namespaces/{NS}/replication", ["ca", "cb"]),
        ):
            status, answer = x.admin(method, path, body)
            assert status in (200, 204), (path, status, answer)


def phase(
    a: BrokerProcess, b: BrokerProcess, count: int, rate: float, keys: int, batching: str
) -> dict[str, Any]:
    """One run on a fresh topic: consumers on both clusters, a producer on ``ca``."""
    ctx = mp.get_context("spawn")
    topic = f"persistent://{NS}/bench-{uuid.uuid4().hex[:8]}"
    ready, out_local, out_remote, out_prod = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    consumers = [
        ctx.Process(target=consume, args=(a.service_url, topic, count, ready, out_local)),
        ctx.Process(target=consume, args=(b.service_url, topic, count, ready, out_remote)),
    ]
    for p in consumers:
        p.start()
    for _ in consumers:
        ready.get(timeout=60)
    load_before = os.getloadavg()
    producer = ctx.Process(
        target=produce, args=(a.service_url, topic, count, rate, keys, batching, out_prod)
    )
    producer.start()
    sent = out_prod.get(timeout=600)
    local = out_local.get(timeout=600)
    remote = out_remote.get(timeout=600)
    for p in [producer, *consumers]:
        p.join(60)
    stats = a.admin("GET", "/admin/v2/persistent/" + topic[len("persistent://") :] + "/stats")[1]
    rep = stats["replication"]["cb"]
    result: dict[str, Any] = {
        "messages": count,
        "rate_target": rate or None,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "replicator_msg_out": rep["msgOutCount"],
        "replication_backlog_after": rep["replicationBacklog"],
    }
    for name, got in (("local", local), ("remote", remote)):
        lags = got["lags_ms"]
        seconds = (got["last_receive_ns"] - sent["first_send_ns"]) / 1e9
        result[name] = {
            "received": got["received"],
            "msg_per_s": round(got["received"] / seconds) if seconds > 0 else None,
            "lag_ms_p50": round(_pct(lags, 50), 2),
            "lag_ms_p99": round(_pct(lags, 99), 2),
            "lag_ms_max": round(max(lags, default=float("nan")), 2),
            "lag_ms_mean": round(statistics.fmean(lags), 2) if lags else None,
        }
    return result


def catch_up(
    a: BrokerProcess, b: BrokerProcess, count: int, keys: int, batching: str
) -> dict[str, Any]:
    """The replicator's drain rate over a backlog of ``count`` messages (see the docstring)."""
    ctx = mp.get_context("spawn")
    topic = f"persistent://{NS}/catchup-{uuid.uuid4().hex[:8]}"
    ready, out_remote, out_prod = ctx.Queue(), ctx.Queue(), ctx.Queue()
    # The durable subscription on cb holds what arrives (the consumer leaves at once).
    c = ctx.Process(target=consume, args=(b.service_url, topic, 0, ready, out_remote))
    c.start()
    ready.get(timeout=60)
    out_remote.get(timeout=60)
    c.join(60)
    stats_path = "/admin/v2/persistent/" + topic[len("persistent://") :] + "/stats"
    b.stop()
    producer = ctx.Process(
        target=produce, args=(a.service_url, topic, count, 0, keys, batching, out_prod)
    )
    producer.start()
    out_prod.get(timeout=600)
    producer.join(60)
    entries = a.admin("GET", stats_path)[1]["replication"]["cb"]["replicationBacklog"]
    load_before = os.getloadavg()
    b.start(same_ports=True)
    while True:
        rep = a.admin("GET", stats_path)[1]["replication"]["cb"]
        if rep["replicationBacklog"] == 0:
            end = time.time()
            break
        time.sleep(0.05)  # each poll costs ca's loop a few ms: not faster
    since = rep["outboundConnectedSince"]
    start = (
        calendar.timegm(time.strptime(since[:19], "%Y-%m-%dT%H:%M:%S")) + int(since[20:23]) / 1e3
    )
    seconds = end - start
    return {
        "messages": count,
        "entries": entries,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "drain_seconds": round(seconds, 3),
        "entries_per_s": round(entries / seconds),
        "msg_per_s": round(count / seconds),
    }


def _show(label: str, r: dict[str, Any]) -> None:
    print(f"{label}: {r['messages']} messages, load {r['load_before'][0]:.2f}")
    for name in ("local", "remote"):
        x = r[name]
        print(
            f"  {name:<6} {x['received']:>7} received  {x['msg_per_s'] or 0:>7} msg/s  "
            f"lag p50 {x['lag_ms_p50']:>8.1f} ms  p99 {x['lag_ms_p99']:>8.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--catch-up-messages", type=int, default=300_000)
    parser.add_argument("--batching", choices=("default", "keybased", "none"), default="default")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--phases", default="throughput,lag,catch-up")
    parser.add_argument("--out", type=Path, default=RESULTS / "replication.json")
    args = parser.parse_args()
    result: dict[str, Any] = {
        "bench": "replication",
        "payload_bytes": SIZE,
        "keys": args.keys,
        "batching": args.batching
        if args.batching == "none"
        else f"{args.batching}, 1000 messages or 5 ms",
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    a = BrokerProcess(conf={"clusterName": "ca"})
    b = BrokerProcess(conf={"clusterName": "cb"})
    try:
        a.start()
        b.start()
        _setup(a, b)
        phases = set(args.phases.split(","))
        if "throughput" in phases:
            result["throughput"] = phase(a, b, args.messages, 0, args.keys, args.batching)
            _show("throughput", result["throughput"])
        if "lag" in phases:
            count = int(args.rate * args.seconds)
            result["lag"] = phase(a, b, count, args.rate, args.keys, args.batching)
            _show(f"lag at {args.rate:.0f} msg/s", result["lag"])
        if "catch-up" in phases:
            drain = catch_up(a, b, args.catch_up_messages, args.keys, args.batching)
            result["catch_up"] = drain
            print(
                f"catch-up: {drain['entries']} entries ({args.catch_up_messages} messages) in "
                f"{drain['drain_seconds']} s: "
                f"{drain['entries_per_s']} entries/s, {drain['msg_per_s']} msg/s, "
                f"load {drain['load_before'][0]:.2f}"
            )
    finally:
        a.close()
        b.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
