"""``keyshared perf produce``."""

from __future__ import annotations

import argparse
import random
import threading
import time
from typing import Any

from keyshared.perf.client import (
    Deadline,
    make_client,
    make_key_chooser,
    make_payloads,
    send_interval,
    topic_names,
)
from keyshared.perf.report import Recorder, Reporter, make_summary


def run_produce(pulsar: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Publish as asked; the summary."""
    client = make_client(pulsar, args)
    topics = topic_names(args)
    batching = not args.disable_batching and args.batch_time_window > 0
    compression = {
        "NONE": pulsar.CompressionType.NONE,
        "LZ4": pulsar.CompressionType.LZ4,
        "ZLIB": pulsar.CompressionType.ZLib,
        "ZSTD": pulsar.CompressionType.ZSTD,
        "SNAPPY": pulsar.CompressionType.SNAPPY,
    }[args.compression]
    producers = [
        client.create_producer(
            t,
            producer_name=args.producer_name,
            batching_enabled=batching,
            batching_max_messages=args.batch_max_messages,
            batching_max_allowed_size_in_bytes=args.batch_max_bytes,
            batching_max_publish_delay_ms=max(1, round(args.batch_time_window)),
            compression_type=compression,
            # Our own semaphore bounds what is in flight; the client's queue never fills.
            max_pending_messages=args.max_outstanding + 1,
            block_if_queue_full=False,
            send_timeout_millis=args.send_timeout,
        )
        for t in topics
        for _ in range(args.num_producers)
    ]
    payloads = make_payloads(args)
    key_of = make_key_chooser(args)
    recorder = Recorder()
    window = threading.BoundedSemaphore(args.max_outstanding)
    stop = Deadline(args)
    sent = 0
    reporter = Reporter(
        "produce",
        recorder,
        send_interval(args),
        pending=lambda: max(sent - recorder.messages - recorder.failed, 0),
    )
    ok = pulsar.Result.Ok
    deliver_after = None
    if args.delay > 0:
        import datetime

        deliver_after = datetime.timedelta(seconds=args.delay)

    def done(result: Any, started: int, size: int) -> None:
        if result == ok:
            recorder.ok((time.perf_counter_ns() - started) // 1000, size)
        else:
            recorder.fail()
            if args.exit_on_failure:
                stop.stopped.set()
        window.release()

    def room() -> bool:
        """Wait for a free slot of --max-outstanding (False when told to stop)."""
        while not window.acquire(timeout=0.2):
            if stop.stopped.is_set():
                return False
        return True

    n_producers, n_payloads = len(producers), len(payloads)
    rate = args.rate
    reporter.start()
    start = time.perf_counter()
    stop.install(start)
    try:
        while not stop.done(sent):
            if rate > 0:
                due = int((time.perf_counter() - start) * rate) + 1 - sent
                if due <= 0:
                    # Sleep until the next message is due (the clock, not a fixed tick).
                    time.sleep(max(0.0, start + sent / rate - time.perf_counter()))
                    continue
            else:
                due = 64
            for _ in range(due):
                if not room():
                    break
                payload = payloads[0] if n_payloads == 1 else random.choice(payloads)
                size = len(payload)
                started = time.perf_counter_ns()
                producers[sent % n_producers].send_async(
                    payload,
                    lambda r, _m, s=started, z=size: done(r, s, z),
                    partition_key=key_of(sent),
                    deliver_after=deliver_after,
                )
                sent += 1
                if stop.done(sent):
                    break
        # Let what is in flight be confirmed (or fail) before the summary: take every slot back.
        drain_until = time.perf_counter() + 30
        for _ in range(args.max_outstanding):
            if not window.acquire(timeout=max(drain_until - time.perf_counter(), 0.001)):
                break
    finally:
        elapsed = time.perf_counter() - start
        stop.restore()
        reporter.stop()
        for p in producers:
            p.close()
        client.close()
    return make_summary(
        "produce",
        args,
        topics,
        reporter,
        recorder,
        elapsed,
        {
            "rate": args.rate,
            "size": args.size,
            "numProducers": args.num_producers,
            "maxOutstanding": args.max_outstanding,
            "batching": {
                "enabled": batching,
                "timeWindowMs": args.batch_time_window,
                "maxMessages": args.batch_max_messages,
                "maxBytes": args.batch_max_bytes,
            },
            "compression": args.compression,
            "keyMode": args.message_key_generation_mode,
            "numKeys": args.num_keys,
        },
        extra={"sent": sent},
    )
